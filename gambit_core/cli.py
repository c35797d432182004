"""The one CLI style of Gambit's console scripts (all but ``gambit-train``, which is Hydra):
argparse options built from a config dataclass, each field's docstring as its help.

    p = argparse.ArgumentParser(prog="gambit-harvest")
    add_dataclass_args(p, HarvestConfig, required=("out",))
    with input_errors(p.prog):
        harvest(HarvestConfig(**vars(p.parse_args())))

- ``--field-name VALUE`` for every int, float and str field (``X | None`` included);
- ``--flag`` / ``--no-flag`` for every bool field;
- a field whose metadata says ``"flag": False`` gets no option (one the application sets);
- a field of a base class (the sampling fields of :class:`gambit_core.sampling.SamplingConfig`,
  say) is documented once, where it is declared;
- :func:`add_verbose_arg` / :func:`quiet_logs`: one ``-v/--verbose`` and quiet logs by default
  (vLLM at ERROR, transformers at error) for every console script that starts an engine;
- :func:`input_errors` turns :class:`~gambit_core.errors.InputError` into one line on stderr
  and exit status 2, the same as argparse's own for a bad flag.

Field docstrings (the string literal under a field) are read from the class source with
``ast``, so ``--help`` needs no heavy import.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import inspect
import os
import sys
import textwrap
import types
import typing
from collections.abc import Iterable, Iterator

from gambit_core.errors import EXIT_BAD_INPUT, InputError


def field_docs(cls: type) -> dict[str, str]:
    """{field name: docstring} for a dataclass whose fields are followed by string literals
    (fields of its dataclass bases included; a subclass's docstring wins)."""
    docs: dict[str, str] = {}
    for c in reversed(cls.__mro__):
        if dataclasses.is_dataclass(c):
            docs.update(_own_field_docs(c))
    return docs


def _own_field_docs(cls: type) -> dict[str, str]:
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


def add_dataclass_args(p: argparse.ArgumentParser, cls: type, *, required: Iterable[str] = (),
                       skip: Iterable[str] = (), prefix: str = "", defaults: bool = True) -> None:
    """Add ``--<prefix><field-name>`` for each scalar field of ``cls`` (dest:
    ``<prefix_>field_name``; bools as ``--flag/--no-flag``).

    ``defaults=False`` leaves a flag that is not given out of the parsed namespace, so a caller
    can tell the flags given on the command line (which win over a config file) from defaults.
    """
    docs, hints = field_docs(cls), typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name in skip or not f.init or f.metadata.get("flag") is False:
            continue
        typ = _scalar_type(hints.get(f.name, str))
        if typ not in (int, float, str, bool):
            continue
        default = f.default if f.default is not dataclasses.MISSING else None
        kw: dict = {"required": True} if f.name in required else {
            "default": default if defaults else argparse.SUPPRESS}
        help_ = docs.get(f.name, "")
        if f.name not in required:
            help_ += f" (default: {default})"
        help_ = help_.replace("%", "%%")
        flag = f"--{prefix}{f.name.replace('_', '-')}"
        dest = f"{prefix.replace('-', '_')}{f.name}"
        if typ is bool:
            p.add_argument(flag, dest=dest, action=argparse.BooleanOptionalAction,
                           help=help_.strip(), **kw)
        else:
            p.add_argument(flag, dest=dest, type=typ, help=help_.strip(), **kw)


def add_verbose_arg(p: argparse.ArgumentParser, what: str = "vLLM's INFO logs") -> None:
    """The console scripts' one ``-v/--verbose`` flag (read by :func:`quiet_logs`)."""
    p.add_argument("-v", "--verbose", action="store_true", help=f"show {what}")


def quiet_logs(verbose: bool) -> None:
    """Quiet vLLM and transformers unless ``verbose`` (call before anything imports them; a
    level the user set in the environment wins)."""
    if not verbose:
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


@contextlib.contextmanager
def input_errors(prog: str) -> Iterator[None]:
    """Print an :class:`InputError` as ``<prog>: error: <one line>`` and exit with status 2."""
    try:
        yield
    except InputError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        raise SystemExit(EXIT_BAD_INPUT) from None
