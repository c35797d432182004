"""The harvest format: what ``gambit-harvest`` writes and ``gambit-train`` reads.

A harvest is a directory::

    manifest.json               model, model_hash, hidden_size, boundary_token_ids, sampling, seed, counts
    data/shard-00000.parquet    one row per sampled trace, schema HARVEST_SCHEMA
    data/shard-00001.parquet    ... (shards directly in the directory are read too)

Per trace: the question, the gold answer, the sampled token ids and text, the extracted
answer and its correctness, and per *boundary* (the token ending a thought, see
REFERENCE.md "Thought"): its position in ``token_ids``, the policy model's final hidden
state there (``hidden_states``: float16 bytes of a C-contiguous [n_boundaries, hidden_size]
array, see :func:`encode_states`), and the thought's token confidence (``conf_mean``,
``conf_min``: mean and minimum log-probability of the sampled tokens of the thought that
ends at that boundary). Optional per-boundary process labels: ``prefix_labels`` (the toy
world's exact "still clean" labels, :mod:`data_pipelines.toy.steps`; null for other
datasets and for harvests written before the column existed: readers see null either way)
and, in ``mc/shard-*.parquet`` beside each data shard, Monte-Carlo labels (``MC_SCHEMA``:
``mc_labels`` 1 when one of ``mc_hits``' k continuations from that boundary reached the gold
answer, -1 where the boundary was not labelled; :func:`read_mc_labels`).

The writer imports the column names and :data:`HARVEST_SCHEMA` from here; readers use
:func:`read_manifest` and :func:`iter_traces` (streaming, a record batch at a time).
Only numpy and pyarrow are imported.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from gambit_core.errors import InputError

MANIFEST_NAME = "manifest.json"
SHARD_GLOB = "shard-*.parquet"
DATA_DIR = "data"
MANIFEST_REQUIRED_KEYS = (
    "model",
    "model_hash",
    "hidden_size",
    "boundary_token_ids",
    "sampling",
    "seed",
    "counts",
)

HARVEST_SCHEMA = pa.schema(
    [
        pa.field("question_id", pa.string(), nullable=False),
        pa.field("question", pa.string(), nullable=False),
        pa.field("gold", pa.string(), nullable=False),
        pa.field("trace_index", pa.int32(), nullable=False),
        pa.field("token_ids", pa.list_(pa.int32()), nullable=False),
        pa.field("text", pa.string(), nullable=False),
        pa.field("answer", pa.string(), nullable=True),
        pa.field("correct", pa.bool_(), nullable=False),
        pa.field("boundary_positions", pa.list_(pa.int32()), nullable=False),
        # float16 bytes of a C-contiguous [n_boundaries, hidden_size] array (encode_states).
        # large_binary: one shard's states can pass the 2 GiB offset limit of plain binary.
        pa.field("hidden_states", pa.large_binary(), nullable=False),
        pa.field("conf_mean", pa.list_(pa.float32()), nullable=False),
        pa.field("conf_min", pa.list_(pa.float32()), nullable=False),
        pa.field("n_tokens", pa.int32(), nullable=False),
        # per boundary 1 (the prefix is still clean) / 0; null: not known for this trace
        pa.field("prefix_labels", pa.list_(pa.int8()), nullable=True),
    ]
)
MC_DIR = "mc"
MC_CONFIG_NAME = "mc_config.json"
MC_SCHEMA = pa.schema(
    [
        pa.field("question_id", pa.string(), nullable=False),
        pa.field("trace_index", pa.int32(), nullable=False),
        # per boundary: 1 if any of the k continuations reached gold, 0 if none, -1 not labelled
        pa.field("mc_labels", pa.list_(pa.int8()), nullable=False),
        # per boundary: how many of the k continuations reached gold (-1: not labelled)
        pa.field("mc_hits", pa.list_(pa.int16()), nullable=False),
    ]
)
COLUMNS: tuple[str, ...] = tuple(HARVEST_SCHEMA.names)
# What training needs (everything but the token ids and texts).
TRAIN_COLUMNS: tuple[str, ...] = (
    "question_id",
    "trace_index",
    "correct",
    "boundary_positions",
    "hidden_states",
    "conf_mean",
    "conf_min",
)


class HarvestError(InputError):
    """A harvest directory is missing, empty or malformed (the message says how to fix it)."""


def encode_states(states: np.ndarray) -> bytes:
    """[n_boundaries, hidden_size] array -> float16 C-order bytes (the ``hidden_states`` cell)."""
    a = np.asarray(states)
    if a.ndim != 2:
        raise ValueError(
            f"hidden states must be a 2-D [n_boundaries, hidden_size] array, got shape {a.shape}"
        )
    return np.ascontiguousarray(a, dtype=np.float16).tobytes()


def decode_states(blob: bytes, hidden_size: int) -> np.ndarray:
    """Inverse of :func:`encode_states`: a read-only float16 array [n_boundaries, hidden_size]."""
    if len(blob) % (2 * hidden_size):
        raise HarvestError(
            f"a hidden_states cell of {len(blob)} bytes is not a whole number of float16 rows of "
            f"hidden_size={hidden_size}: the shard was written with another hidden size than its manifest says"
        )
    return np.frombuffer(blob, dtype=np.float16).reshape(-1, hidden_size)


@dataclass
class HarvestTrace:
    """One sampled trace. Fields not read (``iter_traces(columns=...)``) are None."""

    question_id: str | None = None
    question: str | None = None
    gold: str | None = None
    trace_index: int | None = None
    token_ids: list[int] | None = None
    text: str | None = None
    answer: str | None = None
    correct: bool | None = None
    boundary_positions: list[int] | None = None
    hidden_states: np.ndarray | None = None
    """float16 [n_boundaries, hidden_size]."""
    conf_mean: np.ndarray | None = None
    """float32 [n_boundaries]."""
    conf_min: np.ndarray | None = None
    """float32 [n_boundaries]."""
    n_tokens: int | None = None
    prefix_labels: list[int] | None = None
    """Per boundary 1/0: the prefix is still clean (toy harvests); None where unknown."""

    @property
    def n_boundaries(self) -> int:
        for v in (self.boundary_positions, self.conf_mean, self.hidden_states):
            if v is not None:
                return len(v)
        raise ValueError("n_boundaries needs boundary_positions, conf_mean or hidden_states")

    def to_row(self) -> dict[str, Any]:
        """A dict for one row of HARVEST_SCHEMA (``hidden_states`` encoded)."""
        row = {k: getattr(self, k) for k in COLUMNS}
        row["hidden_states"] = encode_states(self.hidden_states)
        for k in ("conf_mean", "conf_min"):
            row[k] = np.asarray(row[k], dtype=np.float32).tolist()
        if row["prefix_labels"] is not None:
            row["prefix_labels"] = [int(x) for x in row["prefix_labels"]]
        return row


def traces_to_table(traces: Sequence[HarvestTrace]) -> pa.Table:
    """Build a shard table with the exact HARVEST_SCHEMA (for writers and tests)."""
    rows = [t.to_row() for t in traces]
    return pa.Table.from_pylist(rows, schema=HARVEST_SCHEMA)


def harvest_dir(path: str | Path) -> Path:
    p = Path(path).expanduser()
    if not p.is_dir():
        raise HarvestError(
            f"harvest directory {str(p)!r} does not exist: pass data.harvest=<dir written by gambit-harvest>"
        )
    return p


def read_manifest(path: str | Path) -> dict[str, Any]:
    """Read and check ``manifest.json`` of a harvest directory."""
    p = harvest_dir(path) / MANIFEST_NAME
    if not p.is_file():
        raise HarvestError(
            f"{p} is missing: {p.parent} is not a harvest directory (gambit-harvest writes one)"
        )
    try:
        m = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise HarvestError(f"{p} is not valid JSON ({e}); re-run the harvest") from e
    missing = [k for k in MANIFEST_REQUIRED_KEYS if k not in m]
    if missing:
        raise HarvestError(
            f"{p} lacks the keys {missing}; re-run the harvest with a current gambit-harvest"
        )
    if not isinstance(m["hidden_size"], int) or m["hidden_size"] <= 0:
        raise HarvestError(f"{p}: hidden_size must be a positive int, got {m['hidden_size']!r}")
    return m


def shard_paths(path: str | Path) -> list[Path]:
    """The parquet shards of a harvest, sorted by name (``data/`` is where gambit-harvest puts
    them, so that ``datasets.load_dataset("parquet", data_dir=f"{path}/data")`` reads them)."""
    d = harvest_dir(path)
    return sorted(d.glob(SHARD_GLOB)) + sorted(d.glob(f"{DATA_DIR}/{SHARD_GLOB}"))


def _dataset(path: str | Path):
    import pyarrow.dataset as pads

    files = shard_paths(path)
    if not files:
        raise HarvestError(
            f"harvest {str(path)!r} has no {DATA_DIR}/{SHARD_GLOB} files: the harvest is empty or unfinished"
        )
    # the schema given: a shard written before an optional column existed reads it as null
    return pads.dataset([str(f) for f in files], format="parquet", schema=HARVEST_SCHEMA)


def iter_batches(
    path: str | Path, columns: Sequence[str] | None = None, batch_size: int = 256
) -> Iterator[pa.RecordBatch]:
    """Stream the harvest's rows as pyarrow record batches (only ``columns``)."""
    cols = list(columns) if columns is not None else list(COLUMNS)
    unknown = [c for c in cols if c not in COLUMNS]
    if unknown:
        raise ValueError(f"unknown harvest columns {unknown}; the columns are {list(COLUMNS)}")
    yield from _dataset(path).to_batches(columns=cols, batch_size=batch_size)


