"""gambit-serve under load: requests/s and latency by method and client concurrency, and the
server's overhead against gambit-solve on the same questions.

    .venv/bin/python benchmarks/serve_bench.py --json docs/results/serve/cpu.json
    # smaller / other settings
    .venv/bin/python benchmarks/serve_bench.py --methods gambit --concurrency 1 8 --requests 8 \\
        --n 16 --capacity 8 --overhead-questions 16 --json runs/serve.json
    # the sweep only (no solve() engine afterwards)
    .venv/bin/python benchmarks/serve_bench.py --skip-overhead --json runs/serve.json

What it does, in order:

1. starts one ``gambit-serve`` subprocess (``--kv-cache``, ``--max-live``, the shipped toy
   policy and SeqScorer) and polls ``GET /health``;
2. sends one warm-up request per method, then for each method and each client concurrency C
   sends R requests (default ``max(8, C)``; questions cycle through ``--dataset``) from C
   closed-loop client threads (the ``openai`` client, no retries) and records requests/s
   (R / wall of the batch), p50 / p95 latency, completions per request (``usage.
   traces_completed``: every request must have exactly n, checked and reported), unique
   tokens per request (``usage.completion_tokens``) and accuracy (the answer against gold,
   for information only);
3. the overhead part, server side: the first Q questions (``--overhead-questions``) sent all
   at once (Q clients), ``--overhead-repeats`` times per method, wall = first send to last
   response;
4. SIGTERMs the server and waits for it to exit;
5. the overhead part, batch side (only now, so that the two engines never share the CPU):
   one engine started like the server's (same kv-cache, max-live, seed, confidence hook) in
   this process, one small warm-up run, then ``gambit_search.solve.solve()`` on the same Q
   questions with the same method settings, the same number of repeats; wall = the
   summary's ``wall_s`` (engine start excluded, as the server's start is).

overhead = median wall(server) / median wall(solve) - 1 per method (goal <= 5 %); the same
ratio per unique token is reported too, since the server's traces draw other seeds (its
request ids, not the question ids, seed the traces) and so generate slightly different
token counts. Because wall time on a shared 2-core machine moves with whatever else runs,
each overhead run also records CPU seconds (user + system, via psutil): the server's
process tree (uvicorn, the driver thread, vLLM's engine core) against this process's tree
during solve(), and the client threads' CPU separately; the 1-minute load average before
and after every run goes into the JSON. Repeats alternate the methods' order. Prints a
Markdown table; ``--json PATH`` writes every number and every request's record.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class BenchConfig:
    port: int = 8124
    host: str = "127.0.0.1"
    methods: list[str] = field(default_factory=lambda: ["gambit", "sc"])
    concurrency: list[int] = field(default_factory=lambda: [1, 8, 32])
    requests: int | None = None
    """Requests per (method, concurrency); None: max(8, concurrency)."""
    n: int = 16
    capacity: int = 8
    """Gambit's capacity (live traces per question)."""
    kv_cache: float = 0.05
    max_live: int = 128
    seed: int = 0
    dataset: str = "toy:test"
    """Question source (gambit-solve's --dataset without a count)."""
    pool: int = 64
    """The first this many questions are cycled through by the sweep."""
    overhead_questions: int = 32
    overhead_repeats: int = 3
    skip_overhead: bool = False
    admit_timeout: float = 60.0
    """gambit-serve's --admit-timeout (its default)."""
    startup_timeout: float = 600.0
    request_timeout: float = 600.0
    server_log: str | None = None
    json: str | None = None

    def params(self, method: str) -> dict:
        """The method's parameters, as the ``gambit`` object of a request takes them."""
        return {"capacity": self.capacity} if method == "gambit" else {}


