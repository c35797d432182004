"""The vLLM engine adapter: the real engine on the toy policy (slow), its capture internals
on stand-in runners and its pre-start checks (fast).

Run all:        .venv/bin/python -m pytest -q tests/test_vllm_engine.py
Only the fast:  .venv/bin/python -m pytest -q tests/test_vllm_engine.py -m 'not slow'
"""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from gambit_search import _vllm_internals as vi
from gambit_search.boundary_vocab import BoundaryVocab, closed_after
from gambit_search.engine import EngineError, SamplingSpec, TraceStatus
from gambit_search.vllm_config import VLLMEngineConfig
from gambit_search.vllm_engine import VLLMEngine

TOY_POLICY = Path(__file__).resolve().parents[1] / "checkpoints" / "toy-policy"

BOUNDARY = 4  # the toy tokenizer's "\n\n"


# =========================================================================== helpers


def toy_prompts(tokenizer, n: int, split: str = "test") -> list[list[int]]:
    from data_pipelines.toy.task import draw_questions
    from gambit_core.prompts import build_prompt_ids

    return [build_prompt_ids(q.text, tokenizer) for q in draw_questions(split, n)]


def run(engine, max_steps: int = 5000):
    """Step until idle; returns (tokens incl. those delivered before, texts, events, first
    deltas) per trace."""
    tokens = {t: list(engine.trace_info(t).output_ids) for t in engine.trace_ids()}
    texts: dict[int, str] = {}
    events: dict[int, list] = {}
    first: dict[int, object] = {}
    for _ in range(max_steps):
        if not engine.has_unfinished():
            break
        out = engine.step()
        for d in out.deltas:
            tokens.setdefault(d.trace, []).extend(d.token_ids)
            texts[d.trace] = texts.get(d.trace, "") + d.text
            first.setdefault(d.trace, d)
        for e in out.boundaries:
            assert e.output_index < len(tokens.get(e.trace, [])), "event before its token"
            events.setdefault(e.trace, []).append(e)
    engine.step()  # late rows, if any
    return tokens, texts, events, first


def hf_states(model, ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """(last_hidden_state [n, d], logits [n, V]) of transformers on ``ids``."""
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), output_hidden_states=True)
    return out.hidden_states[-1][0].numpy(), out.logits[0].numpy()


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-12))


# =========================================================================== fast: pre-start


def test_missing_model_path_is_a_one_line_error_before_start(tmp_path):
    with pytest.raises(EngineError, match="does not exist") as e:
        VLLMEngine(VLLMEngineConfig(model=str(tmp_path / "nope")))
    assert "\n" not in str(e.value)
    with pytest.raises(EngineError, match="does not exist"):
        VLLMEngine(VLLMEngineConfig(model="checkpoints/no-such-model"))
    with pytest.raises(EngineError, match="no config.json"):
        VLLMEngine(VLLMEngineConfig(model=str(tmp_path)))


