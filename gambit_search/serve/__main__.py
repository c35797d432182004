"""``python -m gambit_search.serve``: the gambit-serve console script."""

from gambit_search.serve.cli import main

if __name__ == "__main__":
    main()