def tree_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` and its live descendants (vLLM's engine
    core is a child process)."""
    import psutil

    total = 0.0
    try:
        procs = [psutil.Process(pid)]
        procs += procs[0].children(recursive=True)
    except psutil.Error:
        return float("nan")
    for pr in procs:
        try:
            t = pr.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


# -- the server ------------------------------------------------------------------------------------
def start_server(cfg: BenchConfig, log_path: Path) -> subprocess.Popen:
    # the console script's module: works installed and from a source tree on PYTHONPATH
    cmd = [sys.executable, "-m", "gambit_search.serve", "--host", cfg.host,
           "--port", str(cfg.port), "--kv-cache", str(cfg.kv_cache),
           "--max-live", str(cfg.max_live), "--n", str(cfg.n), "--seed", str(cfg.seed),
           "--admit-timeout", str(cfg.admit_timeout)]
    log = open(log_path, "w")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    proc._bench_log = log  # type: ignore[attr-defined]
    proc._bench_cmd = cmd  # type: ignore[attr-defined]
    return proc


def wait_healthy(cfg: BenchConfig, proc: subprocess.Popen, log_path: Path) -> float:
    t0 = time.perf_counter()
    url = f"http://{cfg.host}:{cfg.port}/health"
    while time.perf_counter() - t0 < cfg.startup_timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"gambit-serve exited with {proc.returncode} while starting:\n"
                               + log_path.read_text()[-4000:])
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200 and json.loads(r.read()).get("status") == "ok":
                    return time.perf_counter() - t0
        except (OSError, ValueError):
            pass
        time.sleep(1.0)
    raise RuntimeError(f"gambit-serve not healthy after {cfg.startup_timeout:g} s")


def stop_server(proc: subprocess.Popen, timeout: float = 600.0) -> dict:
    t0 = time.perf_counter()
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        rc = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = proc.wait()
    proc._bench_log.close()  # type: ignore[attr-defined]
    return {"returncode": rc, "stop_s": round(time.perf_counter() - t0, 3)}


def scrape_metrics(cfg: BenchConfig) -> str:
    try:
        with urllib.request.urlopen(f"http://{cfg.host}:{cfg.port}/metrics", timeout=5) as r:
            return r.read().decode()
    except OSError as e:
        return f"# unavailable: {e}"


# -- the clients -----------------------------------------------------------------------------------
def one_request(client, q, method: str, cfg: BenchConfig) -> dict:
    import openai

    from gambit_core.grading import is_equivalent

    body = {"method": method, "n": cfg.n, **cfg.params(method)}
    t0 = time.perf_counter()
    rec: dict = {"qid": str(q.id), "gold": q.answer, "t_start": t0}
    try:
        resp = client.chat.completions.create(
            model="gambit", messages=[{"role": "user", "content": q.question}],
            extra_body={"gambit": body})
        d = resp.model_dump()
        rec["ok"] = True
    except openai.APIStatusError as e:
        d = {}
        rec.update(ok=False, status=e.status_code, error=str(e)[:500])
    except Exception as e:  # noqa: BLE001 - a transport error is a failed request
        d = {}
        rec.update(ok=False, status=None, error=f"{type(e).__name__}: {e}"[:500])
    t1 = time.perf_counter()
    rec["latency_s"] = t1 - t0
    rec["t_end"] = t1
    if rec["ok"]:
        u, g = d.get("usage") or {}, d.get("gambit") or {}
        ts = g.get("tree_stats") or {}
        rec.update(answer=g.get("answer"), traces_completed=u.get("traces_completed"),
                   tree_completions=ts.get("completions"),
                   votes=sum(v.get("count", 0) for v in g.get("votes") or []),
                   completion_tokens=u.get("completion_tokens"),
                   prompt_tokens=u.get("prompt_tokens"), server_wall_s=g.get("wall_s"),
                   method=g.get("method"))
        rec["correct"] = bool(rec["answer"] is not None and q.answer
                              and is_equivalent(q.answer, rec["answer"]))
    return rec


def run_batch(client, questions: list, method: str, concurrency: int, cfg: BenchConfig,
              total: int, server_pid: int | None = None) -> dict:
    """``total`` requests (question i % len) from ``concurrency`` closed-loop clients."""
    lock = threading.Lock()
    nxt = [0]
    recs: list[dict] = []

    def worker() -> None:
        while True:
            with lock:
                i = nxt[0]
                if i >= total:
                    return
                nxt[0] += 1
            r = one_request(client, questions[i % len(questions)], method, cfg)
            r["i"] = i
            with lock:
                recs.append(r)

    load0 = os.getloadavg()[0]
    cpu0 = tree_cpu_s(server_pid) if server_pid else None
    client0 = time.process_time()
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as ex:
        for f in [ex.submit(worker) for _ in range(concurrency)]:
            f.result()
    wall = time.perf_counter() - t0
    cpu = {"server_cpu_s": round(tree_cpu_s(server_pid) - cpu0, 3) if server_pid else None,
           "client_cpu_s": round(time.process_time() - client0, 3),
           "loadavg_1m": [round(load0, 2), round(os.getloadavg()[0], 2)]}
    recs.sort(key=lambda r: r["i"])
    for r in recs:
        r["t_start"] = round(r["t_start"] - t0, 4)
        r["t_end"] = round(r["t_end"] - t0, 4)
        r["latency_s"] = round(r["latency_s"], 4)
    return {"method": method, "concurrency": concurrency, "requests": total,
            "wall_s": round(wall, 3), **cpu, **summarize_batch(recs, cfg.n, wall),
            "records": recs}


def _pct(xs: list[float], p: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    k = (len(xs) - 1) * p
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def summarize_batch(recs: list[dict], n: int, wall: float) -> dict:
    ok = [r for r in recs if r["ok"]]
    lat = [r["latency_s"] for r in ok]
    comps = [r["traces_completed"] for r in ok]
    bad = [r["i"] for r in ok if r["traces_completed"] != n or r["tree_completions"] != n]
    return {
        "ok": len(ok), "failed": len(recs) - len(ok),
        "requests_per_s": round(len(ok) / wall, 4) if wall > 0 else None,
        "latency_p50_s": _round(_pct(lat, 0.50)), "latency_p95_s": _round(_pct(lat, 0.95)),
        "latency_mean_s": _round(statistics.fmean(lat) if lat else None),
        "completions_per_request": _round(statistics.fmean(comps) if comps else None),
        "completions_min": min(comps, default=None), "completions_max": max(comps, default=None),
        "completions_all_equal_n": not bad and len(ok) == len(recs),
        "requests_not_n": bad,
        "tokens_per_request": _round(statistics.fmean(r["completion_tokens"] for r in ok)
                                     if ok else None, 1),
        "tokens_total": sum(r["completion_tokens"] or 0 for r in ok),
        "accuracy": _round(sum(r["correct"] for r in ok) / len(ok) if ok else None),
    }


def _round(x, d: int = 4):
    return None if x is None else round(x, d)


# -- the batch side --------------------------------------------------------------------------------
def run_solve_side(cfg: BenchConfig, methods: list[str]) -> dict:
    """solve() on one engine started with the server's settings: warm-up, then the repeats."""
    from gambit_search.solve import make_config, prepare, solve, start_engine

    def conf(method: str, questions: int, out: str | None):
        return make_config(dataset=f"{cfg.dataset}:{questions}", method=method, n=cfg.n, kv_cache=cfg.kv_cache,
                           max_live=cfg.max_live, seed=cfg.seed, out=out,
                           **cfg.params(method))

    tmp = Path(tempfile.mkdtemp(prefix="serve_bench_solve_"))
    # the server's engine has the confidence hook on whenever its scorer wants it (whatever
    # the method): start this one the same way
    needs_conf = prepare(conf("gambit", 1, str(tmp / "probe"))).needs_confidence
    t0 = time.perf_counter()
    engine, decode = start_engine(conf(methods[0], 1, None), needs_conf)
    start_s = time.perf_counter() - t0
    runs: list[dict] = []
    try:
        for m in methods:  # warm-up, not counted
            solve(conf(m, 4, str(tmp / f"warm_{m}")), engine=engine, decode=decode,
                  progress=False)
        for rep in range(cfg.overhead_repeats):
            for m in (methods if rep % 2 == 0 else methods[::-1]):
                load0, cpu0 = os.getloadavg()[0], tree_cpu_s(os.getpid())
                s = solve(conf(m, cfg.overhead_questions, str(tmp / f"{m}_{rep}")),
                          engine=engine, decode=decode, progress=False)
                cpu = tree_cpu_s(os.getpid()) - cpu0
                rows = s.get("results") or []
                comps = [r.get("tree_stats", {}).get("completions") for r in rows]
                runs.append({"method": m, "repeat": rep, "wall_s": s["wall_s"],
                             "cpu_s": round(cpu, 3),
                             "loadavg_1m": [round(load0, 2), round(os.getloadavg()[0], 2)],
                             "questions": s["questions_this_run"],
                             "unique_tokens": s["unique_tokens_this_run"],
                             "accuracy": s["accuracy"],
                             "completions_all_equal_n": all(c == cfg.n for c in comps),
                             "search_overhead_pct": s["timing"]["search_overhead_pct"],
                             "errors": sum(bool(r.get("error")) for r in rows)})
                print(f"  solve {m} rep {rep}: {s['wall_s']:.2f} s", file=sys.stderr, flush=True)
    finally:
        engine.close()
    return {"engine_start_s": round(start_s, 1), "runs": runs, "needs_confidence": needs_conf,
            "needs_confidence_note": "the engine's confidence hook, as gambit-serve sets it"}


def overhead_table(server_runs: list[dict], solve_runs: list[dict], methods: list[str]) -> list:
    out = []
    for m in methods:
        sv = [r for r in server_runs if r["method"] == m]
        so = [r for r in solve_runs if r["method"] == m]
        if not sv or not so:
            continue
        ws, wb = statistics.median(r["wall_s"] for r in sv), statistics.median(r["wall_s"]
                                                                              for r in so)
        ts = statistics.median(r["wall_s"] / max(1, r["tokens_total"]) for r in sv)
        tb = statistics.median(r["wall_s"] / max(1, r["unique_tokens"]) for r in so)
        cs = statistics.median(r["server_cpu_s"] for r in sv)
        cc = statistics.median(r["client_cpu_s"] for r in sv)
        cb = statistics.median(r["cpu_s"] for r in so)
        out.append({"method": m, "wall_server_s": round(ws, 3), "wall_solve_s": round(wb, 3),
                    "cpu_server_s": round(cs, 3), "cpu_client_s": round(cc, 3),
                    "cpu_solve_s": round(cb, 3),
                    "cpu_overhead": round(cs / cb - 1, 4),
                    "cpu_overhead_with_client": round((cs + cc) / cb - 1, 4),
                    "cpus_server_s": [r["server_cpu_s"] for r in sv],
                    "cpus_solve_s": [r["cpu_s"] for r in so],
                    "loadavg_server": [r["loadavg_1m"] for r in sv],
                    "loadavg_solve": [r["loadavg_1m"] for r in so],
                    "walls_server_s": [r["wall_s"] for r in sv],
                    "walls_solve_s": [r["wall_s"] for r in so],
                    "tokens_server": [r["tokens_total"] for r in sv],
                    "tokens_solve": [r["unique_tokens"] for r in so],
                    "accuracy_server": [r["accuracy"] for r in sv],
                    "accuracy_solve": [r["accuracy"] for r in so],
                    "overhead": round(ws / wb - 1, 4),
                    "overhead_per_token": round(ts / tb - 1, 4),
                    "goal_met": ws / wb - 1 <= 0.05})
    return out


# -- report ----------------------------------------------------------------------------------------
def markdown(res: dict) -> str:
    cfg = res["config"]
    lines = [f"gambit-serve, n={cfg['n']} (Gambit capacity {cfg['capacity']}), kv "
             f"{cfg['kv_cache']} GiB, max-live {cfg['max_live']}", "",
             "| method | clients | requests | requests/s | p50 latency | p95 latency | "
             "completions / request | tokens / request | accuracy | failed |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for b in res["sweep"]:
        c = f"{b['completions_per_request']:g}" if b["completions_per_request"] is not None \
            else "-"
        c += "" if b["completions_all_equal_n"] else f" (NOT all {cfg['n']}: {b['requests_not_n']})"
        lines.append(f"| {b['method']} | {b['concurrency']} | {b['requests']} | "
                     f"{b['requests_per_s']:.2f} | {b['latency_p50_s']:.2f} s | "
                     f"{b['latency_p95_s']:.2f} s | {c} | {b['tokens_per_request']:,.0f} | "
                     f"{b['accuracy']:.3f} | {b['failed']} |")
    if res.get("overhead"):
        lines += ["", "| method | questions | wall server (median) | wall solve() (median) | "
                  "server walls | solve walls | overhead | per token | goal <= 5 % | "
                  "CPU server / solve() (median) | CPU overhead (+ client) |",
                  "|---|---:|---:|---:|---|---|---:|---:|---|---:|---:|"]
        for o in res["overhead"]:
            lines.append(
                f"| {o['method']} | {cfg['overhead_questions']} | {o['wall_server_s']:.2f} s | "
                f"{o['wall_solve_s']:.2f} s | {', '.join(f'{w:.2f}' for w in o['walls_server_s'])}"
                f" | {', '.join(f'{w:.2f}' for w in o['walls_solve_s'])} | "
                f"{100 * o['overhead']:+.1f} % | {100 * o['overhead_per_token']:+.1f} % | "
                f"{'met' if o['goal_met'] else 'NOT met'} | "
                f"{o['cpu_server_s']:.1f} / {o['cpu_solve_s']:.1f} s | "
                f"{100 * o['cpu_overhead']:+.1f} % ({100 * o['cpu_overhead_with_client']:+.1f} %) |")
    return "\n".join(lines)


def parse(argv: list[str] | None = None) -> BenchConfig:
    d = BenchConfig()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--port", type=int, default=d.port)
    p.add_argument("--host", default=d.host)
    p.add_argument("--methods", nargs="+", default=d.methods, choices=["gambit", "sc"])
    p.add_argument("--concurrency", nargs="+", type=int, default=d.concurrency)
    p.add_argument("--requests", type=int, default=None,
                   help="requests per (method, concurrency); default max(8, concurrency)")
    p.add_argument("--n", type=int, default=d.n)
    p.add_argument("--capacity", type=int, default=d.capacity)
    p.add_argument("--kv-cache", type=float, default=d.kv_cache)
    p.add_argument("--max-live", type=int, default=d.max_live)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--dataset", default=d.dataset, help="questions (default %(default)s)")
    p.add_argument("--pool", type=int, default=d.pool,
                   help="the sweep cycles through the first POOL questions")
    p.add_argument("--overhead-questions", type=int, default=d.overhead_questions)
    p.add_argument("--overhead-repeats", type=int, default=d.overhead_repeats)
    p.add_argument("--skip-overhead", action="store_true")
    p.add_argument("--admit-timeout", type=float, default=d.admit_timeout)
    p.add_argument("--startup-timeout", type=float, default=d.startup_timeout)
    p.add_argument("--request-timeout", type=float, default=d.request_timeout)
    p.add_argument("--server-log", default=None, help="gambit-serve's output (default: a temp file)")
    p.add_argument("--json", default=None, help="write every number here")
    return BenchConfig(**{k.replace("-", "_"): v for k, v in vars(p.parse_args(argv)).items()})


def main(argv: list[str] | None = None) -> dict:
    cfg = parse(argv)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    import openai

    from gambit_core.questions import load_questions

    questions = load_questions(f"{cfg.dataset}:{max(cfg.pool, cfg.overhead_questions)}")
    if cfg.overhead_questions > len(questions):
        raise SystemExit(f"--overhead-questions {cfg.overhead_questions} > {len(questions)} "
                         f"questions in {cfg.dataset}")
    pool = questions[:cfg.pool]
    log_path = Path(cfg.server_log or tempfile.mktemp(prefix="gambit_serve_", suffix=".log"))
    t_all = time.perf_counter()
    res: dict = {"config": asdict(cfg), "machine": {
        "platform": platform.platform(), "cpus": os.cpu_count(),
        "loadavg_start": os.getloadavg()}, "server_log": str(log_path)}
    proc = start_server(cfg, log_path)
    res["server_cmd"] = proc._bench_cmd  # type: ignore[attr-defined]
    try:
        res["server_start_s"] = round(wait_healthy(cfg, proc, log_path), 1)
        print(f"gambit-serve healthy after {res['server_start_s']} s", file=sys.stderr,
              flush=True)
        client = openai.OpenAI(base_url=f"http://{cfg.host}:{cfg.port}/v1", api_key="none",
                               timeout=cfg.request_timeout, max_retries=0)
        res["warmup"] = [one_request(client, pool[-1 - k], m, cfg)
                         for k, m in enumerate(cfg.methods)]
        sweep = []
        for m in cfg.methods:
            for c in cfg.concurrency:
                total = cfg.requests if cfg.requests is not None else max(8, c)
                b = run_batch(client, pool, m, c, cfg, total, server_pid=proc.pid)
                sweep.append(b)
                print(f"  {m} c={c}: {b['requests_per_s']} req/s, p50 {b['latency_p50_s']} s, "
                      f"p95 {b['latency_p95_s']} s, comps {b['completions_per_request']}, "
                      f"failed {b['failed']}", file=sys.stderr, flush=True)
                if b["failed"]:
                    print("    first failure: " + next(r["error"] for r in b["records"]
                                                   if not r["ok"]), file=sys.stderr, flush=True)
        res["sweep"] = sweep
        server_runs = []
        if not cfg.skip_overhead:
            qs = questions[:cfg.overhead_questions]
            for rep in range(cfg.overhead_repeats):
                for m in (cfg.methods if rep % 2 == 0 else cfg.methods[::-1]):
                    b = run_batch(client, qs, m, len(qs), cfg, len(qs), server_pid=proc.pid)
                    b["repeat"] = rep
                    server_runs.append(b)
                    print(f"  server {m} rep {rep} ({len(qs)} at once): {b['wall_s']:.2f} s",
                          file=sys.stderr, flush=True)
        res["overhead_server_runs"] = server_runs
        res["metrics_after"] = scrape_metrics(cfg)
    finally:
        res["server_stop"] = stop_server(proc)
        print(f"gambit-serve stopped: {res['server_stop']}", file=sys.stderr, flush=True)
    if cfg.json:  # the server's part, in case the solve() part fails
        Path(cfg.json).parent.mkdir(parents=True, exist_ok=True)
        Path(cfg.json).write_text(json.dumps(res, indent=2, default=str))
    if not cfg.skip_overhead:
        solve_side = run_solve_side(cfg, cfg.methods)
        res["overhead_solve"] = solve_side
        res["overhead"] = overhead_table(server_runs, solve_side["runs"], cfg.methods)
    res["machine"]["loadavg_end"] = os.getloadavg()
    res["total_s"] = round(time.perf_counter() - t_all, 1)
    table = markdown(res)
    res["markdown"] = table
    print(table)
    print(f"\ntotal {res['total_s']} s", file=sys.stderr)
    if cfg.json:
        Path(cfg.json).parent.mkdir(parents=True, exist_ok=True)
        Path(cfg.json).write_text(json.dumps(res, indent=2, default=str))
    return res


if __name__ == "__main__":
    main()
