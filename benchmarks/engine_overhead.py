"""Engine adapter overhead: generation throughput with boundary capture vs plain vLLM, and
the cost of a fork.

One engine, one run: for each concurrency C the same C prompts (C/2 toy questions x 2 seeds,
all added at once, ``max_num_seqs`` >= C) are generated alternately

* ``plain``:   ``LLM.generate`` on the same ``vllm.LLM`` with Gambit's worker hooks removed
  (vLLM builds outputs only at the end: ``FINAL_ONLY``);
* ``stream``:  the same, driven step by step through ``llm_engine`` with ``DELTA`` outputs
  (what any per-token consumer pays; no Gambit code);
* ``adapter``: :class:`~gambit_search.vllm_engine.VLLMEngine` stepping with boundary capture
  (hooks installed, boundary rows pushed, deltas and boundary events built);
* ``adapter_si``: the same with ``stream_interval=--stream-interval`` (tokens delivered
  every N steps: vLLM builds N times fewer outputs),

``--reps`` times each, rotating the order; with identical seeds all produce the same tokens.
Reported: tokens/s of each (median over reps) and the ratios (goal >= 0.97), plus the CPU
time the adapter's own code took (driver + worker, per token) over plain vLLM's CPU per
token. Then forks: C traces run,
and every few steps running traces are forked; per fork the prompt tokens recomputed
(prompt len - ``num_cached_tokens``), the ``fork()`` call time and the time to the child's
first token.

    .venv/bin/python benchmarks/engine_overhead.py                 # toy policy, C = 64, 256
    .venv/bin/python benchmarks/engine_overhead.py --reps 5 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _prompts(tokenizer, n: int) -> list[tuple[list[int], int]]:
    from data_pipelines.toy.task import draw_questions
    from gambit_core.prompts import build_prompt_ids

    qs = draw_questions("test", (n + 1) // 2)
    ids = [build_prompt_ids(q.text, tokenizer) for q in qs]
    return [(ids[k // 2], 10_000 + k) for k in range(n)]


def run_plain(eng, jobs, max_tokens: int) -> tuple[int, float]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = [SamplingParams(temperature=1.0, top_p=1.0, top_k=0, max_tokens=max_tokens,
                             seed=s) for _, s in jobs]
    prompts = [TokensPrompt(prompt_token_ids=p) for p, _ in jobs]
    t0 = time.perf_counter()
    outs = eng.llm.generate(prompts, params, use_tqdm=False)
    dt = time.perf_counter() - t0
    return sum(len(o.outputs[0].token_ids) for o in outs), dt


def run_stream(eng, jobs, max_tokens: int) -> tuple[int, float]:
    """Plain vLLM streaming: ``llm_engine.add_request`` / ``step()`` with DELTA outputs (what
    the adapter drives), no Gambit code."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    llm_engine = eng.llm.llm_engine
    t0 = time.perf_counter()
    for k, (p, s) in enumerate(jobs):
        llm_engine.add_request(f"stream-{k}", TokensPrompt(prompt_token_ids=p), SamplingParams(
            temperature=1.0, top_p=1.0, top_k=0, max_tokens=max_tokens, seed=s,
            output_kind=RequestOutputKind.DELTA))
    n = 0
    while llm_engine.has_unfinished_requests():
        for ro in llm_engine.step():
            n += len(ro.outputs[0].token_ids)
    return n, time.perf_counter() - t0


def run_adapter(eng, jobs, max_tokens: int) -> tuple[int, float, int]:
    from gambit_search.engine import SamplingSpec

    spec = SamplingSpec(temperature=1.0, top_p=1.0, top_k=0, max_tokens=max_tokens)
    t0 = time.perf_counter()
    for p, s in jobs:
        eng.add_trace(p, spec, seed=s)
    n_tok = n_ev = 0
    while eng.has_unfinished():
        out = eng.step()
        n_tok += sum(len(d.token_ids) for d in out.deltas)
        n_ev += len(out.boundaries)
    dt = time.perf_counter() - t0
    return n_tok, dt, n_ev


def _cpu_seconds() -> dict[int, float]:
    """user+system CPU seconds of this process and every descendant (engine core, worker)."""
    import psutil

    me = psutil.Process()
    out = {}
    for p in [me, *me.children(recursive=True)]:
        try:
            t = p.cpu_times()
            out[p.pid] = t.user + t.system
        except psutil.Error:
            pass
    return out


