"""Harvest throughput vs plain vLLM generation of the same traces, in one run.

Same model, questions, n, sampling and concurrency. Plain: ``vllm.LLM.generate`` with
``SamplingParams(n=...)``. Harvest: ``data_pipelines.harvest`` through the engine adapter
(boundary hidden-state capture, per-token log-probs, grading, parquet writing). Reports
generated tokens/s of each and their ratio (goal >= 0.9): the ratio of the medians and the
median of the per-repetition ratios. Repetitions alternate which runs first (plain, harvest;
then harvest, plain; ...) so drift of a shared machine hits both alike.

    .venv/bin/python benchmarks/harvest_throughput.py --questions 64 --n 16
    python benchmarks/harvest_throughput.py --model /tmp/smol --kv-cache 4   # a real model (GPU)

``--kv-cache`` (GiB) sizes both engines' KV cache alike (1 GiB holds ~46k tokens of SmolLM2-135M in
bf16, vLLM's ``auto`` for it: too few for 256 traces of up to 400 tokens, so it wants more).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None)
    p.add_argument("--questions", type=int, default=64)
    p.add_argument("--n", type=int, default=16)
    p.add_argument("--max-live", type=int, default=256, help="most live traces (vLLM max_num_seqs)")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--kv-cache", type=float, default=1.0, help="KV cache of both engines, GiB")
    p.add_argument("--json", default=None, help="also write the result here (vLLM logs to stdout)")
    p.add_argument("--profile", default=None,
                   help="after the timed repetitions, one more harvest under cProfile: its top "
                        "functions (own and cumulative time) go to this text file")
    a = p.parse_args()

    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams, TokensPrompt
    from vllm.platforms import current_platform

    from data_pipelines.harvest import DEFAULT_MODEL, HarvestConfig, harvest
    from gambit_core.prompts import build_prompt_ids
    from gambit_core.questions import load_questions
    from gambit_search._vllm_internals import llm_workaround_kwargs

    model = a.model or DEFAULT_MODEL
    spec = f"toy:train:{a.questions}"
    qs = load_questions(spec)
    tok = AutoTokenizer.from_pretrained(model)
    prompts = [TokensPrompt(prompt_token_ids=build_prompt_ids(q.question, tok)) for q in qs]
    results = {"plain": [], "harvest": []}

    def run_plain() -> None:
        # the harvest's VLLMEngine defaults: eager on CPU, CUDA graphs + compile on GPU
        llm = LLM(model=model, enforce_eager=current_platform.is_cpu(), block_size=32,
                  max_num_seqs=a.max_live,
                  enable_prefix_caching=True, kv_cache_memory_bytes=int(a.kv_cache * (1 << 30)), seed=0,
                  **llm_workaround_kwargs())  # the harvest's engine gets the same
        sp = SamplingParams(n=a.n, temperature=1.0, top_p=1.0, top_k=0, max_tokens=400, seed=0)
        t0 = time.time()
        outs = llm.generate(prompts, sp, use_tqdm=False)
        dt = time.time() - t0
        toks = sum(len(c.token_ids) for o in outs for c in o.outputs)
        results["plain"].append({"tokens": toks, "seconds": dt, "tokens_per_s": toks / dt})
        llm.llm_engine.engine_core.shutdown()  # its processes gone before the harvest starts
        del llm
        import gc

        gc.collect()

    def run_harvest(record: bool = True) -> None:
        out = tempfile.mkdtemp(prefix="gambit-bench-")
        try:
            t0 = time.time()
            s = harvest(HarvestConfig(out=out, model=model, dataset=spec, n=a.n, max_live=a.max_live,
                                      questions_per_shard=16, kv_cache=a.kv_cache))
            toks = s["tokens_per_trace"] * s["traces"]
            dt = s["sampling_seconds"]  # after engine start-up, like the plain timing
            if record:
                results["harvest"].append({"tokens": toks, "seconds": dt, "tokens_per_s": toks / dt,
                                           "seconds_incl_startup": time.time() - t0})
        finally:
            shutil.rmtree(out, ignore_errors=True)

    for r in range(a.repeats):
        for fn in (run_plain, run_harvest) if r % 2 == 0 else (run_harvest, run_plain):
            fn()
    if a.profile:  # not timed: cProfile slows the driver's thread
        import cProfile
        import io
        import pstats

        prof = cProfile.Profile()
        prof.enable()
        run_harvest(record=False)
        prof.disable()
        buf = io.StringIO()
        for key in ("tottime", "cumulative"):
            pstats.Stats(prof, stream=buf).sort_stats(key).print_stats(30)
        with open(a.profile, "w") as f:
            f.write(buf.getvalue())
    import statistics

    plain = statistics.median(r["tokens_per_s"] for r in results["plain"])
    harv = statistics.median(r["tokens_per_s"] for r in results["harvest"])
    results["ratio_harvest_over_plain"] = harv / plain
    pairs = [h["tokens_per_s"] / p["tokens_per_s"] for p, h in zip(results["plain"], results["harvest"], strict=True)]
    results["ratio_per_repetition"] = pairs
    results["median_ratio_per_repetition"] = statistics.median(pairs)
    results["command"] = "python " + " ".join(sys.argv)
    print(json.dumps(results, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