def list_column(arr: pa.Array, dtype) -> list[np.ndarray]:
    """Split a list<...> column into one numpy array per row (views into one buffer)."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    offs = arr.offsets.to_numpy()
    vals = arr.values.to_numpy(zero_copy_only=False).astype(dtype, copy=False)
    return [vals[offs[i] : offs[i + 1]] for i in range(len(arr))]


def batch_to_traces(batch: pa.RecordBatch, hidden_size: int) -> list[HarvestTrace]:
    """Decode one record batch into HarvestTrace objects."""
    cols: dict[str, list] = {}
    for name in batch.schema.names:
        arr = batch.column(name)
        if name == "hidden_states":
            cols[name] = [decode_states(b, hidden_size) for b in arr.to_pylist()]
        elif name in ("conf_mean", "conf_min"):
            cols[name] = list_column(arr, np.float32)
        elif name in ("token_ids", "boundary_positions"):
            cols[name] = [a.tolist() for a in list_column(arr, np.int64)]
        elif name == "prefix_labels":
            cols[name] = arr.to_pylist()
        else:
            cols[name] = arr.to_pylist()
    return [HarvestTrace(**{k: v[i] for k, v in cols.items()}) for i in range(batch.num_rows)]


def iter_traces(
    path: str | Path, columns: Sequence[str] | None = None, batch_size: int = 256
) -> Iterator[HarvestTrace]:
    """Stream the traces of a harvest directory, ``batch_size`` rows read at a time."""
    hidden_size = read_manifest(path)["hidden_size"]
    for batch in iter_batches(path, columns, batch_size):
        yield from batch_to_traces(batch, hidden_size)


def count_rows(path: str | Path) -> int:
    """Number of traces in a harvest (from parquet metadata, no data read)."""
    return _dataset(path).count_rows()


# ----------------------------------------------------------------------------- MC labels


def mc_shard_path(data_shard: str | Path) -> Path:
    """Where the Monte-Carlo labels of ``<harvest>/data/shard-N.parquet`` live:
    ``<harvest>/mc/shard-N.parquet``."""
    p = Path(data_shard)
    return p.parent.parent / MC_DIR / p.name if p.parent.name == DATA_DIR else p.parent / MC_DIR / p.name


def read_mc_labels(path: str | Path) -> dict[tuple[str, int], tuple[np.ndarray, np.ndarray]]:
    """{(question_id, trace_index): (mc_labels int8, mc_hits int16)} over every shard of a
    harvest; :class:`HarvestError` naming how many shards lack them when any does."""
    import pyarrow.parquet as pq

    files = shard_paths(path)
    missing = [f for f in files if not mc_shard_path(f).exists()]
    if missing or not files:
        raise HarvestError(
            f"harvest {str(path)!r} has Monte-Carlo labels for {len(files) - len(missing)} of "
            f"{len(files)} shards: run gambit-harvest on it with --mc-labels K (resumable)"
        )
    out: dict[tuple[str, int], tuple[np.ndarray, np.ndarray]] = {}
    for f in files:
        t = pq.read_table(mc_shard_path(f), schema=MC_SCHEMA)
        labels = list_column(t.column("mc_labels"), np.int8)
        hits = list_column(t.column("mc_hits"), np.int16)
        for q, i, lab, h in zip(t.column("question_id").to_pylist(), t.column("trace_index").to_pylist(),
                                labels, hits, strict=True):
            out[(q, int(i))] = (lab, h)
    return out
