"""The row channel: how captured hidden states travel from the recording worker to the driver.

Both ends of one private ZMQ pipe and the message format, nothing else (no vLLM import):

* worker end, :class:`RowPusher`: :class:`~gambit_search._vllm_internals.capture.RowCapture`
  turns each recorded step into one numbered message (:func:`encode_message`) and pushes it,
  non-blocking, to a PUSH socket connected to the driver's address; what cannot be sent yet
  waits in an outbox, in order. Neither the engine core nor the driver ever waits for rows.
* driver end, :class:`RowSink`: a PULL socket bound to a private ipc path (so the recording
  worker must run on the driver's host), read without waiting after every engine step
  (:meth:`RowSink.poll`). :meth:`RowSink.flush` is the barrier for when the driver needs
  every row so far: given the workers' answers to the ``gambit_flush`` ``collective_rpc``
  (last sequence number sent, unsent messages) it reads the socket up to that number, then
  yields the unsent ones.

A message (:class:`RowMessage`) lists the (trace, incarnation, position) of *every* Gambit
row of its step, so the driver knows which rows exist (its watermark: when a trace's last
row is in), plus the kept (boundary) rows' data as float32 and, when asked, every row's
input-token log-prob, and the kept rows' trace scores when the worker scores them (then
the rows themselves are usually left out: ``rows`` is [m, 0]). Messages are pickled dicts
of numpy arrays and plain types (they cross processes and vLLM versions unchanged).
"""

from __future__ import annotations

import pickle
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from gambit_search.engine import EngineError

__all__ = ["FLUSH_TIMEOUT_S", "RowMessage", "RowPusher", "RowSink", "decode_message",
           "decode_rows", "encode_message", "encode_rows"]

FLUSH_TIMEOUT_S = 60.0
"""Longest wait for the worker's rows at a flush."""


class RowMessage(NamedTuple):
    """One recorded step, as pushed by the worker."""

    seq: int
    """1, 2, ... per capture install."""
    trace: np.ndarray
    """int64 [n]: trace of every Gambit row of the step."""
    inc: np.ndarray
    """int64 [n]: its incarnation."""
    pos: np.ndarray
    """int64 [n]: its position (the state at the token there)."""
    keep: np.ndarray
    """int64 [m]: indices of the kept (boundary) rows."""
    ids: list[str]
    """[m] external request ids of the kept rows."""
    tok: np.ndarray
    """int64 [m]: input token of each kept row."""
    rows: np.ndarray
    """float32 [m, d]: the kept states."""
    lp: np.ndarray | None = None
    """float32 [n]: log-prob of every row's input token (NaN: unknown); None: not asked."""
    score: np.ndarray | None = None
    """float64 [m]: each kept row's trace score, from the worker's scorer (NaN: a row it did
    not score); None: the worker does not score."""


def encode_message(seq: int, trace: np.ndarray, inc: np.ndarray, pos: np.ndarray,
                   keep: np.ndarray, ids: list[str], tok: np.ndarray, rows: np.ndarray,
                   lp: np.ndarray | None, score: np.ndarray | None = None) -> bytes:
    """The bytes of one :class:`RowMessage` (fields as there)."""
    return pickle.dumps({
        "seq": seq,
        "trace": trace,
        "inc": inc,
        "pos": pos,
        "keep": keep,
        "ids": ids,
        "tok": tok,
        "rows": rows,
        "lp": lp,
        "score": score,
    }, protocol=pickle.HIGHEST_PROTOCOL)


def decode_message(blob: bytes) -> RowMessage:
    """A pushed message."""
    d = pickle.loads(blob)
    return RowMessage(int(d["seq"]), d["trace"], d["inc"], d["pos"], d["keep"], d["ids"],
                      d["tok"], d["rows"], d.get("lp"), d.get("score"))


