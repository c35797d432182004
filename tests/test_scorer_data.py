"""DataModule: split by question, samples, pos_weight, streaming, bad input."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from scorer_synth import make_harvest, make_traces, write_harvest

from gambit_scorer.data import HarvestDataModule, StreamingDataset
from gambit_scorer.harvest_io import HARVEST_SCHEMA, HarvestError

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def harvest(tmp_path_factory):
    return make_harvest(
        tmp_path_factory.mktemp("h") / "harvest",
        n_questions=30,
        traces_per_question=6,
        hidden_size=8,
    )


def _dm(harvest, **kw):
    dm = HarvestDataModule(harvest, **kw)
    dm.setup("fit")
    return dm


def test_split_by_question_stratified(harvest):
    dm = _dm(harvest)
    ix = dm.index
    qtr, qva = set(ix.qidx[dm.train_traces]), set(ix.qidx[dm.val_traces])
    assert qtr and qva and not qtr & qva
    assert 0.1 < len(qva) / (len(qva) + len(qtr)) < 0.35
    for part in (dm.train_traces, dm.val_traces):
        assert 0 < ix.label[part].mean() < 1
    assert _dm(harvest, seed=0).val_traces.tolist() == dm.val_traces.tolist()
    assert _dm(harvest, seed=1).val_traces.tolist() != dm.val_traces.tolist()


def test_mlp_samples_and_pos_weight(harvest):
    dm = _dm(harvest, kind="mlp", features="hidden+conf", batch_size=16)
    ix = dm.index
    steps_pos = int((ix.label[dm.train_traces] * ix.n_steps[dm.train_traces]).sum())
    steps_all = int(ix.n_steps[dm.train_traces].sum())
    assert dm.pos_weight == pytest.approx((steps_all - steps_pos) / steps_pos)
    assert dm.input_size == 10
    b = next(iter(dm.train_dataloader()))
    assert b["x"].shape == (16, 10) and b["y"].shape == (16,)
    np.testing.assert_array_equal(b["y"].numpy(), ix.label[b["trace"].numpy()])
    assert (b["step"] >= 1).all()
    # confidence columns are standardised on the training split
    allx = torch.cat([bb["x"] for bb in dm.train_dataloader()])
    assert abs(float(allx[:, 8].mean())) < 0.05 and abs(float(allx[:, 9].std()) - 1) < 0.05
    assert len(allx) == steps_all
    n_val = sum(len(bb["y"]) for bb in dm.val_dataloader())
    assert n_val == int(ix.n_steps[dm.val_traces].sum())


def test_seq_samples_padding(harvest):
    dm = _dm(harvest, kind="seq", batch_size=8)
    ix = dm.index
    assert dm.pos_weight == pytest.approx(
        (1 - ix.label[dm.train_traces]).sum() / ix.label[dm.train_traces].sum()
    )
    b = next(iter(dm.val_dataloader()))
    B, T, F = b["x"].shape
    assert F == 8 and b["mask"].shape == (B, T)
    np.testing.assert_array_equal(b["lengths"].numpy(), ix.n_steps[b["trace"].numpy()])
    for i in range(B):
        n = int(b["lengths"][i])
        assert b["mask"][i, :n].all() and not b["mask"][i, n:].any()
        assert b["step"][i, :n].tolist() == list(range(1, n + 1))
        assert (b["x"][i, n:] == 0).all()
    # truncation keeps the last max_len steps, with their true step indices
    dm2 = _dm(harvest, kind="seq", batch_size=8, max_len=3)
    b2 = next(iter(dm2.val_dataloader()))
    assert b2["x"].shape[1] == 3
    assert b2["step"][0].tolist() == list(
        range(int(ix.n_steps[b2["trace"][0]]) - 2, int(ix.n_steps[b2["trace"][0]]) + 1)
    )


@pytest.mark.parametrize("kind", ["mlp", "seq"])
def test_streaming_matches_memory(harvest, kind):
    mem = _dm(harvest, kind=kind, batch_size=8, streaming=False)
    st = _dm(
        harvest, kind=kind, batch_size=8, streaming=True, shuffle_buffer=64, read_batch_size=16
    )
    assert st.streaming and not mem.streaming and st.states is None

    def records(loader):
        out = []
        for b in loader:
            m = b.get("mask")
            x = b["x"] if m is None else b["x"][m]
            tr = b["trace"] if m is None else b["trace"].repeat_interleave(m.sum(1))
            step = b["step"] if m is None else b["step"][m]
            out += [
                (int(t), int(k), tuple(np.round(v.numpy(), 4)))
                for t, k, v in zip(tr, step, x, strict=True)
            ]
        return sorted(out)

    assert records(st.val_dataloader()) == records(mem.val_dataloader())
    assert len(st.val_dataloader()) == len(list(st.val_dataloader()))
    # training shards across 2 ranks: disjoint traces, same number of batches, shuffled per epoch
    ds = [
        StreamingDataset(
            st.index,
            st.train_traces,
            kind,
            st.featurize,
            8,
            shuffle=True,
            shuffle_buffer=64,
            seed=0,
            rank=r,
            world_size=2,
            n_batches=5,
        )
        for r in range(2)
    ]
    got = [list(d) for d in ds]
    assert [len(g) for g in got] == [5, 5]
    t0, t1 = ({int(t) for b in g for t in b["trace"]} for g in got)
    assert not t0 & t1
    ds[0].set_epoch(1)
    assert [b["trace"].tolist() for b in ds[0]] != [b["trace"].tolist() for b in got[0]]


def test_bad_inputs(tmp_path):
    with pytest.raises(HarvestError, match="does not exist"):
        _dm(tmp_path / "nope")
    with pytest.raises(HarvestError, match="no harvest given"):
        HarvestDataModule(None)
    # a manifest but no shards
    empty = write_harvest(tmp_path / "empty", [], hidden_size=8)
    with pytest.raises(HarvestError, match="empty or unfinished"):
        _dm(empty)
    # shards with no rows
    pq.write_table(HARVEST_SCHEMA.empty_table(), empty / "shard-00000.parquet")
    with pytest.raises(HarvestError, match="holds no traces"):
        _dm(empty)
    one = make_harvest(
        tmp_path / "one", n_questions=6, traces_per_question=3, hidden_size=8, only_class=True
    )
    with pytest.raises(HarvestError, match="are correct: a scorer needs both outcomes"):
        _dm(one)
    a = make_harvest(tmp_path / "a", n_questions=6, traces_per_question=3, hidden_size=8)
    b = make_harvest(tmp_path / "b", n_questions=6, traces_per_question=3, hidden_size=16)
    with pytest.raises(HarvestError, match="mixed hidden sizes.*one model"):
        _dm([str(a), str(b)])
    # states written at another hidden size than the manifest says
    tr = make_traces(n_questions=6, traces_per_question=3, hidden_size=16)
    bad = write_harvest(tmp_path / "bad", tr, hidden_size=8)
    with pytest.raises(HarvestError, match="another hidden size than the manifest"):
        _dm(bad)
    with pytest.raises(ValueError, match="scorer=mlp or scorer=seq"):
        HarvestDataModule(a, kind="lstm")