def bench_throughput(eng, conc: int, reps: int, max_tokens: int, interval: int) -> dict:
    jobs = _prompts(eng.tokenizer, conc)
    rows = {"plain": [], "stream": [], "adapter": [], "adapter_si": []}
    events = 0
    for r in range(reps):
        modes = tuple(rows)
        for mode in modes[r % 4:] + modes[: r % 4]:
            if mode not in ("adapter", "adapter_si"):
                eng.set_capture(False)
            eng.stream_interval = interval if mode == "adapter_si" else 1
            c0 = _cpu_seconds()
            tm0, cs0 = dict(eng.timing), eng.capture_stats()
            if mode == "plain":
                n, dt = run_plain(eng, jobs, max_tokens)
            elif mode == "stream":
                n, dt = run_stream(eng, jobs, max_tokens)
            else:
                n, dt, events = run_adapter(eng, jobs, max_tokens)
            c1 = _cpu_seconds()
            extra = {}
            if mode.startswith("adapter"):
                tm1, cs1 = eng.timing, eng.capture_stats()
                extra = {
                    "steps": tm1["steps"] - tm0["steps"],
                    "driver_adapter_s": (tm1["step_s"] - tm0["step_s"])
                    - (tm1["vllm_step_s"] - tm0["vllm_step_s"]),
                    "driver_adapter_cpu_s": (tm1["step_cpu_s"] - tm0["step_cpu_s"])
                    - (tm1["vllm_step_cpu_s"] - tm0["vllm_step_cpu_s"]),
                    "worker_capture_s": cs1["capture_s"] - cs0["capture_s"],
                    "worker_capture_cpu_s": cs1["capture_cpu_s"] - cs0["capture_cpu_s"],
                }
            if mode not in ("adapter", "adapter_si"):
                eng.set_capture(True)
            cpu = sum(c1[k] - c0[k] for k in c0 if k in c1)
            rows[mode].append({"tokens": n, "seconds": dt, "tok_s": n / dt, "cpu_s": cpu,
                               "tok_per_cpu_s": n / cpu, **extra})
            more = (f" | adapter code: driver {extra['driver_adapter_s']:.2f} s "
                    f"({extra['driver_adapter_cpu_s']:.2f} cpu), worker "
                    f"{extra['worker_capture_s']:.2f} s ({extra['worker_capture_cpu_s']:.2f} "
                    f"cpu)" if extra else "")
            print(f"  C={conc} rep {r} {mode:10s} {n} tokens {dt:7.2f} s {n / dt:9.1f} tok/s "
                  f"cpu {cpu:6.1f} s {n / cpu:8.1f} tok/cpu-s  load {os.getloadavg()[0]:.1f}"
                  f"{more}", flush=True)
    med = {m: statistics.median(x["tok_s"] for x in v) for m, v in rows.items()}
    med_cpu = {m: statistics.median(x["tok_per_cpu_s"] for x in v) for m, v in rows.items()}
    paired = [a["tok_s"] / p["tok_s"] for a, p in zip(rows["adapter"], rows["plain"],
                                                      strict=True)]
    paired_stream = [a["tok_s"] / p["tok_s"] for a, p in zip(rows["adapter"], rows["stream"],
                                                             strict=True)]
    paired_si = [a["tok_s"] / p["tok_s"] for a, p in zip(rows["adapter_si"], rows["plain"],
                                                         strict=True)]
    own = [(a["driver_adapter_s"] + a["worker_capture_s"]) / a["seconds"]
           for a in rows["adapter"]]
    # CPU the adapter's own code costs per token, over the CPU plain vLLM needs per token
    plain_cpu_per_tok = statistics.median(p["cpu_s"] / p["tokens"] for p in rows["plain"])
    own_cpu = [(a["driver_adapter_cpu_s"] + a["worker_capture_cpu_s"]) / a["tokens"]
               / plain_cpu_per_tok for a in rows["adapter"]]
    return {"concurrency": conc, "runs": rows, "median_tok_s": med,
            "adapter_code_share_of_wall": statistics.median(own),
            "adapter_cpu_over_plain_cpu": statistics.median(own_cpu),
            "ratio_of_medians": med["adapter"] / med["plain"],
            "ratio_to_stream": med["adapter"] / med["stream"],
            "stream_interval": interval,
            "ratio_si_to_plain": med["adapter_si"] / med["plain"],
            "paired_ratios_si_to_plain": paired_si,
            "paired_ratios_to_stream": paired_stream,
            "median_tok_per_cpu_s": med_cpu,
            "cpu_ratio_of_medians": med_cpu["adapter"] / med_cpu["plain"],
            "paired_ratios": paired, "boundary_events_per_run": events}