def test_tokenizer_without_any_newline_token_needs_stride(tmp_path):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(["<pad>", "<bos>", "<eos>", "<unk>", " ", "a", "b"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>",
                            pad_token="<pad>", unk_token="<unk>").save_pretrained(tmp_path)
    with pytest.raises(EngineError, match=r"no token containing '\\n\\n'; pass stride=N") as e:
        VLLMEngine(VLLMEngineConfig(model=str(TOY_POLICY), tokenizer=str(tmp_path)))
    assert "\n" not in str(e.value)
    with pytest.raises(EngineError, match="stride must be >= 1"):
        VLLMEngine(VLLMEngineConfig(model=str(TOY_POLICY), stride=0))


def test_hidden_states_of_a_scorer_free_run_or_unknown_trace_are_clear_errors(monkeypatch):
    monkeypatch.setattr(VLLMEngine, "_start", lambda self: None)  # no vLLM
    off = VLLMEngine(VLLMEngineConfig(model=str(TOY_POLICY), capture_hidden=False))
    with pytest.raises(EngineError, match="capture_hidden=False"):
        off.last_boundary(0)
    on = VLLMEngine(VLLMEngineConfig(model=str(TOY_POLICY)))
    with pytest.raises(EngineError, match="unknown trace 7"):
        on.last_boundary(7)
    assert on.boundary_ids == {BOUNDARY}


def test_request_ids_and_reasoning_state():
    rid = vi.make_request_id(12, 3, 40, closed=False)
    assert vi.parse_request_id(rid + "-ab12cd34") == (rid, 12, 3, 40, False, -1, False, -1, 0, False)
    assert vi.parse_request_id(rid) == vi.ReqKey(rid, 12, 3, 40, False)
    assert vi.parse_request_id("chat-1-ab12cd34") is None
    run = vi.make_request_id(12, 3, 40, closed=True, run_from=57, run_odd=True)
    assert vi.parse_request_id(run + "-0a1b2c3d") == (run, 12, 3, 40, True, 57, True, -1, 0, False)
    run = vi.make_request_id(1, 0, 5, closed=False, run_from=5)
    assert vi.parse_request_id(run + "-deadbeef") == (run, 1, 0, 5, False, 5, False, -1, 0, False)
    for v in ("0.26.0", "0.30.2", "0.32.0", "0.33.1"):
        assert vi.vllm_version_supported(v), v
    assert not vi.vllm_version_supported("0.34.0")
    assert not vi.vllm_version_supported("0.25.1")
    S, E = 90, 91
    assert not closed_after([1, 2, S, 5], S, E)
    assert closed_after([1, S, 5, E, 6], S, E)
    assert not closed_after([1, S, 5, E, 6, S, 7], S, E)  # re-opened
    assert closed_after([1, 5, E], None, E)
    assert not closed_after([1, 5, E], S, None)


# =========================================================================== fast: versions


class _SP026:
    """A stand-in for vLLM 0.26.0's SamplingParams (a msgspec Struct without
    ``stream_interval``)."""

    __struct_fields__ = ("temperature", "max_tokens", "seed", "output_kind")

    def __init__(self, **kw):
        unknown = set(kw) - set(self.__struct_fields__)
        if unknown:
            raise TypeError(f"Unexpected keyword argument {sorted(unknown)[0]!r}")
        self.kw = kw


@dataclasses.dataclass
class _SPDataclass:
    temperature: float = 1.0
    stream_interval: int | None = None


def test_sampling_params_drop_keywords_the_installed_vllm_lacks(caplog):
    vi.compat._SP_WARNED.discard("stream_interval")
    with caplog.at_level("WARNING"):
        sp = vi.sampling_params(_SP026, temperature=0.5, max_tokens=3, stream_interval=8)
        vi.sampling_params(_SP026, temperature=0.5, stream_interval=4)
    assert sp.kw == {"temperature": 0.5, "max_tokens": 3}
    warned = [r for r in caplog.records if "stream_interval" in r.getMessage()]
    assert len(warned) == 1  # once per process, not per request
    assert not vi.sampling_params_support("stream_interval", _SP026)
    # None is dropped silently; dataclass fields and plain signatures are read too
    assert vi.sampling_params(_SP026, seed=None, stream_interval=None).kw == {"seed": None}
    assert vi.sampling_params(_SPDataclass, stream_interval=2).stream_interval == 2
    assert vi.sampling_params_support("stream_interval", _SPDataclass)

    def plain(temperature=1.0):
        return temperature

    assert vi.sampling_params(plain, temperature=0.1, stream_interval=3) == 0.1


def test_sampling_params_of_the_installed_vllm():
    pytest.importorskip("vllm")
    import vllm

    sp = vi.sampling_params(temperature=0.7, max_tokens=5, stream_interval=None, seed=1)
    assert isinstance(sp, vllm.SamplingParams) and sp.max_tokens == 5
    if vllm.__version__.startswith("0.32"):
        assert vi.sampling_params_support("stream_interval")
    assert vi.vllm_version_supported(vllm.__version__)


def test_engine_metrics_are_read_from_the_engines_own_logger():
    """memory() must not read prometheus' global registry: a second engine in the process
    unregisters the first one's metrics there (seen on vLLM 0.26.0)."""
    import prometheus_client as prom

    reg = prom.CollectorRegistry()  # not the global one: the test leaves no metric behind

    def child(cls, name, value):
        m = cls(name, "x", ["engine"], registry=reg)
        c = m.labels("0")
        c.inc(value) if cls is prom.Counter else c.set(value)
        return {0: c}

    class PrometheusStatLogger:  # the slice of vLLM's the reader uses (by class name)
        pass

    lg = PrometheusStatLogger()
    vals = {"gauge_kv_cache_usage": 0.25, "gauge_scheduler_running": 9,
            "gauge_scheduler_waiting": 2, "counter_num_preempted_reqs": 3,
            "counter_prefix_cache_queries": 100, "counter_prefix_cache_hits": 64}
    for k, (attr, v) in enumerate(vals.items()):
        setattr(lg, attr, child(prom.Gauge if attr.startswith("gauge") else prom.Counter,
                                f"t{k}", v))
    eng = SimpleNamespace(logger_manager=SimpleNamespace(stat_loggers=[object(), lg]),
                          get_metrics=lambda: [])
    got = vi.engine_metrics(eng)
    assert got["vllm:num_requests_running"] == 9 and got["vllm:kv_cache_usage_perc"] == 0.25
    assert got["vllm:prefix_cache_hits"] == 64 and got["vllm:num_preemptions"] == 3
    # another layout: the global snapshot
    snap = [SimpleNamespace(name="vllm:num_requests_running", value=4.0)]
    other = SimpleNamespace(logger_manager=None, get_metrics=lambda: snap)
    assert vi.engine_metrics(other) == {"vllm:num_requests_running": 4.0}


# =========================================================================== fast: split boundaries

PIECES = ["a", "b", ".", "\n", "\n\n", "\n\n\n", "x\n", "\nx", "\nx\n", ".\n\n", " \n\n",
          "\n\nb", "<think>", "</think>"]


def _replay(texts, seqs_and_cuts, spec_kw=None):
    """Feed a worker RowCapture the rows vLLM would produce for each request (its prompt's
    last row, then one row per output token) and return the kept output indices per trace.
    ``seqs_and_cuts``: (trace, full token list, trace prompt len, [request starts]) where
    each request is a new incarnation whose prompt ends at the given start."""
    from gambit_search.boundary_vocab import run_classes

    rc = run_classes(texts)
    spec = vi.CaptureSpec(boundary_ids=[i for i, s in enumerate(texts) if "\n\n" in s],
                          run_start_ids=rc["start"], run_odd_ids=rc["odd"],
                          run_flip_ids=rc["flip"], run_keep_ids=rc["keep"], **(spec_kw or {}))
    cap = vi.RowCapture(spec)
    vocab = BoundaryVocab(runs=rc)
    for trace, seq, plen, text_start, starts in seqs_and_cuts:
        bounds = list(starts) + [len(seq)]
        for inc, (a, b) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
            run_from = max(plen, a - 1)
            odd = vocab.odd_run(seq, text_start, run_from)
            rid = vi.make_request_id(trace, inc, plen, False, run_from, odd) + "-abcdef12"
            for p in range(a - 1, b):
                cap.record([rid], torch.full((1, 2), float(p)), torch.tensor([p]),
                           torch.tensor([seq[p]]))
            # the extra row after a stop repeats the last position (async scheduling)
            cap.record([rid], torch.full((1, 2), float(b - 1)), torch.tensor([b - 1]),
                       torch.tensor([seq[b - 1]]))
    ids, pos, _, _ = vi.decode_rows(cap.drain())
    got: dict[int, set[int]] = {}
    for i, p in zip(ids, pos.tolist(), strict=True):
        got.setdefault(vi.parse_request_id(i).trace, set()).add(p)
    return got


def test_split_boundaries_equal_the_text_rule_with_revives_and_forks():
    """The worker's id-class rule equals the decoded-text rule (a new non-overlapping
    "\n\n" in the output), for plain traces, revived traces (new requests whose state comes
    in the id) and forks (whose output continues their parent's text)."""
    from gambit_search.boundary_vocab import text_boundaries

    rng = np.random.default_rng(0)
    weights = np.array([4, 3, 2, 6, 2, 1, 1, 1, 1, 1, 1, 1, 0, 0], dtype=float)
    weights /= weights.sum()
    jobs, want = [], {}
    for trace in range(60):
        plen = int(rng.integers(1, 5))
        prompt = [int(x) for x in rng.choice(len(PIECES), plen, p=weights)]
        out = [int(x) for x in rng.choice(len(PIECES), int(rng.integers(1, 40)), p=weights)]
        seq = prompt + out
        if trace % 3 == 2:  # a fork: its prompt holds its root's output up to the cut
            cut = int(rng.integers(0, len(out)))
            text_start, plen = len(prompt), len(prompt) + cut
        else:
            text_start = plen
        starts = sorted({plen, *(int(x) for x in rng.integers(plen, len(seq) + 1, 2))}) \
            if trace % 2 else [plen]
        jobs.append((trace, seq, plen, text_start, starts))
        ref = text_boundaries([PIECES[t] for t in seq[text_start:]])
        # a row is the state at its token, fed as the next token's input: the last token of
        # the sequence never gets one
        want[trace] = {text_start + j for j in ref if text_start + j >= plen} - {len(seq)}
    got = _replay(PIECES, jobs)
    for trace, *_ in jobs:
        assert got.get(trace, set()) == want[trace], trace
    assert sum(len(w) for w in want.values()) > 100


def test_split_boundaries_keep_the_toy_rule_and_can_be_switched_off():
    # the toy vocabulary's "\n\n" is one token (4): every boundary is one of those
    toy = ["<pad>", "<bos>", "<eos>", "<unk>", "\n\n"] + list("abcdefg") + ["\n"]
    seq = [1, 5, 4, 6, 4, 4, 7, 12, 8, 4, 12, 9, 2]
    got = _replay(toy, [(0, seq, 2, 2, [2])])[0]
    assert got == {2, 4, 5, 9}
    # "\n" then "\n" (never in the toy's training text: it merges them) counts too
    seq2 = [1, 5, 12, 12, 6, 6]
    assert _replay(toy, [(0, seq2, 2, 2, [2])])[0] == {3}
    off = vi.RowCapture(vi.CaptureSpec(boundary_ids=[4]))
    assert vi.row_filter._run_codes(off.spec) is None


def test_no_boundary_warning_is_given_once_per_engine(monkeypatch, tmp_path, caplog):
    pytest.importorskip("vllm")
    import gambit_search.vllm_engine as ve

    monkeypatch.setattr(ve, "NO_BOUNDARY_WARN_TOKENS", 5)
    eng = _stub_engine(monkeypatch, tmp_path, lambda seq: A)
    with caplog.at_level("WARNING", logger="gambit_search.vllm_delivery"):
        for k in range(3):
            eng.add_trace([1, A, A + k % 2], SamplingSpec(max_tokens=12))
        _collect(eng)
    msgs = [r.getMessage() for r in caplog.records if "without a thought boundary" in
            r.getMessage()]
    assert len(msgs) == 1 and "stride=N" in msgs[0]


# =========================================================================== fast: driver logic

THINK_VOCAB = ["<pad>", "<bos>", "<eos>", "<unk>", "\n\n", "<think>", "</think>", "a", "b"]
NL, TS, TE, A = 4, 5, 6, 7


def _think_tokenizer(path):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(THINK_VOCAB)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"\n\n|</?think>|[\s\S]"),
                                             behavior="isolated")
    tok.decoder = decoders.Fuse()
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>",
                            pad_token="<pad>", unk_token="<unk>").save_pretrained(path)
    return str(path)


