"""A scripted, deterministic :class:`~gambit_search.engine.Engine` for fast algorithm tests.

No model and no vLLM: tokens come from a policy function of (sequence so far, seed), the
hidden state at a position is a pseudo-random vector keyed by the whole prefix up to it (so
a fork sees exactly its parent's states, as with a real model), and KV memory is a small
block manager that mimics vLLM's (:mod:`gambit_search.fake_kv`): fixed-size blocks, a prefix
cache over full blocks with an LRU free queue, at least one token recomputed per request,
preemption of the newest running request when a decode step finds no free block (recomputed
later, never swapped). Traces live in the shared :mod:`gambit_search.trace_table`, as the
vLLM engine's do. The run queues are ordered sets of requests: a step costs O(its requests)
(``tests/test_bookkeeping.py`` checks its order against the list-based original).

Timing mirrors the vLLM adapter: every running request gets one token per :meth:`step`; the
state at an output token is emitted in the step that feeds that token back, i.e. one step
after it was sampled, and never for a token after which the request stopped.

    from gambit_search.fake_engine import FakeEngine, FakeEngineConfig
    eng = FakeEngine(FakeEngineConfig(num_blocks=64))
    t = eng.add_trace([1, 10, 11], SamplingSpec(max_tokens=50), seed=3)
    outs = eng.run_to_completion()

Token ids: 0 pad, 1 bos, 2 eos, 3 ``</think>`` (only emitted when ``think_end_id`` is set),
4 the boundary "\\n\\n", 5.. plain text. :meth:`FakeEngine.decode` renders ids as text.
"""

from __future__ import annotations

import functools
import random
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from gambit_search.engine import (
    BoundaryEvent,
    Delta,
    EngineError,
    MemorySnapshot,
    SamplingSpec,
    StepOutput,
    TokenLogprobs,
    TraceId,
    TraceStatus,
)
from gambit_search.fake_kv import BlockPool, block_hashes
from gambit_search.trace_table import TableEngine, TraceRecord, TraceTable

__all__ = ["FakeEngine", "FakeEngineConfig", "thought_policy"]

EOS, THINK_END, BOUNDARY, FIRST_TEXT = 2, 3, 4, 5

Policy = Callable[[Sequence[int], int], int]
"""(full sequence so far, request seed) -> next token id."""


def thought_policy(
    vocab_size: int = 64,
    thought_len: tuple[int, int] = (3, 8),
    num_thoughts: tuple[int, int] = (2, 6),
    think_end: bool = False,
) -> Policy:
    """The default policy: thoughts of ``thought_len`` text tokens, each closed by a boundary
    token; after ``num_thoughts`` boundaries in the sequence (optionally a ``</think>``, then
    one more text token) EOS. Pure in (sequence, seed)."""

    @functools.lru_cache(maxsize=65536)
    def goal_of(seed: int) -> int:
        return random.Random(seed).randint(*num_thoughts)

    def policy(seq: Sequence[int], seed: int) -> int:
        rng = random.Random(hash((seed, len(seq))))
        n_b = seq.count(BOUNDARY)
        since = 0  # tokens after the last boundary (all of them when there is none)
        for t in reversed(seq):
            if t == BOUNDARY:
                break
            since += 1
        goal = goal_of(seed)
        if n_b >= goal:
            if think_end and THINK_END not in seq:
                return THINK_END
            return EOS if since >= 1 else rng.randrange(FIRST_TEXT, vocab_size)
        if since >= rng.randint(*thought_len):
            return BOUNDARY
        return rng.randrange(FIRST_TEXT, vocab_size)

    return policy


