"""Load evaluation questions (``{"question", "answer"}``) from JSONL, local HF datasets or toy splits.

One entry point, :func:`load_questions`, turns a *spec* string into ``list[Question]``:

* ``path/to/file.jsonl``: one JSON object per line with ``question`` and ``answer``
  (optional ``id``; otherwise the id is ``f"{file stem}-{0-based line index}"``);
* a local Hugging Face dataset: a directory written by ``Dataset.save_to_disk`` /
  ``DatasetDict.save_to_disk``, a ``.parquet`` file, or a directory of parquet files;
* a Hugging Face hub name that is already in the local cache (``"org/name"``); loading runs
  with ``HF_DATASETS_OFFLINE=1`` forced, so nothing is downloaded;
* a generated source ``<name>:<split>[:<count>]``, registered under the ``gambit.datasets``
  entry points (:class:`GeneratedSource`). The project registers two, from its toy world:
  ``toy:train`` / ``toy:val`` / ``toy:test`` (``data_pipelines.toy.task``) and
  ``toy-hard:val`` / ``toy-hard:test`` (``data_pipelines.toy.hard``; no ``toy-hard:train``:
  the split is for evaluation only).

Usage::

    from gambit_core.questions import load_questions

    qs = load_questions("../shared/benchmarks/aime_2025.jsonl")
    qs = load_questions("data/math500", split="test", max_questions=100)
    qs = load_questions("toy:test:500")
    qs = load_questions("toy-hard:val:60")
    qs[0].id, qs[0].question, qs[0].answer, qs[0].source

Dataset columns: ``question`` / ``answer`` by default, with ``problem`` / ``Problem`` and
``Answer`` / ``solution`` accepted as fallbacks (an answer taken from a ``solution`` column
is reduced to its last ``\\boxed{}`` when it has one); pass ``question_key`` /
``answer_key`` to name them. Bad input raises :class:`~gambit_core.errors.DatasetError` with
the file, line or row at fault. Reading Hugging Face datasets (saved, parquet, the hub cache)
is :mod:`gambit_core.hf_datasets`; this module turns their rows into questions.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gambit_core import hf_datasets
from gambit_core.errors import DatasetError

__all__ = [
    "GeneratedSource",
    "Question",
    "TOY_DEFAULT_COUNT",
    "load_questions",
]

#: Questions generated for a ``toy:<split>`` / ``toy-hard:<split>`` spec given without a
#: count or ``max_questions``.
TOY_DEFAULT_COUNT: int = 500

QUESTION_KEYS: tuple[str, ...] = ("question", "problem", "Problem")
ANSWER_KEYS: tuple[str, ...] = ("answer", "Answer", "solution")

_JSONL_SUFFIXES = (".jsonl", ".ndjson")


@dataclass(frozen=True, slots=True)
class Question:
    """One evaluation question with its gold answer (a LaTeX/plain string)."""

    id: str
    question: str
    answer: str
    source: str


def load_questions(
    spec: str,
    *,
    split: str | None = None,
    max_questions: int | None = None,
    question_key: str | None = None,
    answer_key: str | None = None,
    config: str | None = None,
) -> list[Question]:
    """Load questions from ``spec`` (JSONL path, local HF dataset, cached hub name, ``toy:``,
    ``toy-hard:``).

    Args:
        spec: where the questions are (see the module docstring).
        split: split of a ``DatasetDict`` / hub dataset / parquet layout (``data/test-*.parquet``),
            or of ``toy`` / ``toy-hard``. A dataset with several splits and no ``split`` given
            uses ``test`` when it has one, else it is an error.
        max_questions: keep only the first N questions (for ``toy:`` / ``toy-hard:`` without a
            count: generate N).
        question_key, answer_key: column names; default: the first of ``question``, ``problem``,
            ``Problem`` / ``answer``, ``Answer``, ``solution`` that is present.
        config: dataset configuration name for hub datasets (e.g. ``"main"``).

    Raises:
        DatasetError: missing path, malformed line, missing field, empty result, uncached hub name.
    """
    if max_questions is not None and max_questions < 1:
        raise ValueError(f"max_questions must be >= 1 (got {max_questions})")
    spec = spec.strip()
    if not spec:
        raise DatasetError("empty dataset spec")

    src = _generated_source(spec)
    if src is not None:
        questions = _load_generated(src, spec, split, max_questions)
    else:
        path = Path(spec).expanduser()
        if path.exists():
            questions = _load_path(path, split, max_questions, question_key, answer_key)
        elif _looks_like_path(spec):
            raise DatasetError(f"dataset path does not exist: {spec}")
        elif ":" in spec:  # hub names hold no colon: a generated source that is not installed
            known = ", ".join(sorted(generated_sources())) or "none: is gambit installed?"
            raise DatasetError(f"unknown dataset source {spec.split(':', 1)[0]!r} in {spec!r} "
                               f"(generated sources: {known})")
        else:
            questions = _load_hub(spec, split, config, max_questions, question_key, answer_key)

    if max_questions is not None:
        questions = questions[:max_questions]
    if not questions:
        raise DatasetError(f"no questions in {spec}" + (f" (split {split!r})" if split else ""))
    _check_unique_ids(questions, spec)
    return questions


# ---------------------------------------------------------------------------------------
# generated sources (the toy world): plugins found through entry points
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GeneratedSource:
    """Questions generated in code, named ``<name>:<split>[:<count>]`` in a spec.

    A package above this layer registers one under the ``gambit.datasets`` entry-point group
    (pyproject.toml), so the base layer loads ``toy:test`` without importing the toy world."""

    name: str
    """The spec's prefix ("toy")."""
    splits: tuple[str, ...]
    """The splits it generates."""
    make: Callable[[str, int], Sequence[Question]]
    """(split, count) -> the questions."""
    refused: Mapping[str, str] = field(default_factory=dict)
    """{split: why it is not offered}, for a clearer error ("toy-hard:train")."""