class _LateEvent:
    """A CUDA-event stand-in that completes one record later (a GPU's deferred rows)."""

    def __init__(self):
        self.ready = False

    def query(self):
        return self.ready

    def synchronize(self):  # waiting completes it, as for a CUDA event
        self.ready = True


class LaggyCapture(vi.RowCapture):
    def _make_event(self, device_rows):
        for st in self._pending:
            st.event.ready = True
        return _LateEvent()


class StubLLMEngine:
    """Plays vLLM's LLMEngine for VLLMEngine's driver logic: one token per request per step
    from a script, and a real RowCapture fed the rows a model runner would produce (the row
    at position p is ``[p, token at p, ...]``)."""

    def __init__(self, script, spec: dict, d: int = 4, lag: bool = False):
        self.script, self.d = script, d
        self.cap = LaggyCapture(vi.CaptureSpec.from_dict(spec)) if lag else vi.RowCapture(
            vi.CaptureSpec.from_dict(spec))
        self.reqs: dict[str, dict] = {}

    def add_request(self, req_id, prompt, params):
        self.reqs[req_id] = {"seq": list(prompt["prompt_token_ids"]), "n": 0,
                             "max": params.max_tokens, "first": True}

    def abort_request(self, ids):
        for r in ids:
            self.reqs.pop(r, None)

    def has_unfinished_requests(self):
        return bool(self.reqs)

    def step(self):
        outs = []
        for rid, r in list(self.reqs.items()):
            seq = r["seq"]
            p = len(seq) - 1
            self.cap.record([rid + "-abcdefgh"], torch.tensor([[p, seq[p]] + [0] * (self.d - 2)],
                                                              dtype=torch.float32),
                            torch.tensor([p]), torch.tensor([seq[p]]))
            tok = self.script(seq)
            seq.append(tok)
            r["n"] += 1
            done = tok == 2 or r["n"] >= r["max"]
            comp = SimpleNamespace(token_ids=[tok], text=THINK_VOCAB[tok], logprobs=None,
                                   finish_reason=("stop" if tok == 2 else "length") if done
                                   else None)
            outs.append(SimpleNamespace(request_id=rid, outputs=[comp], finished=done,
                                        num_cached_tokens=0 if r["first"] else None))
            r["first"] = False
            if done:
                del self.reqs[rid]
        return outs

    def collective_rpc(self, name, args=()):
        assert name == "gambit_flush"
        return [self.cap.flush()]


def _stub_engine(monkeypatch, tmp_path, script, worker_think=True, lag=False):
    from gambit_search.vllm_runtime import VLLMRuntime

    def start(self):
        rows = vi.RowSink()
        spec = vi.CaptureSpec(**self._capture_fields(), sink=rows.address).__dict__
        if not worker_think:  # the driver-side filter alone
            spec = {**spec, "think_start": None, "think_end": None}
        facts = {"block_size": 4, "total_blocks": 100, "max_model_len": 64, "hidden_size": 4}
        self._rt = VLLMRuntime(StubLLMEngine(script, spec, lag=lag), facts, rows, spec)

    monkeypatch.setattr(VLLMEngine, "_start", start)
    return VLLMEngine(VLLMEngineConfig(model=str(TOY_POLICY),
                                       tokenizer=_think_tokenizer(tmp_path)))


def _collect(eng):
    evs = []
    while eng.has_unfinished():
        evs += eng.step().boundaries
    eng.step()
    return evs


@pytest.mark.parametrize("worker_think", [True, False])
def test_driver_keeps_boundaries_inside_the_reasoning_only(monkeypatch, tmp_path,
                                                           worker_think):
    pytest.importorskip("vllm")
    out = [A, NL, A, NL, A, TE, A, NL, A, NL, 2]

    def script(seq):
        k = len(seq) - 3
        return out[k]

    eng = _stub_engine(monkeypatch, tmp_path, script, worker_think)
    assert eng.boundary_ids == {NL}
    t = eng.add_trace([1, TS, A], SamplingSpec(max_tokens=20))
    evs = _collect(eng)
    assert [e.output_index for e in evs] == [1, 3]
    for e in evs:  # the row of the state at position p is [p, token, ...]
        assert e.hidden[0] == e.position and e.hidden[1] == NL
    assert eng.trace_info(t).output_ids == tuple(out)
    # a fork whose prompt already closed the reasoning captures nothing
    eng2 = _stub_engine(monkeypatch, tmp_path, lambda seq: NL if len(seq) < 12 else 2,
                        worker_think)
    c = eng2.add_trace([1, TS, A, TE, A], SamplingSpec(max_tokens=20))
    assert _collect(eng2) == [] and eng2.trace_info(c).finish_reason == "stop"


