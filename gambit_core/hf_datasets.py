"""Hugging Face datasets for :func:`gambit_core.questions.load_questions`: reading a saved
dataset, parquet files or a cached hub dataset, offline, into a ``datasets.Dataset`` of one
split; the rows become questions in :mod:`gambit_core.questions`.

    from gambit_core import hf_datasets
    ds = hf_datasets.load_saved(Path("data/math500"), "test")
    ds = hf_datasets.load_parquet(files, root, split=None)
    ds = hf_datasets.load_hub("org/name", split="test", config=None)   # from the cache only

``datasets`` is imported when a loader is called. Bad input raises
:class:`~gambit_core.errors.DatasetError` with the file or split at fault.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from gambit_core.errors import DatasetError

__all__ = ["load_hub", "load_parquet", "load_saved"]


def load_saved(path: Path, split: str | None) -> Any:
    """A ``save_to_disk`` dataset (its ``split``, or the one :func:`_pick_split` picks)."""
    import datasets

    if _saved_split_is_empty(path, split):
        raise DatasetError(f"no questions in {path}" + (f" (split {split!r})" if split else ""))
    try:
        ds = datasets.load_from_disk(str(path))
    except Exception as e:  # corrupt / partial directory
        raise DatasetError(f"cannot load saved dataset {path}: {e}") from e
    return _pick_split(ds, split, str(path))


def load_parquet(files: Sequence[Path], root: Path, split: str | None) -> Any:
    """Parquet ``files`` (under ``root``; with ``split``, only that split's) as one dataset."""
    import datasets

    if split is not None and root.is_dir():
        chosen = [f for f in files if _file_in_split(f.relative_to(root), split)]
        if not chosen:
            raise DatasetError(f"no parquet files for split {split!r} under {root}")
        files = chosen
    if _parquet_rows(files) == 0:
        raise DatasetError(f"no questions in {root}" + (f" (split {split!r})" if split else ""))
    try:
        ds = datasets.load_dataset("parquet", data_files=[str(f) for f in files], split="train")
    except Exception as e:
        raise DatasetError(f"cannot read parquet dataset {root}: {e}") from e
    return ds


def _saved_split_is_empty(path: Path, split: str | None) -> bool:
    """True when a save_to_disk dataset (or its chosen split) has no data files.

    ``datasets`` cannot load an empty saved dataset (it fails with an IndexError), so this
    is checked up front to report an empty dataset as such.
    """
    state = path / "state.json"
    if not state.exists() and split is not None:
        state = path / split / "state.json"
    if not state.exists():
        return False
    try:
        files = json.loads(state.read_text(encoding="utf-8")).get("_data_files")
    except (OSError, ValueError, AttributeError):
        return False
    return files == []


def _parquet_rows(files: Sequence[Path]) -> int | None:
    """Total row count from parquet metadata; None when it cannot be read."""
    try:
        import pyarrow.parquet as pq

        return sum(pq.ParquetFile(str(f)).metadata.num_rows for f in files)
    except Exception:
        return None


def _file_in_split(rel: Path, split: str) -> bool:
    if split in rel.parts[:-1]:
        return True
    stem = rel.stem
    return stem == split or stem.startswith((f"{split}-", f"{split}_", f"{split}."))


def load_hub(name: str, split: str | None, config: str | None) -> Any:
    """The hub dataset ``name`` (its ``split``; ``config``: its configuration) from the local
    Hugging Face cache, offline: nothing is downloaded."""
    with _hf_offline():
        import datasets

        try:
            ds = datasets.load_dataset(name, config, split=split)
        except Exception as e:
            raise DatasetError(
                f"{name!r} is not a local path and could not be loaded from the Hugging Face "
                f"cache (offline mode, HF_DATASETS_OFFLINE=1: nothing is downloaded; is it cached"
                f"{'' if split is None else f' with split {split!r}'}?): "
                f"{type(e).__name__}: {e}"
            ) from e
        return _pick_split(ds, split, name)


@contextlib.contextmanager
def _hf_offline() -> Iterator[None]:
    """Force offline mode for datasets / huggingface_hub, also if they are already imported."""
    env_keys = ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE")
    old_env = {k: os.environ.get(k) for k in env_keys}
    for k in env_keys:
        os.environ[k] = "1"
    patched: list[tuple[Any, str, Any]] = []
    try:
        import datasets.config as dcfg

        for attr in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):
            if hasattr(dcfg, attr):
                patched.append((dcfg, attr, getattr(dcfg, attr)))
                setattr(dcfg, attr, True)
        with contextlib.suppress(ImportError):
            import huggingface_hub.constants as hcst

            if hasattr(hcst, "HF_HUB_OFFLINE"):
                patched.append((hcst, "HF_HUB_OFFLINE", hcst.HF_HUB_OFFLINE))
                hcst.HF_HUB_OFFLINE = True
        yield
    finally:
        for obj, attr, value in reversed(patched):
            setattr(obj, attr, value)
        for k, v in old_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _pick_split(ds: Any, split: str | None, where: str) -> Any:
    import datasets

    if isinstance(ds, datasets.DatasetDict | datasets.IterableDatasetDict):
        names = list(ds.keys())
        if split is not None:
            if split not in ds:
                raise DatasetError(f"{where} has no split {split!r} (splits: {', '.join(names)})")
            return ds[split]
        if len(names) == 1:
            return ds[names[0]]
        if "test" in ds:
            return ds["test"]
        raise DatasetError(f"{where} has several splits ({', '.join(names)}): pass split=")
    return ds