@functools.cache
def generated_sources() -> dict[str, GeneratedSource]:
    """{name: source} of every installed ``gambit.datasets`` entry point (run from a source
    tree that is not installed, the ones its ``pyproject.toml`` declares)."""
    from importlib.metadata import EntryPoint, entry_points

    eps = list(entry_points(group="gambit.datasets"))
    if not eps:  # a source tree on PYTHONPATH, not installed: its pyproject.toml declares them
        import tomllib

        pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
        if pyproject.is_file():
            decl = tomllib.loads(pyproject.read_text()).get("project", {}).get(
                "entry-points", {}).get("gambit.datasets", {})
            eps = [EntryPoint(name, value, "gambit.datasets") for name, value in decl.items()]
    out = {}
    for ep in eps:
        src = ep.load()
        out[src.name] = src
    return out


def _generated_source(spec: str) -> GeneratedSource | None:
    name = spec.split(":", 1)[0]
    return generated_sources().get(name)


def _load_generated(
    src: GeneratedSource, spec: str, split: str | None, max_questions: int | None
) -> list[Question]:
    name, splits = src.name, src.splits
    parts = spec.split(":")
    if len(parts) > 3:
        raise DatasetError(f"bad {name} spec {spec!r}: expected {name}:<split>[:<count>]")
    toy_split = parts[1] if len(parts) > 1 and parts[1] else split
    if toy_split is None:
        raise DatasetError(f"{name} spec {spec!r} needs a split: one of {', '.join(splits)}")
    if split is not None and split != toy_split:
        raise DatasetError(f"{name} spec {spec!r} conflicts with split={split!r}")
    if toy_split not in splits:
        why = f" ({src.refused[toy_split]})" if toy_split in src.refused else ""
        raise DatasetError(
            f"unknown {name} split {toy_split!r}: expected one of {', '.join(splits)}{why}"
        )
    if len(parts) == 3:
        try:
            n = int(parts[2])
        except ValueError:
            raise DatasetError(
                f"bad {name} count in {spec!r}: {parts[2]!r} is not an integer"
            ) from None
        if n < 1:
            raise DatasetError(f"bad {name} count in {spec!r}: must be >= 1")
        if max_questions is not None:
            n = min(n, max_questions)
    else:
        n = max_questions if max_questions is not None else TOY_DEFAULT_COUNT
    try:
        return list(src.make(toy_split, n))
    except ValueError as e:  # e.g. too few qualifying questions under the source's config
        raise DatasetError(f"{spec}: {e}") from None


# ---------------------------------------------------------------------------------------
# local paths
# ---------------------------------------------------------------------------------------


def _looks_like_path(spec: str) -> bool:
    if spec.startswith(("/", "./", "../", "~", ".\\")) or os.path.isabs(spec):
        return True
    if spec.lower().endswith((*_JSONL_SUFFIXES, ".json", ".parquet", ".csv", ".arrow")):
        return True
    # A hub name is "name" or "owner/name"; anything deeper is a path.
    return spec.count("/") > 1 or "\\" in spec