@dataclass(frozen=True)
class FakeEngineConfig:
    """Shape, memory and policy of a :class:`FakeEngine`."""

    vocab_size: int = 64
    """Token ids are 0..vocab_size-1."""
    hidden_size: int = 16
    """Length of every hidden-state vector."""
    block_size: int = 4
    """Tokens per KV block."""
    num_blocks: int = 1024
    """KV blocks in all."""
    max_model_len: int = 512
    """Longest sequence; a longer prompt fails its trace."""
    max_num_seqs: int = 256
    """Most requests running at once; the rest wait."""
    capture_hidden: bool = True
    """Emit boundary events (False: a scorer-free run)."""
    boundary_ids: tuple[int, ...] = (BOUNDARY,)
    """Tokens that end a thought."""
    stride: int | None = None
    """Also emit the state after every N output tokens."""
    think_end_id: int | None = None
    """No boundary is emitted after this token (set 3 to model ``</think>``)."""
    seed: int = 0
    """Seeds of traces added without one derive from it."""
    policy: Policy | None = None
    """Next-token function; None: :func:`thought_policy` (with ``</think>`` when
    ``think_end_id`` is set)."""


@dataclass(eq=False)
class _Req:
    """One request on the engine: a trace's current incarnation. Compared and hashed by
    identity (``eq=False``): the run queues are ordered sets of requests, and a generated
    ``__eq__`` would compare every field (the trace's included) on each lookup."""

    trace: _FTrace
    seq: list[int]  # prompt of this request + tokens generated by it
    prompt_len: int  # of this request
    seed: int
    max_tokens: int
    arrival: int
    blocks: list[int] = field(default_factory=list)
    generated: int = 0
    computed: int = 0  # tokens whose KV exists
    first: bool = True
    cached: int = 0
    hashes: list[int] = field(default_factory=list)  # of seq's full blocks, while admitted


@dataclass
class _FTrace(TraceRecord):
    req: _Req | None = None  # the live request (None: evicted or done)


