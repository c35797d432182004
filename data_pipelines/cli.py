"""Build argparse options from a config dataclass, with each field's docstring as its help.

    p = argparse.ArgumentParser()
    add_dataclass_args(p, HarvestConfig, required=("out",))
    cfg = HarvestConfig(**vars(p.parse_args()))

Field docstrings (the string literal under a field) are read from the class source with
``ast``, so ``--help`` needs no heavy import.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import textwrap
import types
import typing
from collections.abc import Iterable


def field_docs(cls: type) -> dict[str, str]:
    """{field name: docstring} for a dataclass whose fields are followed by string literals."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    docs: dict[str, str] = {}
    for a, b in zip(body, body[1:], strict=False):
        if isinstance(a, ast.AnnAssign) and isinstance(a.target, ast.Name) and isinstance(b, ast.Expr) \
                and isinstance(b.value, ast.Constant) and isinstance(b.value.value, str):
            docs[a.target.id] = " ".join(b.value.value.split())
    return docs


def _scalar_type(tp) -> type:
    """The scalar type behind ``X | None`` / ``Optional[X]`` annotations."""
    if isinstance(tp, str):
        tp = {"int": int, "float": float, "str": str, "bool": bool}.get(tp.split("|")[0].strip(), str)
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        return args[0] if args else str
    return tp if isinstance(tp, type) else str


def _bool(s: str) -> bool:
    if s.lower() in ("1", "true", "yes", "on"):
        return True
    if s.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true/false, got {s!r}")


def add_dataclass_args(p: argparse.ArgumentParser, cls: type, *, required: Iterable[str] = (),
                       skip: Iterable[str] = (), prefix: str = "") -> None:
    """Add ``--field-name`` for each scalar field of ``cls``."""
    docs, hints = field_docs(cls), typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name in skip or not f.init:
            continue
        typ = _scalar_type(hints.get(f.name, str))
        if typ not in (int, float, str, bool):
            continue
        default = f.default if f.default is not dataclasses.MISSING else None
        kw: dict = {"required": True} if f.name in required else {"default": default}
        help_ = docs.get(f.name, "")
        if f.name not in required:
            help_ += f" (default: {default})"
        help_ = help_.replace("%", "%%")
        p.add_argument(f"--{prefix}{f.name.replace('_', '-')}", dest=f"{prefix.replace('-', '_')}{f.name}",
                       type=_bool if typ is bool else typ, help=help_.strip(), **kw)
