"""``deepconf-low``: online DeepConf keeping the top 10 % (eta = 10); see
:mod:`gambit_search.methods.deepconf`.

    gambit-solve --method deepconf-low --scorer none --n 32 --dataset toy:val:100 --out runs/dcl
"""

from gambit_search.methods.deepconf import METHOD_LOW as METHOD

__all__ = ["METHOD"]