class FakeEngine(TableEngine[_FTrace]):
    """Scripted :class:`Engine`; see the module docstring."""

    def __init__(self, config: FakeEngineConfig | None = None) -> None:
        self.config = self._facts = cfg = config or FakeEngineConfig()
        if cfg.capture_hidden and not cfg.boundary_ids and cfg.stride is None:
            raise EngineError("capture_hidden needs boundary_ids or stride")
        if cfg.stride is not None and cfg.stride < 1:
            raise EngineError(f"stride must be >= 1, got {cfg.stride}")
        self.policy: Policy = cfg.policy or thought_policy(
            cfg.vocab_size, think_end=cfg.think_end_id is not None)
        self._pool = BlockPool(cfg.num_blocks, cfg.block_size)
        self._traces: TraceTable[_FTrace] = TraceTable()
        # ordered sets of requests, O(1) membership and removal; `_running` in admission
        # order, `_waiting` FIFO with preempted requests put back at its front
        self._running: dict[_Req, None] = {}
        self._waiting: OrderedDict[_Req, None] = OrderedDict()
        self._errors: list[Delta] = []
        self._arrivals = 0
        self._preemptions = 0
        self._pc_queries = 0
        self._pc_hits = 0
        self._boundary = frozenset(cfg.boundary_ids)
        self.steps = 0

    # -- facts --------------------------------------------------------------------------------
    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``: boundary "\\n\\n", ``</think>``, EOS "", others "t<id> "."""
        parts = []
        for i in ids:
            if i in self._boundary:
                parts.append("\n\n")
            elif i == THINK_END:
                parts.append("</think>")
            elif i > EOS:
                parts.append(f"t{i} ")
        return "".join(parts)

    def hidden_at(self, seq: Sequence[int], position: int) -> np.ndarray:
        """The state at ``position`` of ``seq``: a function of ``seq[: position + 1]`` only."""
        rng = np.random.default_rng(abs(hash(tuple(seq[: position + 1]))) % (2**63))
        return rng.standard_normal(self.config.hidden_size).astype(np.float32)

    # -- helpers ------------------------------------------------------------------------------
    def _submit(self, t: _FTrace, max_tokens: int) -> None:
        seq = t.prompt + t.output
        t.status = TraceStatus.RUNNING
        t.num_cached_tokens = None
        budget = self._budget(t, len(seq), max_tokens)
        if budget is None:
            return
        if any(not 0 <= i < self.config.vocab_size for i in seq):
            self._fail(t, "error", f"token id out of range 0..{self.config.vocab_size - 1}")
            return
        self._arrivals += 1
        req = _Req(t, list(seq), len(seq), t.seed, budget, self._arrivals)
        t.req = req
        self._enqueue(req)

    def _new_trace(self, prompt: list[int], spec: SamplingSpec, seed: int | None,
                   parent: _FTrace | None) -> _FTrace:
        tid = self._traces.new_id()
        s = hash((self.config.seed, tid)) & 0x7FFFFFFF if seed is None else int(seed)
        return self._traces.add(_FTrace(tid, prompt, spec, s, None if parent is None else parent.id))

    def _drop_request(self, t: _FTrace) -> None:
        if t.req is not None:
            self._unlink(t.req)
            t.req = None

    def _revive_seed(self, t: _FTrace) -> int:
        return hash((t.seed, t.id, t.incarnation)) & 0x7FFFFFFF

    def _release(self, req: _Req) -> None:
        self._pool.release(req.blocks)
        req.blocks = []
        req.computed = 0

    def _enqueue(self, req: _Req) -> None:
        """A new request waits at the back of the queue."""
        self._waiting[req] = None

    def _retire(self, req: _Req) -> None:
        """A running request finished: off the engine, its KV freed."""
        del self._running[req]
        self._release(req)

    def _unlink(self, req: _Req) -> None:
        if req in self._running:
            del self._running[req]
            self._release(req)
        else:
            self._waiting.pop(req, None)

    # -- scheduling ---------------------------------------------------------------------------
    def _admit(self, req: _Req) -> bool:
        """Allocate KV for ``req``'s whole sequence (prefix cache first); False if no room."""
        size = self._pool.size
        seq = req.seq
        hashes = block_hashes(seq, size)
        max_hit_blocks = (len(seq) - 1) // size  # always recompute >= 1 token
        blocks: list[int] = []
        for h in hashes[:max_hit_blocks]:
            b = self._pool.touch(h)
            if b is None:
                break
            blocks.append(b)
        hit = len(blocks)
        need = -(-(len(seq) + 1) // size) - hit  # room for the token sampled now
        if need > self._pool.num_free:
            self._pool.release(blocks)
            return False
        for _ in range(need):
            b = self._pool.allocate()
            assert b is not None
            blocks.append(b)
        for i in range(hit, len(hashes)):
            self._pool.commit(blocks[i], hashes[i])
        req.blocks = blocks
        req.hashes = hashes
        req.computed = len(seq)
        if req.first:
            req.cached = hit * size
            self._pc_queries += len(seq)
            self._pc_hits += hit * size
        return True

    def _grow(self, req: _Req) -> bool:
        """Room for one more token of ``req``; False when no block is free."""
        size = self._pool.size
        if len(req.seq) + 1 <= len(req.blocks) * size:
            return True
        b = self._pool.allocate()
        if b is None:
            return False
        req.blocks.append(b)
        return True

    def _commit_full(self, req: _Req) -> None:
        """The block the last token filled goes into the prefix cache (its chained hash
        extends the request's, as :func:`block_hashes` of the whole sequence would give)."""
        size = self._pool.size
        n = len(req.seq)
        if n % size == 0:
            i = n // size - 1
            prev = req.hashes[-1] if req.hashes else 0
            h = hash((prev, tuple(req.seq[n - size : n])))
            req.hashes.append(h)
            self._pool.commit(req.blocks[i], h)

    # -- stepping -----------------------------------------------------------------------------
    def step(self) -> StepOutput:
        out = StepOutput(deltas=self._errors)
        self._errors = []
        if not self._running and not self._waiting:
            return out
        self.steps += 1
        # decode room for the running ones (oldest first), preempting the newest on shortage
        ready: list[_Req] = []
        order = sorted(self._running, key=lambda r: r.arrival)
        newest = len(order) - 1  # order[newest]: the newest still running (none join here)
        for req in order:
            if req not in self._running:
                continue
            while not self._grow(req):
                while order[newest] not in self._running:
                    newest -= 1
                victim = order[newest]
                del self._running[victim]
                self._release(victim)
                victim.first = False
                self._waiting[victim] = None
                self._waiting.move_to_end(victim, last=False)
                self._preemptions += 1
                if victim is req:
                    break
            if req in self._running:
                ready.append(req)
        # admit waiting requests (FIFO) while there is room
        while self._waiting and len(self._running) < self.config.max_num_seqs:
            req = next(iter(self._waiting))
            if not self._admit(req):
                if not self._running:  # could never run, even alone: fail it, go on
                    self._waiting.popitem(last=False)
                    t = req.trace
                    t.req = None
                    need = -(-(len(req.seq) + 1) // self._pool.size)
                    self._fail(t, "error", f"needs {need} KV blocks, the engine has "
                               f"{self._pool.total}")
                    out.deltas.extend(self._errors)
                    self._errors = []
                    continue
                break
            self._waiting.popitem(last=False)
            self._running[req] = None
            ready.append(req)
        for req in ready:
            self._advance(req, out)
        return out

    def _advance(self, req: _Req, out: StepOutput) -> None:
        t = req.trace
        # feeding the last token computes the state at it (position len(seq) - 1)
        fed = len(req.seq) - 1
        j = fed - len(t.prompt)
        if self.config.capture_hidden and j > t.last_emitted and j >= 0:
            tok = req.seq[fed]
            closed = (self.config.think_end_id is not None
                      and self.config.think_end_id in (t.prompt + t.output)[: fed])
            hit = tok in self._boundary or (self.config.stride is not None
                                            and (j + 1) % self.config.stride == 0)
            if hit and not closed:
                ev = BoundaryEvent(t.id, fed, j, tok, self.hidden_at(req.seq, fed))
                t.last_emitted = j
                t.last_event = ev
                out.boundaries.append(ev)
        tok = int(self.policy(req.seq, req.seed))
        if not 0 <= tok < self.config.vocab_size:
            raise EngineError(f"policy returned token {tok} outside the vocab")
        req.seq.append(tok)
        req.generated += 1
        t.output.append(tok)
        self._commit_full(req)
        cached = None
        if req.first:
            req.first = False
            cached = req.cached
            t.num_cached_tokens = cached
        spec = t.spec
        finish = None
        stop = (tok == EOS and not spec.ignore_eos) or tok in spec.stop_token_ids
        if stop and req.generated >= spec.min_tokens:
            finish = "stop"
        elif req.generated >= req.max_tokens or len(req.seq) >= self.config.max_model_len:
            finish = "length"
        lps = None
        sampled = self._fake_logprobs(req.seq, tok, spec.logprobs or 0)
        t.lps.append(sampled.logprob)
        if spec.logprobs is not None:
            lps = (sampled,)
        out.deltas.append(Delta(t.id, (tok,), self.decode([tok]), finish, lps, cached))
        if finish is not None:
            self._retire(req)
            t.req = None
            t.status = TraceStatus.FINISHED
            t.finish_reason = finish

    def _fake_logprobs(self, seq: Sequence[int], tok: int, k: int) -> TokenLogprobs:
        rng = random.Random(hash(tuple(seq)))
        vals = sorted((-rng.expovariate(1.0) for _ in range(max(k, 1))), reverse=True)
        ids = tuple(rng.randrange(self.config.vocab_size) for _ in range(k))
        return TokenLogprobs(tok, vals[0], ids, tuple(vals[:k]))

    # -- reading ------------------------------------------------------------------------------
    def sampled_logprobs(self, trace: TraceId) -> np.ndarray:
        """Every token's (scripted) log-prob is known at once: no NaN."""
        return np.asarray(self._traces.get(trace).lps, dtype=np.float32)

    def memory(self) -> MemorySnapshot:
        free = self._pool.num_free
        total = self._pool.total
        return MemorySnapshot(
            kv_usage=(total - free) / total,
            total_blocks=total,
            free_blocks=free,
            block_size=self._pool.size,
            num_running=len(self._running),
            num_waiting=len(self._waiting),
            num_preemptions=self._preemptions,
            prefix_cache_queries=self._pc_queries,
            prefix_cache_hits=self._pc_hits,
        )

    def has_unfinished(self) -> bool:
        return bool(self._running or self._waiting or self._errors)