def _load_path(
    path: Path,
    split: str | None,
    max_questions: int | None,
    question_key: str | None,
    answer_key: str | None,
) -> list[Question]:
    if path.is_file():
        suffix = path.suffix.lower()
        if suffix in _JSONL_SUFFIXES:
            return _load_jsonl(path, question_key, answer_key)
        if suffix == ".parquet":
            ds = hf_datasets.load_parquet([path], path, split)
            return _from_hf(ds, str(path), path.stem, max_questions, question_key, answer_key)
        raise DatasetError(
            f"unsupported dataset file {path}: expected .jsonl, .parquet, or a dataset directory"
        )
    if path.is_dir():
        if (
            (path / "dataset_info.json").exists()
            or (path / "dataset_dict.json").exists()
            or (path / "state.json").exists()
        ):
            ds = hf_datasets.load_saved(path, split)
            return _from_hf(ds, str(path), path.name, max_questions, question_key, answer_key)
        parquet = sorted(p for p in path.rglob("*.parquet") if p.is_file())
        if parquet:
            ds = hf_datasets.load_parquet(parquet, path, split)
            return _from_hf(ds, str(path), path.name, max_questions, question_key, answer_key)
        raise DatasetError(
            f"{path} is a directory but neither a saved dataset (save_to_disk) nor has parquet files"
        )
    raise DatasetError(f"dataset path is not a file or directory: {path}")


def _load_jsonl(path: Path, question_key: str | None, answer_key: str | None) -> list[Question]:
    questions: list[Question] = []
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise DatasetError(f"{path}: not UTF-8 text ({e})") from None
    for idx, line in enumerate(text.splitlines()):
        lineno = idx + 1
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise DatasetError(f"{where}: malformed JSON on line {lineno} ({e.msg})") from None
        if not isinstance(row, dict):
            raise DatasetError(
                f"{where}: line {lineno} is a JSON {type(row).__name__}, expected an object"
            )
        q, a = _question_answer(row, where, question_key, answer_key)
        qid = row.get("id")
        qid = f"{path.stem}-{idx}" if qid is None or str(qid) == "" else str(qid)
        questions.append(Question(id=qid, question=q, answer=a, source=path.stem))
    return questions


def _question_answer(
    row: Mapping[str, Any], where: str, question_key: str | None, answer_key: str | None
) -> tuple[str, str]:
    q_key = _pick_key(row, question_key, QUESTION_KEYS)
    a_key = _pick_key(row, answer_key, ANSWER_KEYS)
    q = _field(row, q_key, question_key, QUESTION_KEYS, "question", where)
    a = _field(row, a_key, answer_key, ANSWER_KEYS, "answer", where)
    if a_key == "solution":
        from gambit_core.grading import extract_boxed

        a = extract_boxed(a) or a
    return q, a


def _pick_key(row: Mapping[str, Any], key: str | None, fallbacks: Sequence[str]) -> str | None:
    if key is not None:
        return key if key in row else None
    return next((k for k in fallbacks if k in row and row[k] is not None), None)


def _field(
    row: Mapping[str, Any],
    key: str | None,
    explicit: str | None,
    fallbacks: Sequence[str],
    what: str,
    where: str,
) -> str:
    tried = repr(explicit) if explicit is not None else " / ".join(repr(k) for k in fallbacks)
    if key is None:
        raise DatasetError(f"{where}: missing {what} field (looked for {tried})")
    value = row[key]
    if value is None:
        raise DatasetError(f"{where}: {what} field {key!r} is null")
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise DatasetError(
            f"{where}: {what} field {key!r} is a {type(value).__name__}, expected a string"
        )
    text = str(value).strip()
    if not text:
        raise DatasetError(f"{where}: {what} field {key!r} is empty")
    return text


def _check_unique_ids(questions: Sequence[Question], spec: str) -> None:
    seen: set[str] = set()
    for q in questions:
        if q.id in seen:
            raise DatasetError(f"duplicate question id {q.id!r} in {spec}")
        seen.add(q.id)


# ---------------------------------------------------------------------------------------
# Hugging Face datasets: rows to questions (the loading is in gambit_core.hf_datasets)
# ---------------------------------------------------------------------------------------


def _load_hub(
    name: str,
    split: str | None,
    config: str | None,
    max_questions: int | None,
    question_key: str | None,
    answer_key: str | None,
) -> list[Question]:
    ds = hf_datasets.load_hub(name, split, config)
    return _from_hf(ds, name, name.replace("/", "_"), max_questions, question_key, answer_key)


def _from_hf(
    ds: Any,
    where: str,
    source: str,
    max_questions: int | None,
    question_key: str | None,
    answer_key: str | None,
) -> list[Question]:
    columns = list(getattr(ds, "column_names", None) or [])
    for key, what in ((question_key, "question"), (answer_key, "answer")):
        if key is not None and columns and key not in columns:
            raise DatasetError(f"{where}: no {what} column {key!r} (columns: {', '.join(columns)})")
    if max_questions is not None and hasattr(ds, "select") and hasattr(ds, "__len__"):
        ds = ds.select(range(min(max_questions, len(ds))))
    questions: list[Question] = []
    for i, row in enumerate(ds):
        q, a = _question_answer(row, f"{where}: row {i}", question_key, answer_key)
        rid = row.get("id")
        qid = f"{source}-{i}" if rid is None or str(rid) == "" else str(rid)
        questions.append(Question(id=qid, question=q, answer=a, source=source))
    return questions
