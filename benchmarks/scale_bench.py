"""The search's cost at real-model scale: SC against Gambit, and the adapter's capture
against plain ``LLM.generate``, on a dummy-weight model of reasoning size.

    # on the GPU (scripts/gpu_run.sh bench-scale 4b|1.5b): Qwen3-4B's shape, 256 live traces
    python benchmarks/scale_bench.py --shape 4b --tokenizer /tmp/smol --out runs/scale_4b.json
    # a CPU smoke run of the same code (a tiny shape, short traces)
    .venv/bin/python benchmarks/scale_bench.py --shape tiny --dtype float32 --traces 16 \\
        --max-tokens 96 --boundary-every 16 --reps 1 --out runs/scale_tiny.json

What it builds, all in one process and on one engine:

* a model directory: ``config.json`` from transformers' config classes, shaped like
  Qwen3-4B (hidden 2560, 36 layers, 32 heads / 8 KV heads) or Qwen2.5-1.5B (1536, 28,
  12 / 2), with ``--tokenizer``'s vocabulary (SmolLM2's: 49,152 tokens where Qwen's have
  ~152k, so the LM head is a third of theirs) and no weights: vLLM fills them with random
  values (``load_format="dummy"``);
* an untrained scorer of the shipped SeqScorer's architecture at that hidden size
  (``benchmarks/untrained_scorer.py``): speed and overhead, never accuracy;
* traces of a fixed length (``ignore_eos``, ``--max-tokens``) with a thought boundary every
  ``--boundary-every`` output tokens (the engine's stride rule: a dummy model writes no
  "\\n\\n"), sampled at the paper's T = 0.6, top-p 0.95, top-k 20.

Then ``--reps`` times, alternating the order:

* ``plain``: ``LLM.generate`` of ``--traces`` prompts with the capture hooks off, and
  ``adapter``: the same prompts and seeds through :class:`VLLMEngine` with capture on;
* ``sc`` and ``gambit``: one question with N = C = ``--traces`` live traces through
  gambit-solve's own run (``prepare`` / ``run_prepared``), Gambit at K = 16 swaps a round,
  a round every ``--interval`` of the question's decode steps, warm-up ``--warmup`` tokens.

Reported per run: decode tok/s, the driver's milliseconds per engine step (scoring +
policy + memory + bookkeeping, over its engine steps), the search overhead (% of the run's
wall) and the mean running traces; and the ratios Gambit / SC and adapter / plain of the
same repetition.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

#: transformers config class, architecture and shape of each --shape
SHAPES: dict[str, tuple[str, str, dict]] = {
    "4b": ("Qwen3Config", "Qwen3ForCausalLM", dict(
        hidden_size=2560, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
        head_dim=128, intermediate_size=9728, rope_theta=1_000_000.0, rms_norm_eps=1e-6)),
    "1.5b": ("Qwen2Config", "Qwen2ForCausalLM", dict(
        hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
        intermediate_size=8960, rope_theta=1_000_000.0, rms_norm_eps=1e-6)),
    "tiny": ("Qwen3Config", "Qwen3ForCausalLM", dict(
        hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=32, intermediate_size=256, rope_theta=1_000_000.0, rms_norm_eps=1e-6)),
}

SAMPLING = dict(temperature=0.6, top_p=0.95, top_k=20)


def build_model_dir(shape: str, tokenizer: str, out: Path, max_len: int) -> dict:
    """Write ``config.json`` (and the tokenizer's files) for ``shape`` into ``out``; returns
    the shape's facts (parameters, KV bytes per token)."""
    import transformers
    from transformers import AutoTokenizer

    cls_name, arch, dims = SHAPES[shape]
    tok = AutoTokenizer.from_pretrained(tokenizer)
    cfg = getattr(transformers, cls_name)(
        vocab_size=len(tok), max_position_embeddings=max(max_len, 4096),
        tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        **dims)
    cfg.architectures = [arch]
    out.mkdir(parents=True, exist_ok=True)
    cfg.save_pretrained(out)
    tok.save_pretrained(out)
    h, n_layers = dims["hidden_size"], dims["num_hidden_layers"]
    head = dims.get("head_dim", h // dims["num_attention_heads"])
    q, kv = dims["num_attention_heads"] * head, dims["num_key_value_heads"] * head
    per_layer = h * (q + 2 * kv) + q * h + 3 * h * dims["intermediate_size"]
    return {"shape": shape, "architecture": arch, "vocab": len(tok),
            "params": n_layers * per_layer + len(tok) * h,
            "kv_bytes_per_token_bf16": n_layers * 2 * kv * 2, **dims}


def _cuda_sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def run_plain(eng, jobs: list[tuple[list[int], int]], max_tokens: int) -> tuple[int, float]:
    """``LLM.generate`` of ``jobs`` (prompt ids, seed) to exactly ``max_tokens`` each."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = [SamplingParams(**SAMPLING, max_tokens=max_tokens, ignore_eos=True, seed=s,
                             detokenize=False) for _, s in jobs]
    prompts = [TokensPrompt(prompt_token_ids=p) for p, _ in jobs]
    t0 = time.perf_counter()
    outs = eng.llm.generate(prompts, params, use_tqdm=False)
    dt = time.perf_counter() - t0
    return sum(len(o.outputs[0].token_ids) for o in outs), dt


def run_adapter(eng, jobs: list[tuple[list[int], int]], max_tokens: int) -> tuple[int, float, int]:
    """The same through the adapter, capture on: (tokens, seconds, boundary events)."""
    from gambit_search.engine import SamplingSpec

    spec = SamplingSpec(**SAMPLING, max_tokens=max_tokens, ignore_eos=True)
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


def solve_row(summary: dict, label: str, rep: int) -> dict:
    """One search run's numbers (solve_bench's row, plus the driver's ms per engine step)."""
    from solve_bench import _row

    r = _row(summary, label, rep)
    tm = summary["timing"]
    driver_s = tm["scoring_s"] + tm["policy_s"] + tm["memory_s"] + tm["other_s"]
    r["driver_ms_per_step"] = 1000 * driver_s / max(1, tm["steps"])
    r["engine_ms_per_step"] = 1000 * tm["engine_s"] / max(1, tm["steps"])
    r["completions"] = sum((x.get("tree_stats") or {}).get("completions", 0)
                           for x in summary.get("results") or [])
    r["traces_started"] = sum((x.get("tree_stats") or {}).get("nodes", 0)
                              for x in summary.get("results") or [])
    return r


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="4b")
    ap.add_argument("--tokenizer", required=True, help="a tokenizer directory (SmolLM2's)")
    ap.add_argument("--traces", type=int, default=256, help="live traces: N = C of the search")
    ap.add_argument("--max-tokens", type=int, default=2048, help="every trace's fixed length")
    ap.add_argument("--boundary-every", type=int, default=64, help="output tokens a thought")
    ap.add_argument("--interval", type=int, default=64, help="Gambit's D, decode steps")
    ap.add_argument("--warmup", type=int, default=256, help="Gambit's w, tokens")
    ap.add_argument("--swap", type=int, default=16, help="Gambit's K")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--modes", default="plain,adapter,sc,gambit",
                    help="which runs, of plain, adapter, sc, gambit")
    ap.add_argument("--scorer-device", default="cpu", help="the driver's scorer: cpu|cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--kv-cache", type=float, default=None,
                    help="KV cache GiB (default: what the traces need, +10%%)")
    ap.add_argument("--eager", action="store_true",
                    help="no CUDA graphs (default on a GPU: full decode graphs, no compile)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/gambit-scale"),
                    help="where the model directory and scorer go")
    ap.add_argument("--out", type=Path, required=True, help="results JSON")
    a = ap.parse_args(argv)
    modes = a.modes.split(",")
    bad = sorted(set(modes) - {"plain", "adapter", "sc", "gambit"})
    if bad or a.traces < 2 or a.max_tokens < a.boundary_every:
        ap.error(f"bad --modes {bad}" if bad else "need --traces >= 2 and --max-tokens >= "
                 "--boundary-every")

    import torch
    import vllm
    from untrained_scorer import make_untrained_scorer

    from gambit_search.engines import get_engine_kind
    from gambit_search.solve import make_config, prepare, run_prepared
    from gambit_search.vllm_config import VLLMEngineConfig
    from gambit_search.vllm_engine import VLLMEngine

    mdir = a.work / f"model-{a.shape}"
    facts = build_model_dir(a.shape, a.tokenizer, mdir, a.max_tokens + 512)
    ckpt = a.work / f"scorer-{a.shape}.pt"
    print(make_untrained_scorer(str(mdir), str(ckpt)), flush=True)
    need = a.traces * (a.max_tokens + 256) * facts["kv_bytes_per_token_bf16"]
    if a.dtype == "float32":
        need *= 2
    kv_gib = a.kv_cache if a.kv_cache is not None else round(1.1 * need / (1 << 30), 2)
    print(f"shape {a.shape}: {facts['params'] / 1e9:.2f} B parameters, KV {kv_gib} GiB for "
          f"{a.traces} traces of {a.max_tokens} tokens", flush=True)
    gpu = torch.cuda.is_available()
    extra: dict = {"load_format": "dummy"}
    if gpu and not a.eager:
        # CUDA graphs of the decode batches without torch.compile: a real deployment's step
        # cost without minutes of compiling a fresh machine's cache
        extra["compilation_config"] = {"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY"}
    def start(extra_args: dict, eager: bool):
        return VLLMEngine(VLLMEngineConfig(
            model=str(mdir), dtype=a.dtype, max_num_seqs=a.traces, seed=0,
            kv_cache_memory_bytes=int(kv_gib * (1 << 30)), boundary_text=None,
            stride=a.boundary_every, detokenize=False, enforce_eager=True if eager else None,
            max_model_len=a.max_tokens + 512, extra_engine_args=extra_args))

    t0 = time.perf_counter()
    graphs = "compilation_config" in extra
    try:
        eng = start(extra, a.eager)
    except Exception as e:  # noqa: BLE001 - a vLLM without graph-only capture: say so, go eager
        if not graphs:
            raise
        print(f"engine with decode CUDA graphs failed ({type(e).__name__}: {e}); eager",
              flush=True)
        graphs = False
        eng = start({"load_format": "dummy"}, True)
    startup = time.perf_counter() - t0
    print(f"engine up in {startup:.0f} s (runner {eng.runner_kind})", flush=True)
    decode = get_engine_kind("vllm").decoder(eng)

    from data_pipelines.toy.task import draw_questions
    from gambit_core.prompts import build_prompt_ids

    q = draw_questions("val", 1)[0]
    prompt = build_prompt_ids(q.text, eng.tokenizer)
    jobs = [(prompt, 10_000 + k) for k in range(a.traces)]
    flat = {"dataset": "toy:val:1", "model": str(mdir), "scorer": str(ckpt), "n": a.traces,
            "max_live": a.traces, "kv_cache": kv_gib, "max_tokens": a.max_tokens,
            "capacity": a.traces, "swap": a.swap, "interval": a.interval, "warmup": a.warmup,
            "scorer_device": a.scorer_device, **SAMPLING}
    cfgs = {m: make_config(**flat | {"method": m}) for m in ("sc", "gambit")}
    # warm-up: a few short traces through each path (CUDA graphs, allocator, scorer)
    run_plain(eng, jobs[:8], 32)
    run_adapter(eng, jobs[:8], 32)

    res = {"command": " ".join([Path(sys.executable).name, *sys.argv]), "args": {
        k: str(v) for k, v in vars(a).items()}, "vllm": vllm.__version__,
        "torch": torch.__version__, "device": torch.cuda.get_device_name(0) if gpu
        else platform.processor() or platform.machine(), "shape": facts,
        "startup_s": startup, "cuda_graphs": graphs, "kv_cache_gib": kv_gib, "runs": [],
        "date": time.strftime("%Y-%m-%d")}
    try:
        for rep in range(a.reps):
            order = modes if rep % 2 == 0 else modes[::-1]
            for mode in order:
                _cuda_sync()
                if mode in ("plain", "adapter"):
                    eng.set_capture(mode == "adapter")
                    if mode == "plain":
                        n, dt = run_plain(eng, jobs, a.max_tokens)
                        ev = 0
                    else:
                        n, dt, ev = run_adapter(eng, jobs, a.max_tokens)
                    eng.set_capture(True)
                    row = {"label": mode, "repeat": rep, "tokens": n, "seconds": dt,
                           "tokens_per_s": n / dt, "boundary_events": ev}
                else:
                    s = run_prepared(prepare(cfgs[mode], None, eng.hidden_size), eng, decode,
                                     progress=False, sampling={"ignore_eos": True})
                    row = solve_row(s, mode, rep)
                    row.pop("timing_log", None)
                res["runs"].append(row)
                more = (f" driver {row['driver_ms_per_step']:.2f} ms/step (engine "
                        f"{row['engine_ms_per_step']:.1f}) overhead "
                        f"{row['search_overhead_pct']:.2f}% running {row.get('mean_running')}"
                        f" completions {row['completions']} started {row['traces_started']}"
                        if "driver_ms_per_step" in row else "")
                print(f"[rep {rep}] {mode:8s} {row.get('tokens', row.get('unique_tokens'))} "
                      f"tokens {row['tokens_per_s']:9.0f} tok/s{more}", flush=True)
                a.out.parent.mkdir(parents=True, exist_ok=True)
                a.out.write_text(json.dumps(res, indent=1))
    finally:
        eng.close()
    res["ratios"] = ratios(res["runs"], a.reps)
    a.out.write_text(json.dumps(res, indent=1))
    print(json.dumps(res["ratios"], indent=1))
    return 0


def ratios(runs: list[dict], reps: int) -> dict:
    """Gambit / SC and adapter / plain decode tok/s within each repetition, and their
    medians; Gambit's overhead and driver ms per step."""
    out: dict = {}
    for num, den in (("gambit", "sc"), ("adapter", "plain")):
        xs = []
        for rep in range(reps):
            a = [r for r in runs if r["repeat"] == rep and r["label"] == num]
            b = [r for r in runs if r["repeat"] == rep and r["label"] == den]
            if a and b:
                xs.append(a[0]["tokens_per_s"] / b[0]["tokens_per_s"])
        if xs:
            out[f"{num}/{den}"] = {"per_repeat": [round(x, 4) for x in xs],
                                   "median": round(statistics.median(xs), 4)}
    for m in ("sc", "gambit"):
        rs = [r for r in runs if r["label"] == m]
        if rs:
            out[m] = {k: round(statistics.median(r[k] for r in rs), 3) for k in
                      ("driver_ms_per_step", "engine_ms_per_step", "search_overhead_pct")}
            out[m]["mean_running"] = [r.get("mean_running") for r in rs]
    return out


if __name__ == "__main__":
    raise SystemExit(main())