@pytest.mark.parametrize("lag", [False, True])
def test_driver_delivers_all_events_before_the_finishing_delta(monkeypatch, tmp_path, lag):
    pytest.importorskip("vllm")
    eng = _stub_engine(monkeypatch, tmp_path, lambda seq: NL if len(seq) % 3 == 0 else A,
                       lag=lag)
    spec = SamplingSpec(max_tokens=9)
    ts = [eng.add_trace([1, A, A], spec), eng.add_trace([1, A, A, A], spec)]
    done: set[int] = set()
    seen: dict[int, list[int]] = {t: [] for t in ts}
    for _ in range(40):
        if not eng.has_unfinished():
            break
        out = eng.step()
        for e in out.boundaries:
            assert e.trace not in done, "an event after the finishing delta"
            seen[e.trace].append(e.output_index)
        done |= {d.trace for d in out.deltas if d.finish_reason is not None}
    assert done == set(ts)
    for t in ts:
        out_ids = eng.trace_info(t).output_ids
        # every boundary but a last token, each once, all before the finish
        assert seen[t] == [j for j, x in enumerate(out_ids[:-1]) if x == NL]


def test_driver_evict_revive_drops_rows_of_undelivered_tokens(monkeypatch, tmp_path):
    pytest.importorskip("vllm")
    eng = _stub_engine(monkeypatch, tmp_path, lambda seq: NL if len(seq) % 2 else A)
    t = eng.add_trace([1, A, A], SamplingSpec(max_tokens=12))
    evs = []
    for _ in range(4):
        evs += eng.step().boundaries
    kept = eng.trace_info(t).output_ids
    eng.evict(t)
    eng.revive(t)
    evs += _collect(eng)
    info = eng.trace_info(t)
    assert info.output_ids[: len(kept)] == kept and len(info.output_ids) == 12
    idx = [e.output_index for e in evs]
    assert idx == sorted(set(idx))  # no duplicates, in order
    expect = [j for j, x in enumerate(info.output_ids[:-1]) if x == NL]
    assert idx == expect  # every fed boundary once, including the one fed by the revive
    seq = info.prompt_ids + info.output_ids
    for e in evs:
        assert seq[e.position] == NL and e.hidden[0] == e.position


# =========================================================================== fast: capture core


def _ids(n, plen=10, closed=False):
    return [vi.make_request_id(i, 0, plen, closed) + "-xxxxxxxx" for i in range(n)]


def test_row_capture_keeps_only_output_boundary_rows_of_gambit_requests():
    cap = vi.RowCapture(vi.CaptureSpec(boundary_ids=[4]))
    ids = _ids(2) + ["other-req-12345678"]
    d = 8
    # step 1: prompt rows (position 9 = last prompt token, which is a boundary: not output)
    cap.record(ids, torch.randn(3, d), torch.tensor([9, 9, 9]), torch.tensor([4, 4, 4]))
    # step 2: outputs 0 fed: request 0 boundary, request 1 plain, foreign boundary
    rows2 = torch.randn(3, d)
    cap.record(ids, rows2, torch.tensor([10, 10, 10]), torch.tensor([4, 7, 4]))
    got_ids, pos, tok, rows = vi.decode_rows(cap.drain())
    assert got_ids == [ids[0][:-9]] and pos.tolist() == [10] and tok.tolist() == [4]
    np.testing.assert_array_equal(rows[0], rows2[0].numpy())
    assert rows.dtype == np.float32
    assert cap.drain() is None


def test_row_capture_stride_reasoning_end_and_overflow():
    spec = vi.CaptureSpec(boundary_ids=[4], stride=3, think_start=90, think_end=91,
                          max_pending_steps=2)
    cap = vi.RowCapture(spec)
    ids = _ids(1, plen=5) + _ids(1, plen=5, closed=True)
    ids[1] = ids[1].replace("gambit-0", "gambit-1")
    seq = [7, 4, 7, 91, 4, 7, 7]  # output tokens fed in order (positions 5..11)
    for k, t in enumerate(seq):
        cap.record(ids, torch.full((2, 4), float(k)), torch.tensor([5 + k, 5 + k]),
                   torch.tensor([t, t]))
    got_ids, pos, tok, _ = vi.decode_rows(cap.drain())
    open_rows = [p for i, p in zip(got_ids, pos.tolist(), strict=True) if i.startswith(
        "gambit-0")]
    # boundary at output 1; stride hit at output 2; </think> at output 3 closes capture
    assert open_rows == [6, 7]
    assert not [i for i in got_ids if i.startswith("gambit-1")]  # closed from the start


def test_row_capture_pushes_ordered_messages_and_flush_is_a_barrier(tmp_path):
    import zmq

    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    addr = f"ipc://{tmp_path}/rows"
    pull.bind(addr)
    cap = vi.RowCapture(vi.CaptureSpec(boundary_ids=[4], sink=addr))
    ids = _ids(3, plen=2)
    for k in range(5):
        cap.record(ids, torch.full((3, 4), float(k)), torch.tensor([2 + k] * 3),
                   torch.tensor([4, 7, 4]))
    last, unsent = cap.flush()
    assert last == 5 and unsent == []
    seqs = []
    while pull.poll(2000):
        m = vi.decode_message(pull.recv())
        seqs.append(m.seq)
        # every Gambit row's (trace, incarnation, position); the boundary rows' data
        assert m.trace.tolist() == [0, 1, 2] and m.inc.tolist() == [0, 0, 0]
        assert m.pos.tolist() == [m.seq + 1] * 3 and m.keep.tolist() == [0, 2]
        assert [g[:8] for g in m.ids] == ["gambit-0", "gambit-2"]
        assert m.rows.shape == (2, 4) and m.rows[0, 0] == m.seq - 1
        if m.seq == last:
            break
    assert seqs == [1, 2, 3, 4, 5]
    cap.close()
    pull.close(linger=0)
    ctx.term()


class _StandInMRV2:
    """The slice of vllm.v1.worker.gpu.model_runner.GPUModelRunner the capture relies on."""

    def __init__(self):
        self.calls = 0

    def sample(self, hidden_states, input_batch, grammar_output):
        self.calls += 1
        return "sampled", hidden_states[input_batch.logits_indices].sum().item()