def bench_forks(eng, conc: int, n_forks: int, max_tokens: int) -> dict:
    from gambit_search.engine import SamplingSpec, TraceStatus

    jobs = _prompts(eng.tokenizer, conc)
    spec = SamplingSpec(temperature=1.0, top_p=1.0, top_k=0, max_tokens=max_tokens)
    parents = [eng.add_trace(p, spec, seed=s) for p, s in jobs]
    forked: dict[int, dict] = {}
    step = 0
    k = 0
    while eng.has_unfinished():
        out = eng.step()
        now = time.perf_counter()
        step += 1
        for d in out.deltas:
            f = forked.get(d.trace)
            if f is not None and d.num_cached_tokens is not None:
                f["cached"] = d.num_cached_tokens
                f["ttft_ms"] = (now - f["t0"]) * 1000
        if len(forked) < n_forks and step % 5 == 0:
            running = [t for t in parents if eng.trace_info(t).status is TraceStatus.RUNNING
                       and len(eng.trace_info(t).output_ids) >= 8]
            for t in running[: min(8, n_forks - len(forked))]:
                t0 = time.perf_counter()
                c = eng.fork(t, seed=50_000 + k)
                t1 = time.perf_counter()
                k += 1
                forked[c] = {"t0": t0, "call_ms": (t1 - t0) * 1000,
                             "prompt_len": len(eng.trace_info(c).prompt_ids)}
    done = [f for f in forked.values() if "cached" in f]
    recomputed = [f["prompt_len"] - f["cached"] for f in done]
    return {
        "forks": len(done),
        "block_size": eng.block_size,
        "recomputed_tokens": {"mean": statistics.mean(recomputed), "max": max(recomputed),
                              "min": min(recomputed)},
        "prompt_len_mean": statistics.mean(f["prompt_len"] for f in done),
        "fork_call_ms": {"mean": statistics.mean(f["call_ms"] for f in done),
                         "max": max(f["call_ms"] for f in done)},
        "time_to_first_token_ms": {"median": statistics.median(f["ttft_ms"] for f in done),
                                   "mean": statistics.mean(f["ttft_ms"] for f in done)},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(REPO / "checkpoints" / "toy-policy"))
    ap.add_argument("--concurrency", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=300)
    ap.add_argument("--forks", type=int, default=128)
    ap.add_argument("--stream-interval", type=int, default=8,
                    help="the adapter_si mode's VLLMEngineConfig.stream_interval")
    ap.add_argument("--kv-cache", type=float, default=0.5, help="KV cache, GiB")
    ap.add_argument("--json", type=Path, default=None, help="write the results here")
    args = ap.parse_args(argv)

    import torch
    import vllm

    from gambit_search.vllm_config import VLLMEngineConfig
    from gambit_search.vllm_engine import VLLMEngine

    t0 = time.perf_counter()
    eng = VLLMEngine(VLLMEngineConfig(
        model=args.model, dtype="float32", max_num_seqs=max(args.concurrency),
        kv_cache_memory_bytes=int(args.kv_cache * (1 << 30)), block_size=32, seed=0))
    startup = time.perf_counter() - t0
    print(f"engine up in {startup:.1f} s (runner {eng.runner_kind})", flush=True)
    # warm-up both paths
    run_plain(eng, _prompts(eng.tokenizer, 8), 32)
    run_adapter(eng, _prompts(eng.tokenizer, 8), 32)
    res = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "vllm": vllm.__version__, "torch": torch.__version__,
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "startup_s": startup, "throughput": [], "forks": None,
        "load_avg_start": os.getloadavg(),
    }
    for c in args.concurrency:
        res["throughput"].append(bench_throughput(eng, c, args.reps, args.max_tokens,
                                                  args.stream_interval))
    eng.stream_interval = 1
    res["forks"] = bench_forks(eng, min(args.concurrency), args.forks, args.max_tokens)
    res["memory_after"] = eng.memory().__dict__
    res["load_avg_end"] = os.getloadavg()
    eng.close()

    si = args.stream_interval
    print(f"\n| traces | plain generate tok/s | vLLM stream tok/s | adapter tok/s | "
          f"adapter si={si} tok/s | adapter / plain | adapter / stream | "
          f"adapter si={si} / plain | adapter code CPU / plain CPU |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in res["throughput"]:
        m = r["median_tok_s"]

        def fmt(xs):
            return ", ".join(f"{x:.2f}" for x in xs)

        print(f"| {r['concurrency']} | {m['plain']:.0f} | {m['stream']:.0f} | "
              f"{m['adapter']:.0f} | {m['adapter_si']:.0f} | "
              f"{r['ratio_of_medians']:.3f} ({fmt(r['paired_ratios'])}) | "
              f"{r['ratio_to_stream']:.3f} ({fmt(r['paired_ratios_to_stream'])}) | "
              f"{r['ratio_si_to_plain']:.3f} ({fmt(r['paired_ratios_si_to_plain'])}) | "
              f"{r['adapter_cpu_over_plain_cpu']:.3f} |")
    f = res["forks"]
    print(f"\nforks: {f['forks']}, block size {f['block_size']}, prompt len mean "
          f"{f['prompt_len_mean']:.0f}; recomputed tokens mean "
          f"{f['recomputed_tokens']['mean']:.1f} (min {f['recomputed_tokens']['min']}, max "
          f"{f['recomputed_tokens']['max']}); fork() call {f['fork_call_ms']['mean']:.2f} ms "
          f"mean; child first token after {f['time_to_first_token_ms']['median']:.1f} ms "
          f"(median)")
    if args.json:
        args.json.write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