def encode_rows(msgs: list[RowMessage]) -> bytes | None:
    """The kept rows of ``msgs`` as one blob (see :func:`decode_rows`); None when none."""
    msgs = [m for m in msgs if len(m.keep)]
    if not msgs:
        return None
    return pickle.dumps({
        "ids": [i for m in msgs for i in m.ids],
        "pos": np.concatenate([m.pos[m.keep] for m in msgs]),
        "tok": np.concatenate([m.tok for m in msgs]),
        "rows": np.concatenate([m.rows for m in msgs], axis=0),
    }, protocol=pickle.HIGHEST_PROTOCOL)


def decode_rows(blob: bytes | None) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
    """``(external ids, positions, input token ids, float32 rows [n, d])`` of a drain."""
    if not blob:
        return [], np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros((0, 0), np.float32)
    d = pickle.loads(blob)
    return d["ids"], d["pos"], d["tok"], d["rows"]


class RowPusher:
    """The worker end: an outbox of encoded messages, sent in order without blocking.

    ``address`` None: nothing is sent (the messages wait for the owner to take them)."""

    def __init__(self, address: str | None) -> None:
        self.address = address
        self.outbox: list[bytes] = []
        self.sent = 0  # last sequence number sent
        self._sock: Any = None

    def send(self) -> None:
        """Send what the socket takes now, oldest first; the rest stays in the outbox."""
        if self.address is None or not self.outbox:
            return
        import zmq

        if self._sock is None:
            self._sock = zmq.Context.instance().socket(zmq.PUSH)
            self._sock.setsockopt(zmq.SNDHWM, 100_000)
            self._sock.setsockopt(zmq.LINGER, 0)
            self._sock.connect(self.address)
        while self.outbox:
            try:
                self._sock.send(self.outbox[0], flags=zmq.NOBLOCK)
            except zmq.Again:
                return
            self.outbox.pop(0)
            self.sent += 1

    def take(self) -> list[bytes]:
        """The unsent messages, in order; the outbox is empty afterwards."""
        out, self.outbox = self.outbox, []
        return out

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = None


class RowSink:
    """The driver end: a ZMQ PULL socket on a private ipc path (:attr:`address`, passed to the
    worker in the capture spec). Tracks the highest sequence number seen."""

    def __init__(self) -> None:
        import tempfile
        import uuid

        import zmq

        self._zctx = zmq.Context()
        self._pull = self._zctx.socket(zmq.PULL)
        self._pull.setsockopt(zmq.RCVHWM, 100_000)
        self._pull.setsockopt(zmq.LINGER, 0)
        self._path = Path(tempfile.gettempdir()) / f"gambit-rows-{uuid.uuid4().hex}"
        self.address = f"ipc://{self._path}"
        self._pull.bind(self.address)
        self.seq_seen = 0
        """Highest sequence number read; reset to 0 when the capture is re-installed (a new
        capture numbers its messages from 1)."""

    def _decode(self, blob: bytes) -> RowMessage:
        m = decode_message(blob)
        self.seq_seen = max(self.seq_seen, m.seq)
        return m

    def poll(self) -> Iterator[RowMessage]:
        """Every message that has arrived, in order (never waits)."""
        import zmq

        while True:
            try:
                blob = self._pull.recv(flags=zmq.NOBLOCK)
            except zmq.Again:
                return
            yield self._decode(blob)

    def flush(self, answers: Iterable[tuple[int, list[bytes]] | None]) -> Iterator[RowMessage]:
        """Barrier: every message the workers' ``gambit_flush`` answers account for, in
        order (an answer is (last sequence number sent, unsent messages); None: a worker
        that does not record). Raises :class:`EngineError` when sent messages do not arrive
        within :data:`FLUSH_TIMEOUT_S`."""
        import zmq

        for res in answers:
            if res is None:
                continue
            last_sent, unsent = res
            while self.seq_seen < last_sent:
                if not self._pull.poll(int(FLUSH_TIMEOUT_S * 1000), zmq.POLLIN):
                    raise EngineError(f"hidden-state rows up to #{last_sent} did not arrive "
                                      f"within {FLUSH_TIMEOUT_S:.0f} s")
                yield self._decode(self._pull.recv())
            for blob in unsent:
                yield self._decode(blob)

    def close(self) -> None:
        self._pull.close(linger=0)
        self._zctx.term()
        self._path.unlink(missing_ok=True)
