"""Shared fixtures.

``vllm_engine``: ONE VLLMEngine on the shipped toy policy for the whole test session (vLLM
start-up costs 30-60 s on a 2-core CPU machine, so tests share it). Tests that use it are
marked ``slow``; deselect them with ``-m 'not slow'``. Each test gets the engine idle and
must not rely on traces of other tests. ``toy_hf_model``: the same weights in transformers.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TOY_POLICY = REPO / "checkpoints" / "toy-policy"

# The engine's worker would otherwise pin itself to core 0; on a shared or small CI machine
# whatever else sits on that core then slows vLLM's start-up by minutes.
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")


def _toy_engine_config():
    from gambit_search.vllm_config import VLLMEngineConfig

    return VLLMEngineConfig(
        model=str(TOY_POLICY),
        dtype="float32",
        max_num_seqs=256,
        block_size=32,
        kv_cache_memory_bytes=256 << 20,  # 2048 blocks of 32 tokens: 256 toy traces fit
        seed=0,
        sampled_logprobs=True,  # the harvest's setting: every test runs the log-prob hook
        # gambit-solve's default: the worker scores with the shipped SeqScorer; the states
        # travel too, so the tests that read them (and compare the scores) can
        scorer=str(REPO / "checkpoints" / "toy-scorer-seq" / "ckpt.pt"),
        ship_hidden=True,
    )


@pytest.fixture(scope="session")
def vllm_engine():
    """The session's one real engine (toy policy, fp32, block size 32, capture on, the
    SeqScorer in the worker)."""
    if not TOY_POLICY.is_dir():
        pytest.skip("toy policy checkpoint missing")
    pytest.importorskip("vllm")
    from gambit_search.vllm_engine import VLLMEngine

    eng = VLLMEngine(_toy_engine_config())
    yield eng
    eng.close()


@pytest.fixture
def engine(vllm_engine):
    """``vllm_engine``, idle before and after the test (leftover traces are aborted)."""
    from gambit_search.engine import TraceStatus

    def settle() -> None:
        for tid in vllm_engine.trace_ids():
            if vllm_engine.trace_info(tid).status in (TraceStatus.RUNNING,
                                                      TraceStatus.EVICTED):
                vllm_engine.abort(tid)
        while vllm_engine.has_unfinished():
            vllm_engine.step()
        vllm_engine.step()  # drain late rows

    settle()
    yield vllm_engine
    settle()


@pytest.fixture(scope="session")
def toy_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(TOY_POLICY))


@pytest.fixture(scope="session")
def toy_hf_model():
    """The toy policy in transformers, fp32, eval mode."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(TOY_POLICY), dtype=torch.float32)
    model.eval()
    return model


@pytest.fixture(scope="session")
def fake_scorer(tmp_path_factory) -> str:
    """A random MLP scorer checkpoint for the fake engine's 16-wide states (boundary token 4)."""
    import torch

    from gambit_scorer.checkpoint import save_checkpoint
    from gambit_scorer.models import StepMLP
    from gambit_search.fake_engine import BOUNDARY, FakeEngineConfig

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("scorer") / "ckpt.pt"
    save_checkpoint(path, StepMLP(FakeEngineConfig().hidden_size, [8]), features=["hidden"],
                    hidden_size=FakeEngineConfig().hidden_size, boundary_token_ids=[BOUNDARY])
    return str(path)
