"""``python -m gambit_search.solve``: the gambit-solve console script."""

from gambit_search.solve.cli import main

if __name__ == "__main__":
    main()