def test_mrv2_capture_on_a_stand_in_runner():
    runner = _StandInMRV2()
    cap = vi.RowCapture(vi.CaptureSpec(boundary_ids=[4]))
    assert vi.install_capture(runner, cap, kind="mrv2") == "mrv2"
    ids = _ids(2, plen=3)
    d = 6
    # a prefill step (request 0: 3 tokens, request 1: 3 tokens) then two decode steps
    hs = torch.randn(6, d)
    batch = SimpleNamespace(req_ids=ids, num_reqs=2, num_draft_tokens=0,
                            logits_indices=torch.tensor([2, 5]),
                            positions=torch.tensor([0, 1, 2, 0, 1, 2]),
                            input_ids=torch.tensor([1, 9, 9, 1, 9, 9]))
    assert runner.sample(hs, batch, None)[0] == "sampled"
    outs = [[4, 7], [7, 4]]  # output tokens fed at positions 3 and 4
    kept = []
    for k, toks in enumerate(outs):
        hs = torch.randn(2, d)
        batch = SimpleNamespace(req_ids=ids, num_reqs=2, num_draft_tokens=0,
                                logits_indices=torch.tensor([0, 1]),
                                positions=torch.tensor([3 + k, 3 + k]),
                                input_ids=torch.tensor(toks))
        runner.sample(hs, batch, None)
        kept.append(hs)
    # a speculative step is skipped, not mis-assigned
    runner.sample(torch.randn(4, d), SimpleNamespace(
        req_ids=ids, num_reqs=2, num_draft_tokens=2, logits_indices=torch.arange(4),
        positions=torch.arange(4), input_ids=torch.full((4,), 4)), None)
    got_ids, pos, tok, rows = vi.decode_rows(cap.drain())
    assert [(i[:8], p) for i, p in zip(got_ids, pos.tolist(), strict=True)] == [
        ("gambit-0", 3), ("gambit-1", 4)]
    np.testing.assert_array_equal(rows[0], kept[0][0].numpy())
    np.testing.assert_array_equal(rows[1], kept[1][1].numpy())
    assert runner.calls == 4
    vi.uninstall_capture(runner)
    assert "sample" not in vars(runner) and runner.sample(hs, batch, None)


class _StandInMRV1:
    """The slice of vllm.v1.worker.gpu_model_runner.GPUModelRunner the capture relies on."""

    def __init__(self, n_tokens=16, d=5):
        self.d = d
        self.model = SimpleNamespace(compute_logits=lambda h: h @ torch.ones(d, 3))
        self.input_batch = SimpleNamespace(req_ids=[], num_reqs=0)
        self.query_start_loc = SimpleNamespace(gpu=torch.zeros(9, dtype=torch.int32))
        self.positions = torch.zeros(n_tokens, dtype=torch.int64)
        self.input_ids = SimpleNamespace(gpu=torch.zeros(n_tokens, dtype=torch.int32))

    def execute_model(self, req_ids, n_sched, pos0, toks, hidden):
        n = len(req_ids)
        self.input_batch.req_ids, self.input_batch.num_reqs = req_ids, n
        qsl = np.concatenate([[0], np.cumsum(n_sched)])
        self.query_start_loc.gpu[: n + 1] = torch.tensor(qsl)
        flat_pos = np.concatenate([np.arange(p, p + s) for p, s in zip(pos0, n_sched,
                                                                       strict=True)])
        self.positions[: len(flat_pos)] = torch.tensor(flat_pos)
        self.input_ids.gpu[: len(toks)] = torch.tensor(toks)
        return self.model.compute_logits(hidden[torch.tensor(qsl[1:] - 1)])


def test_mrv1_capture_on_a_stand_in_runner():
    runner = _StandInMRV1()
    cap = vi.RowCapture(vi.CaptureSpec(boundary_ids=[4]))
    assert vi.install_capture(runner, cap, kind="mrv1") == "mrv1"
    ids = _ids(2, plen=3)
    # request 0 decodes output 0 (a boundary, position 3); request 1 prefills 3 tokens
    hidden = torch.randn(4, runner.d)
    runner.execute_model(ids, [1, 3], [3, 0], [4, 1, 9, 4], hidden)
    runner.model.compute_logits(torch.randn(2, runner.d))  # an unarmed call: ignored
    got_ids, pos, tok, rows = vi.decode_rows(cap.drain())
    assert [i[:8] for i in got_ids] == ["gambit-0"] and pos.tolist() == [3]
    np.testing.assert_array_equal(rows[0], hidden[0].numpy())
    vi.uninstall_capture(runner)
    assert "execute_model" not in vars(runner)


def test_runner_contracts_match_the_installed_vllm():
    """What the hooks read exists, under these names, in the installed vLLM (MRV2 cannot run
    on a CPU build: this pins its source-level contract)."""
    pytest.importorskip("vllm")
    import vllm.v1.worker.gpu_model_runner as mrv1
    from vllm.v1.worker.gpu.input_batch import InputBatch
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner as MRV2

    assert list(inspect.signature(MRV2.sample).parameters) == [
        "self", "hidden_states", "input_batch", "grammar_output"]
    fields = {f.name for f in dataclasses.fields(InputBatch)}
    assert {"req_ids", "num_reqs", "logits_indices", "positions", "input_ids",
            "num_draft_tokens"} <= fields
    assert "self.sample(" in inspect.getsource(MRV2.sample_tokens)
    src = inspect.getsource(mrv1.GPUModelRunner)
    for needle in ("self.input_ids = self._make_buffer", "self.positions = torch.zeros",
                   "self.query_start_loc = self._make_buffer",
                   "logits_indices = query_start_loc[1:] - 1",
                   "logits = self.model.compute_logits(sample_hidden_states)"):
        assert needle in src, needle
    assert vi.runner_kind(object.__new__(mrv1.GPUModelRunner)) == "mrv1"
    assert vi.runner_kind(object.__new__(MRV2)) == "mrv2"


def test_the_worker_extension_resolves_by_its_path_without_clashing():
    """vLLM's worker imports the extension by the dotted path Gambit passes, and refuses
    one whose attributes collide with the worker's: every public name is gambit_-prefixed."""
    pytest.importorskip("vllm")
    from vllm.utils.import_utils import resolve_obj_by_qualname
    from vllm.v1.worker.gpu_worker import Worker

    cls = resolve_obj_by_qualname(vi.WORKER_EXTENSION)
    assert cls is vi.GambitWorkerExtension
    names = [a for a in dir(cls) if not a.startswith("__")]
    assert names and all(a.startswith("gambit_") for a in names), names
    assert not [a for a in names if hasattr(Worker, a)]


# =========================================================================== slow: real engine


