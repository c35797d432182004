"""Harvest format: schema, state encoding, manifest checks, streaming reader."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from scorer_synth import make_harvest, make_traces

from gambit_scorer import harvest_io as hio


def test_schema_columns_and_types():
    assert hio.COLUMNS == (
        "question_id",
        "question",
        "gold",
        "trace_index",
        "token_ids",
        "text",
        "answer",
        "correct",
        "boundary_positions",
        "hidden_states",
        "conf_mean",
        "conf_min",
        "n_tokens",
        "prefix_labels",
    )
    s = hio.HARVEST_SCHEMA
    assert s.field("prefix_labels").type == pa.list_(pa.int8()) and s.field("prefix_labels").nullable
    assert s.field("trace_index").type == pa.int32()
    assert s.field("token_ids").type == pa.list_(pa.int32())
    assert s.field("boundary_positions").type == pa.list_(pa.int32())
    assert s.field("conf_mean").type == pa.list_(pa.float32())
    assert pa.types.is_binary(s.field("hidden_states").type) or pa.types.is_large_binary(
        s.field("hidden_states").type
    )
    assert s.field("answer").nullable and not s.field("correct").nullable


def test_a_shard_written_before_prefix_labels_reads_them_as_null(tmp_path):
    traces = make_traces(n_questions=3, traces_per_question=2, hidden_size=8, seed=2)
    from scorer_synth import write_harvest

    write_harvest(tmp_path / "h", traces, hidden_size=8, n_shards=1)
    f = tmp_path / "h" / "data" / "shard-00000.parquet"
    old = pq.read_table(f).drop(["prefix_labels"])  # the schema of older harvests
    pq.write_table(old, f)
    got = list(hio.iter_traces(tmp_path / "h"))
    assert len(got) == 6 and all(t.prefix_labels is None for t in got)
    assert all(t.hidden_states.shape[1] == 8 for t in got)


def test_encode_decode_roundtrip():
    a = np.random.default_rng(0).standard_normal((5, 12)).astype(np.float32)
    b = hio.encode_states(a)
    assert isinstance(b, bytes) and len(b) == 5 * 12 * 2
    back = hio.decode_states(b, 12)
    assert back.dtype == np.float16 and back.shape == (5, 12)
    np.testing.assert_array_equal(back, a.astype(np.float16))
    # the documented decode recipe
    np.testing.assert_array_equal(np.frombuffer(b, np.float16).reshape(-1, 12), back)
    assert hio.decode_states(hio.encode_states(np.zeros((0, 12))), 12).shape == (0, 12)
    with pytest.raises(ValueError, match="2-D"):
        hio.encode_states(np.zeros(4))
    with pytest.raises(hio.HarvestError, match="hidden size"):
        hio.decode_states(b, 7)


def test_write_read_roundtrip(tmp_path):
    traces = make_traces(n_questions=5, traces_per_question=3, hidden_size=8, seed=1)
    traces[0].answer = None  # nullable
    d = tmp_path / "h"
    from scorer_synth import write_harvest

    write_harvest(d, traces, hidden_size=8, n_shards=2)
    t = pq.read_table(d / "data" / "shard-00000.parquet")
    assert t.schema.equals(hio.HARVEST_SCHEMA)
    m = hio.read_manifest(d)
    assert m["hidden_size"] == 8 and m["boundary_token_ids"] == [5, 17]
    assert hio.count_rows(d) == 15
    got = {(x.question_id, x.trace_index): x for x in hio.iter_traces(d, batch_size=4)}
    assert len(got) == 15
    for src in traces:
        x = got[(src.question_id, src.trace_index)]
        assert x.correct == src.correct and x.answer == src.answer and x.text == src.text
        assert x.token_ids == src.token_ids and x.boundary_positions == src.boundary_positions
        np.testing.assert_array_equal(x.hidden_states, src.hidden_states)
        np.testing.assert_allclose(x.conf_mean, src.conf_mean)
        assert x.n_boundaries == len(src.conf_min) == x.hidden_states.shape[0]


def test_flat_layout_is_read_too(tmp_path):
    from scorer_synth import write_harvest

    traces = make_traces(n_questions=3, traces_per_question=2, hidden_size=8)
    d = write_harvest(tmp_path / "flat", traces, hidden_size=8, n_shards=1, subdir="")
    assert (d / "shard-00000.parquet").is_file()
    assert len(list(hio.iter_traces(d))) == 6


def test_iter_traces_column_subset_and_batches(tmp_path):
    d = make_harvest(tmp_path / "h", n_questions=6, traces_per_question=4, hidden_size=8)
    xs = list(hio.iter_traces(d, columns=["question_id", "correct"], batch_size=5))
    assert len(xs) == 24 and xs[0].hidden_states is None and xs[0].question_id.startswith("q")
    batches = list(hio.iter_batches(d, ["question_id"], batch_size=5))
    assert all(b.num_rows <= 5 for b in batches) and sum(b.num_rows for b in batches) == 24
    with pytest.raises(ValueError, match="unknown harvest columns"):
        list(hio.iter_batches(d, ["nope"]))


def test_manifest_errors(tmp_path):
    with pytest.raises(hio.HarvestError, match="does not exist"):
        hio.read_manifest(tmp_path / "missing")
    with pytest.raises(hio.HarvestError, match="manifest.json is missing"):
        hio.read_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps({"model": "m", "hidden_size": 8}))
    with pytest.raises(hio.HarvestError, match="lacks the keys"):
        hio.read_manifest(tmp_path)
    with pytest.raises(hio.HarvestError, match="no data/shard.*empty or unfinished"):
        list(hio.iter_batches(tmp_path))
