"""``deepconf-high``: online DeepConf keeping the top 90 % (eta = 90); see
:mod:`gambit_search.methods.deepconf`.

    gambit-solve --method deepconf-high --scorer none --n 32 --dataset toy:val:100 --out runs/dch
"""

from gambit_search.methods.deepconf import METHOD_HIGH as METHOD

__all__ = ["METHOD"]