@pytest.mark.slow
def test_boundary_states_equal_transformers_last_hidden_state(engine, toy_hf_model,
                                                             toy_tokenizer):
    assert engine.runner_kind == "mrv1" and engine.hidden_size == 128
    prompts = toy_prompts(toy_tokenizer, 8)
    engine.stream_interval = 4  # half the traces get their tokens in batches of 4
    try:
        ids = [engine.add_trace(p, SamplingSpec(temperature=1.0, max_tokens=64), seed=k)
               for k, p in enumerate(prompts[:4])]
    finally:
        engine.stream_interval = 1
    ids += [engine.add_trace(p, SamplingSpec(temperature=1.0, max_tokens=64), seed=k)
            for k, p in enumerate(prompts[4:])]
    tokens, _, events, _ = run(engine)
    n_checked = 0
    for t in ids:
        info = engine.trace_info(t)
        assert info.finish_reason in ("stop", "length")
        seq = list(info.prompt_ids) + list(info.output_ids)
        hs, _ = hf_states(toy_hf_model, seq)
        ev = events[t]
        # every "\n\n" of the output gets an event, except as the last token (never fed)
        assert [e.output_index for e in ev] == [j for j, x in enumerate(info.output_ids[:-1])
                                               if x == BOUNDARY]
        for e in ev:
            assert e.position == len(info.prompt_ids) + e.output_index
            assert e.hidden.dtype == np.float32 and e.hidden.shape == (128,)
            assert rel_err(e.hidden, hs[e.position]) <= 1e-3
            n_checked += 1
        assert engine.last_boundary(t).output_index == ev[-1].output_index
    assert n_checked >= 30


@pytest.mark.slow
def test_fork_reuses_the_prefix_and_continues_from_it(engine, toy_hf_model, toy_tokenizer):
    p = engine.add_trace(toy_prompts(toy_tokenizer, 1)[0],
                         SamplingSpec(temperature=1.0, top_k=20, max_tokens=300), seed=3)
    while len(engine.trace_info(p).output_ids) < 45:
        engine.step()
    parent = engine.trace_info(p)
    prefix = list(parent.prompt_ids) + list(parent.output_ids)
    greedy = engine.fork(p, temperature_multiplier=0.0, seed=1)
    sampled = engine.fork(p, temperature_multiplier=1.0, seed=2)
    tokens, _, events, first = run(engine)
    bs = engine.block_size
    for c in (greedy, sampled):
        info = engine.trace_info(c)
        assert info.prompt_ids == tuple(prefix) and info.parent == p
        cached = first[c].num_cached_tokens
        assert len(prefix) - bs <= cached < len(prefix)  # at most one block recomputed
        assert info.finish_reason == "stop" and tokens[c] == list(info.output_ids)
        seq = prefix + list(info.output_ids)
        hs, logits = hf_states(toy_hf_model, seq)
        rows = logits[len(prefix) - 1 : len(seq) - 1]
        chosen = rows[np.arange(len(info.output_ids)), list(info.output_ids)]
        if c == greedy:  # temperature 0: every token is transformers' argmax
            assert np.all(chosen >= rows.max(axis=1) - 1e-4)
        else:  # top_k=20: every token lies in transformers' top 20
            kth = np.sort(rows, axis=1)[:, -20]
            assert np.all(chosen >= kth - 1e-4)
        for e in events.get(c, []):
            assert rel_err(e.hidden, hs[e.position]) <= 1e-3


@pytest.mark.slow
def test_abort_frees_kv(engine, toy_tokenizer):
    spec = SamplingSpec(temperature=1.0, max_tokens=400, ignore_eos=True)
    ts = [engine.add_trace(p, spec, seed=k) for k, p in enumerate(toy_prompts(toy_tokenizer,
                                                                              9))]
    for _ in range(60):
        engine.step()
    busy = engine.memory()
    assert busy.num_running == 9 and busy.kv_usage > 0
    for t in ts[1:]:
        engine.abort(t)
    n_before = {t: len(engine.trace_info(t).output_ids) for t in ts}
    for _ in range(3):
        out = engine.step()
        assert {d.trace for d in out.deltas} <= {ts[0]}
    after = engine.memory()
    assert after.num_running == 1
    used_busy = busy.total_blocks - busy.free_blocks
    used_after = after.total_blocks - after.free_blocks
    assert used_after <= used_busy / 9 + 2
    for t in ts[1:]:
        info = engine.trace_info(t)
        assert info.status is TraceStatus.ABORTED and len(info.output_ids) == n_before[t]


@pytest.mark.slow
def test_evict_then_revive_continues_the_same_trace(engine, toy_tokenizer):
    prompt = toy_prompts(toy_tokenizer, 1)[0]
    spec = SamplingSpec(temperature=0.0, max_tokens=300)
    events: dict[int, list] = {}

    def step():
        for e in engine.step().boundaries:
            events.setdefault(e.trace, []).append(e)

    ref = engine.add_trace(prompt, spec)  # the same greedy trace, never evicted
    t = engine.add_trace(prompt, spec)
    for _ in range(50):
        step()
    kept = engine.trace_info(t).output_ids
    engine.evict(t)
    assert engine.trace_info(t).status is TraceStatus.EVICTED
    with pytest.raises(EngineError, match="cannot evict"):
        engine.evict(t)
    step()
    assert engine.trace_info(t).output_ids == kept  # a ghost keeps its tokens
    engine.revive(t)
    while engine.has_unfinished():
        step()
    step()
    info, rinfo = engine.trace_info(t), engine.trace_info(ref)
    assert info.incarnation == 1 and info.output_ids[: len(kept)] == kept
    # greedy: the revived trace ends exactly where the uninterrupted one did
    assert info.output_ids == rinfo.output_ids and info.finish_reason == "stop"
    assert info.num_cached_tokens >= len(prompt) + len(kept) - engine.block_size
    # and has the same boundary states (the one at the eviction point is recomputed)
    assert [e.output_index for e in events[t]] == [e.output_index for e in events[ref]]
    for a, b in zip(events[t], events[ref], strict=True):
        assert rel_err(a.hidden, b.hidden) <= 1e-3


