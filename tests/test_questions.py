"""Tests for gambit_core.questions.load_questions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gambit_core.errors import DatasetError
from gambit_core.questions import Question, load_questions

BENCH_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "benchmarks"

ROWS = [
    {"question": "What is 1+1?", "answer": "2"},
    {"question": "Half of one?", "answer": "\\frac{1}{2}"},
    {"question": "Root two squared?", "answer": "2"},
]


def _write_jsonl(path: Path, rows: list[dict], raw_lines: list[str] | None = None) -> Path:
    lines = [json.dumps(r) for r in rows] + (raw_lines or [])
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# --- JSONL ---------------------------------------------------------------------------------


def test_jsonl_default_ids(tmp_path: Path) -> None:
    qs = load_questions(str(_write_jsonl(tmp_path / "mini.jsonl", ROWS)))
    assert [q.id for q in qs] == ["mini-0", "mini-1", "mini-2"]
    assert qs[1] == Question(
        id="mini-1", question="Half of one?", answer="\\frac{1}{2}", source="mini"
    )


def test_jsonl_with_ids_and_max(tmp_path: Path) -> None:
    rows = [{"id": f"q{i}", **r} for i, r in enumerate(ROWS)]
    qs = load_questions(str(_write_jsonl(tmp_path / "ids.jsonl", rows)), max_questions=2)
    assert [q.id for q in qs] == ["q0", "q1"]


def test_jsonl_fallback_and_explicit_keys(tmp_path: Path) -> None:
    p = _write_jsonl(tmp_path / "alt.jsonl", [{"problem": "P?", "Answer": 5}])
    assert load_questions(str(p))[0].answer == "5"
    p2 = _write_jsonl(tmp_path / "custom.jsonl", [{"q": "Q?", "a": "7"}])
    q = load_questions(str(p2), question_key="q", answer_key="a")[0]
    assert (q.question, q.answer) == ("Q?", "7")
    p3 = _write_jsonl(
        tmp_path / "sol.jsonl", [{"problem": "P?", "solution": "so \\boxed{\\frac{1}{3}}."}]
    )
    assert load_questions(str(p3))[0].answer == "\\frac{1}{3}"


def test_malformed_line_names_file_and_line(tmp_path: Path) -> None:
    p = _write_jsonl(tmp_path / "bad.jsonl", ROWS[:2], raw_lines=['{"question": "x", "answer": '])
    with pytest.raises(DatasetError) as e:
        load_questions(str(p))
    assert "bad.jsonl" in str(e.value) and "line 3" in str(e.value)
    assert isinstance(e.value, ValueError)


def test_non_object_line(tmp_path: Path) -> None:
    p = _write_jsonl(tmp_path / "list.jsonl", ROWS[:1], raw_lines=["[1, 2]"])
    with pytest.raises(DatasetError, match=r"list\.jsonl:2.*line 2"):
        load_questions(str(p))


@pytest.mark.parametrize("missing", ["question", "answer"])
def test_missing_field_is_named(tmp_path: Path, missing: str) -> None:
    row = dict(ROWS[0])
    del row[missing]
    p = _write_jsonl(tmp_path / "miss.jsonl", [ROWS[1], row])
    with pytest.raises(DatasetError) as e:
        load_questions(str(p))
    msg = str(e.value)
    assert f"missing {missing} field" in msg and "miss.jsonl:2" in msg


def test_empty_answer_is_an_error(tmp_path: Path) -> None:
    p = _write_jsonl(tmp_path / "blank.jsonl", [{"question": "Q?", "answer": "  "}])
    with pytest.raises(DatasetError, match="answer field 'answer' is empty"):
        load_questions(str(p))


def test_empty_file(tmp_path: Path) -> None:
    p = tmp_path / "empty.jsonl"
    p.write_text("\n\n", encoding="utf-8")
    with pytest.raises(DatasetError, match="no questions in .*empty.jsonl"):
        load_questions(str(p))


def test_missing_path(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="does not exist"):
        load_questions(str(tmp_path / "nope.jsonl"))
    with pytest.raises(DatasetError, match="does not exist"):
        load_questions("./no/such/dir")


def test_duplicate_ids(tmp_path: Path) -> None:
    p = _write_jsonl(tmp_path / "dup.jsonl", [{"id": "a", **ROWS[0]}, {"id": "a", **ROWS[1]}])
    with pytest.raises(DatasetError, match="duplicate question id 'a'"):
        load_questions(str(p))


def test_bad_max_questions(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        load_questions(str(_write_jsonl(tmp_path / "m.jsonl", ROWS)), max_questions=0)


def test_real_benchmarks_load() -> None:
    files = sorted(BENCH_DIR.glob("*.jsonl")) if BENCH_DIR.is_dir() else []
    if not files:
        pytest.skip(f"benchmark files not found under {BENCH_DIR} (shared/ beside the repo)")
    for f in files:
        qs = load_questions(str(f))
        n_lines = sum(1 for line in f.read_text(encoding="utf-8").splitlines() if line.strip())
        assert len(qs) == n_lines
        assert all(q.source == f.stem and q.question and q.answer for q in qs)
        assert len({q.id for q in qs}) == len(qs)


# --- Hugging Face datasets -----------------------------------------------------------------


def test_save_to_disk_round_trip(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_list(ROWS)
    ds.save_to_disk(str(tmp_path / "saved"))
    qs = load_questions(str(tmp_path / "saved"))
    assert [(q.question, q.answer) for q in qs] == [(r["question"], r["answer"]) for r in ROWS]
    assert [q.id for q in qs] == ["saved-0", "saved-1", "saved-2"]
    assert (
        load_questions(str(tmp_path / "saved"), max_questions=1)[0].question == ROWS[0]["question"]
    )


def test_save_to_disk_dataset_dict_splits(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    dd = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_list(ROWS[:1]),
            "test": datasets.Dataset.from_list([{"Problem": "T?", "Answer": "9", "id": "t-1"}]),
            "val": datasets.Dataset.from_list(ROWS[1:]),
        }
    )
    dd.save_to_disk(str(tmp_path / "dd"))
    test = load_questions(str(tmp_path / "dd"))  # several splits: defaults to test
    assert [(q.id, q.question, q.answer) for q in test] == [("t-1", "T?", "9")]
    assert len(load_questions(str(tmp_path / "dd"), split="val")) == 2
    with pytest.raises(DatasetError, match="no split 'dev'"):
        load_questions(str(tmp_path / "dd"), split="dev")


def test_parquet_dir_round_trip(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    d = tmp_path / "pq" / "data"
    d.mkdir(parents=True)
    datasets.Dataset.from_list(ROWS[:2]).to_parquet(str(d / "test-00000-of-00001.parquet"))
    datasets.Dataset.from_list(ROWS[2:]).to_parquet(str(d / "train-00000-of-00001.parquet"))
    all_q = load_questions(str(tmp_path / "pq"))
    assert sorted(q.question for q in all_q) == sorted(r["question"] for r in ROWS)
    test = load_questions(str(tmp_path / "pq"), split="test")
    assert [q.question for q in test] == [r["question"] for r in ROWS[:2]]
    single = load_questions(str(d / "train-00000-of-00001.parquet"))
    assert [(q.question, q.answer, q.source) for q in single] == [
        (ROWS[2]["question"], "2", "train-00000-of-00001")
    ]


def test_hf_missing_column(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_list([{"text": "x", "answer": "1"}]).save_to_disk(str(tmp_path / "nq"))
    with pytest.raises(DatasetError, match=r"row 0: missing question field"):
        load_questions(str(tmp_path / "nq"))
    with pytest.raises(DatasetError, match="no question column 'prompt'"):
        load_questions(str(tmp_path / "nq"), question_key="prompt")


def test_empty_hf_dataset(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_dict({"question": [], "answer": []}).save_to_disk(str(tmp_path / "e"))
    with pytest.raises(DatasetError, match="no questions in"):
        load_questions(str(tmp_path / "e"))
    datasets.Dataset.from_dict({"question": [], "answer": []}).to_parquet(
        str(tmp_path / "e.parquet")
    )
    with pytest.raises(DatasetError, match="no questions in"):
        load_questions(str(tmp_path / "e.parquet"))


def test_uncached_hub_name_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("datasets")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf" / "datasets"))
    with pytest.raises(DatasetError, match="offline") as e:
        load_questions("gambit-test-org/definitely-not-cached-xyz", split="test")
    assert "definitely-not-cached-xyz" in str(e.value)


# --- toy -----------------------------------------------------------------------------------


def test_toy_spec_parsing(monkeypatch: pytest.MonkeyPatch) -> None:
    import gambit_core.questions as questions_mod
    from gambit_core.questions import GeneratedSource

    calls: list[tuple[str, int]] = []

    def make_questions(split: str, n: int) -> list[Question]:
        calls.append((split, n))
        return [
            Question(f"toy-{split}-{i}", f"{i}+{i}=", str(2 * i), f"toy:{split}") for i in range(n)
        ]

    src = GeneratedSource("toy", ("train", "val", "test"), make_questions)
    monkeypatch.setattr(questions_mod, "generated_sources", lambda: {"toy": src})

    assert len(load_questions("toy:test:7")) == 7
    assert len(load_questions("toy:val", max_questions=3)) == 3
    assert len(load_questions("toy", split="train", max_questions=2)) == 2
    assert len(load_questions("toy:test:7", max_questions=4)) == 4
    assert calls == [("test", 7), ("val", 3), ("train", 2), ("test", 4)]
    for bad in ("toy:dev", "toy:test:x", "toy:test:0", "toy"):
        with pytest.raises(DatasetError):
            load_questions(bad)


def test_toy_real_module() -> None:
    pytest.importorskip("data_pipelines.toy.task")
    qs = load_questions("toy:test:5")
    assert len(qs) == 5 and all(isinstance(q, Question) for q in qs)
    assert all(q.question and q.answer for q in qs)


def test_the_toy_world_is_registered_through_entry_points() -> None:
    """The base layer finds the toy sources through the installed ``gambit.datasets`` entry
    points (no import of data_pipelines): their splits are the generators'."""
    from data_pipelines.toy.hard import HARD_SPLITS
    from data_pipelines.toy.task import SPLITS
    from gambit_core.questions import generated_sources

    srcs = generated_sources()
    assert srcs["toy"].splits == SPLITS and srcs["toy-hard"].splits == HARD_SPLITS
    assert srcs["toy-clean"].splits == HARD_SPLITS
    with pytest.raises(DatasetError, match="unknown dataset source 'toyz'.*toy, toy-clean, toy-hard"):
        load_questions("toyz:test:3")


def test_a_source_tree_that_is_not_installed_reads_its_entry_points_from_pyproject(monkeypatch):
    """On PYTHONPATH without `pip install` (the GPU script runs so) there is no installed
    metadata: the sources come from the repo's pyproject.toml instead."""
    import importlib.metadata

    import gambit_core.questions as qm

    monkeypatch.setattr(importlib.metadata, "entry_points", lambda **kw: [])
    qm.generated_sources.cache_clear()
    try:
        assert set(qm.generated_sources()) == {"toy", "toy-clean", "toy-hard"}
        assert len(load_questions("toy:test:3")) == 3
    finally:
        qm.generated_sources.cache_clear()