@pytest.mark.slow
def test_256_concurrent_traces_complete_and_deltas_reassemble(engine, toy_tokenizer):
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    prompts = toy_prompts(toy_tokenizer, 64)
    spec = SamplingSpec(temperature=1.0, top_p=1.0, top_k=0, max_tokens=96)
    jobs = [(p, 1000 + 4 * q + r) for q, p in enumerate(prompts) for r in range(4)]
    ids = [engine.add_trace(p, spec, seed=s) for p, s in jobs]
    peak = 0
    tokens: dict[int, list[int]] = {}
    texts: dict[int, str] = {}
    n_events = 0
    while engine.has_unfinished():
        out = engine.step()
        for d in out.deltas:
            tokens.setdefault(d.trace, []).extend(d.token_ids)
            texts[d.trace] = texts.get(d.trace, "") + d.text
        n_events += len(out.boundaries)
        peak = max(peak, engine.memory().num_running)
    assert peak == 256
    assert n_events > 256 * 5
    for t in ids:
        info = engine.trace_info(t)
        assert info.finish_reason in ("stop", "length")
        assert tokens[t] == list(info.output_ids)
        assert texts[t] == toy_tokenizer.decode(tokens[t], skip_special_tokens=True)
    # the same requests through plain vLLM give the same token ids
    plain = engine.llm.generate(
        [TokensPrompt(prompt_token_ids=p) for p, _ in jobs],
        [SamplingParams(temperature=1.0, top_p=1.0, top_k=0, max_tokens=96, seed=s)
         for _, s in jobs], use_tqdm=False)
    same = sum(list(o.outputs[0].token_ids) == tokens[t] for o, t in zip(plain, ids,
                                                                        strict=True))
    assert same == 256


@pytest.mark.slow
def test_catch_up_after_a_pause_gives_one_delta_per_trace(engine, toy_tokenizer, monkeypatch):
    """With ``catch_up`` a ``step`` after the driver was away takes every engine-core step
    that piled up, and still hands out one delta per trace (their tokens in order): CI saw
    several per trace before ``merge_deltas``, when the machine was slow."""
    import time

    monkeypatch.setattr(engine, "catch_up", True)
    spec = SamplingSpec(temperature=1.0, top_p=1.0, top_k=0, max_tokens=48)
    ids = [engine.add_trace(p, spec, seed=7 + k)
           for k, p in enumerate(toy_prompts(toy_tokenizer, 8))]
    tokens: dict[int, list[int]] = {}
    last_pos: dict[int, int] = {}
    before, multi = engine.timing["caught_up"], 0
    while engine.has_unfinished():
        time.sleep(0.3)  # the engine core steps on meanwhile
        out = engine.step()
        per = [d.trace for d in out.deltas]
        assert len(per) == len(set(per)), "at most one delta per trace per step"
        multi += sum(len(d.token_ids) > 1 for d in out.deltas)
        for d in out.deltas:
            tokens.setdefault(d.trace, []).extend(d.token_ids)
        for ev in out.boundaries:
            assert ev.position > last_pos.get(ev.trace, -1)
            last_pos[ev.trace] = ev.position
    assert engine.timing["caught_up"] > before and multi > 0, "the pause let steps pile up"
    for t in ids:
        assert tokens[t] == list(engine.trace_info(t).output_ids)


@pytest.mark.slow
def test_overlong_prompt_fails_only_that_trace_and_logprobs(engine, toy_tokenizer,
                                                           toy_hf_model):
    good = engine.add_trace(toy_prompts(toy_tokenizer, 1)[0],
                            SamplingSpec(temperature=1.0, max_tokens=40, logprobs=5), seed=9)
    bad = engine.add_trace([1] + [20] * 600, SamplingSpec(max_tokens=10))
    edge = engine.add_trace([1] + [20] * (engine.max_model_len - 1), SamplingSpec())
    out = engine.step()
    errs = {d.trace: d for d in out.deltas if d.finish_reason == "error"}
    assert set(errs) == {bad, edge}
    assert "\n" not in errs[bad].error and "512" in errs[bad].error
    # the first step may already carry the good trace's first token (a fresh engine does)
    lps = [lp for d in out.deltas if d.trace == good for lp in d.logprobs]
    while engine.has_unfinished():
        out = engine.step()
        lps += [lp for d in out.deltas if d.trace == good for lp in d.logprobs]
    info = engine.trace_info(good)
    assert info.finish_reason == "length" and len(lps) == len(info.output_ids) == 40
    assert engine.trace_info(bad).status is TraceStatus.FINISHED
    # top-5 log-probabilities = transformers' log-softmax of the raw logits
    seq = list(info.prompt_ids) + list(info.output_ids)
    _, logits = hf_states(toy_hf_model, seq)
    logp = torch.log_softmax(torch.tensor(logits), -1).numpy()
    for j, lp in enumerate(lps):
        row = logp[len(info.prompt_ids) - 1 + j]
        assert lp.token_id == info.output_ids[j] and len(lp.top_logprobs) == 5
        assert list(lp.top_logprobs) == sorted(lp.top_logprobs, reverse=True)
        np.testing.assert_allclose(lp.top_logprobs, np.sort(row)[::-1][:5], atol=1e-3)
        assert abs(lp.logprob - row[lp.token_id]) <= 1e-3
    with pytest.raises(EngineError, match="unknown trace 123456"):
        engine.last_boundary(123456)
    with pytest.raises(EngineError, match="cannot fork"):
        engine.fork(bad)


@pytest.mark.slow
def test_logprobs_zero_returns_the_sampled_token_only(engine, toy_tokenizer, toy_hf_model):
    """``logprobs=0`` (what the harvest asks for): no top-k, the sampled token's log-prob exact,
    also when tokens arrive in batches (stream_interval > 1)."""
    engine.stream_interval = 4
    try:
        t = engine.add_trace(toy_prompts(toy_tokenizer, 1)[0],
                             SamplingSpec(temperature=1.0, max_tokens=30, logprobs=0), seed=3)
    finally:
        engine.stream_interval = 1
    lps = []
    while engine.has_unfinished():
        lps += [lp for d in engine.step().deltas if d.trace == t for lp in d.logprobs]
    info = engine.trace_info(t)
    assert len(lps) == len(info.output_ids) > 0
    seq = list(info.prompt_ids) + list(info.output_ids)
    _, logits = hf_states(toy_hf_model, seq)
    logp = torch.log_softmax(torch.tensor(logits), -1).numpy()
    for j, lp in enumerate(lps):
        assert lp.token_id == info.output_ids[j] and lp.top_logprobs == () and lp.top_ids == ()
        assert abs(lp.logprob - logp[len(info.prompt_ids) - 1 + j][lp.token_id]) <= 1e-3


def test_sampled_logprobs_tracker_gathers_the_previous_steps_row():
    """Unit: the value for row (r, p) is log_softmax(logits of r's row at p-1)[input token]."""
    tr = vi.SampledLogprobs()
    g = torch.Generator().manual_seed(0)
    l0 = torch.randn(2, 7, generator=g)
    first = tr.step(["a", "b"], torch.tensor([5, 9]), torch.tensor([1, 2]), l0)
    assert torch.isnan(first).all()  # nothing before a request's first step
    l1 = torch.randn(3, 7, generator=g)
    # a: next position (known); c: new (unknown); b: a recomputed position (unknown)
    got = tr.step(["c", "a", "b"], torch.tensor([3, 6, 9]), torch.tensor([0, 4, 6]), l1)
    want_a = torch.log_softmax(l0[0], -1)[4]
    assert torch.isnan(got[0]) and torch.isnan(got[2])
    assert torch.allclose(got[1], want_a)
    got = tr.step(["a"], torch.tensor([7]), torch.tensor([3]), torch.randn(1, 7, generator=g))
    assert torch.allclose(got[0], torch.log_softmax(l1[1], -1)[3])


def test_row_capture_ships_logprobs_only_when_asked():
    ids = _ids(2)
    l0 = torch.randn(2, 8)

    def messages(logprobs: bool, second_logits: torch.Tensor | None):
        cap = vi.RowCapture(vi.CaptureSpec(boundary_ids=[BOUNDARY], logprobs=logprobs))
        cap.record(ids, torch.randn(2, 4), torch.tensor([10, 11]), torch.tensor([3, 3]), l0)
        cap.record(ids, torch.randn(2, 4), torch.tensor([11, 12]), torch.tensor([5, BOUNDARY]),
                   second_logits)
        return [vi.decode_message(b) for b in cap.flush()[1]]  # no sink: all unsent

    assert all(m.lp is None for m in messages(False, torch.randn(2, 8)))
    first, second = messages(True, torch.randn(2, 8))
    assert np.isnan(first.lp).all()  # nothing before a request's first step
    want = torch.log_softmax(l0, -1)[[0, 1], [5, BOUNDARY]].numpy()
    np.testing.assert_allclose(second.lp, want, rtol=1e-6)
    # a step without logits (a stand-in runner) still ships its rows, log-probs unknown
    first, second = messages(True, None)
    assert np.isnan(second.lp).all() and len(second.keep) == 1


@pytest.mark.slow
def test_sampled_logprobs_equal_vllms_and_transformers(engine, toy_tokenizer, toy_hf_model):
    """The hook's log-probs (what the harvest records) equal vLLM's ``logprobs=0`` values and
    transformers' log_softmax, for plain, forked and evicted-then-revived traces."""
    prompts = toy_prompts(toy_tokenizer, 2)
    spec = SamplingSpec(temperature=1.0, top_p=1.0, top_k=0, max_tokens=80, logprobs=0)
    engine.stream_interval = 4
    try:
        plain = engine.add_trace(prompts[0], spec, seed=11)
        ev = engine.add_trace(prompts[1], spec, seed=12)
        delta_lps: dict[int, list[float]] = {}

        def step():
            for d in engine.step().deltas:
                delta_lps.setdefault(d.trace, []).extend(lp.logprob for lp in d.logprobs or ())

        for _ in range(12):
            step()
        child = engine.fork(plain, seed=13)
        engine.evict(ev)
        step()
        engine.revive(ev)
        while engine.has_unfinished():
            step()
        engine.step()
    finally:
        engine.stream_interval = 1
    for t in (plain, child, ev):
        info = engine.trace_info(t)
        got = engine.sampled_logprobs(t)
        assert got.shape == (len(info.output_ids),) and got.dtype == np.float32
        unknown = np.isnan(got)
        # the last token is never fed back; a revive re-prefills one token of the old request
        assert unknown.sum() <= (2 if t == ev else 1) and not unknown[: len(got) - 1].all()
        seq = list(info.prompt_ids) + list(info.output_ids)
        _, logits = hf_states(toy_hf_model, seq)
        ref = torch.log_softmax(torch.tensor(logits), -1).numpy()
        for j in np.nonzero(~unknown)[0]:
            assert abs(got[j] - ref[len(info.prompt_ids) - 1 + j][info.output_ids[j]]) <= 1e-3
        if t == plain:  # vLLM's own logprob path gives the same numbers (before the fork)
            v = np.asarray(delta_lps[t], dtype=np.float32)
            assert np.abs(got[~unknown] - v[~unknown]).max() <= 1e-4
    engine.release(plain)
    with pytest.raises(EngineError, match="unknown trace"):
        engine.sampled_logprobs(plain)


def test_sampled_logprobs_need_the_capture():
    with pytest.raises(EngineError, match="capture_hidden"):
        VLLMEngine(VLLMEngineConfig(model=str(TOY_POLICY), capture_hidden=False,
                                    sampled_logprobs=True))


def test_sampled_logprobs_fast_path_for_the_same_rows_equals_the_general_one():
    """Unit: a step with the same requests in the same rows (the gather fast path) gives the
    values the general row-matching path gives, NaN at a recomputed position included."""
    g = torch.Generator().manual_seed(1)
    logits = [torch.randn(3, 11, generator=g) for _ in range(3)]
    steps = [(torch.tensor([4, 8, 2]), torch.tensor([1, 2, 3])),
             (torch.tensor([5, 9, 2]), torch.tensor([7, 10, 0])),  # row 2 recomputed
             (torch.tensor([6, 10, 3]), torch.tensor([3, 5, 6]))]
    fast = vi.SampledLogprobs()
    got = [fast.step(["a", "b", "c"], p, t, lg) for (p, t), lg in zip(steps, logits, strict=True)]
    for k in (1, 2):
        want = torch.log_softmax(logits[k - 1], -1)[[0, 1, 2], steps[k][1]]
        if k == 1:
            want[2] = float("nan")
        torch.testing.assert_close(got[k], want, equal_nan=True)
    slow = vi.SampledLogprobs()  # a reordered batch takes the general path
    slow.step(["a", "b", "c"], *steps[0], logits[0])
    perm = [2, 0, 1]
    got2 = slow.step(["c", "a", "b"], steps[1][0][perm], steps[1][1][perm], logits[1][perm])
    torch.testing.assert_close(got2, got[1][perm], equal_nan=True)


def test_a_trace_that_does_not_stream_asks_vllm_for_its_final_output_only():
    """``SamplingSpec(stream=False)`` (the harvest) maps to vLLM's FINAL_ONLY, the default
    to DELTA: vLLM then builds no per-step request output for such a trace."""
    from vllm.sampling_params import RequestOutputKind

    from gambit_search._vllm_internals.compat import request_params
    from gambit_search.engine import SamplingSpec

    kinds = {s: request_params(SamplingSpec(max_tokens=8, stream=s), seed=1, max_tokens=8,
                               stream_interval=1, detokenize=False).output_kind
             for s in (True, False)}
    assert kinds == {True: RequestOutputKind.DELTA, False: RequestOutputKind.FINAL_ONLY}
