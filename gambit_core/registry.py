"""One registry mechanism for the project's plug-in points: scorer kinds
(``gambit_scorer.kinds``), engines (``gambit_search.engines``) and search methods
(``gambit_search.methods``).

A :class:`Registry` maps names to entries and turns an unknown name into the error its
owner words (each names the known ones its own way, for its own flag or config key).
An entry may be stored as is or loaded on first use (the methods keep module names, so
``--help`` imports none of them)::

    from gambit_core.registry import Registry

    ENGINES = Registry(lambda name, known: InputError(f"--engine must be one of ..."))
    ENGINES.add("fake", FakeKind())
    ENGINES.get("fake"); ENGINES.names()            # sorted names
    METHODS = Registry(unknown, entries={"sc": "gambit_search.methods.sc"},
                       load=lambda mod: importlib.import_module(mod).METHOD)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, Generic, TypeVar

__all__ = ["Registry"]

T = TypeVar("T")


class Registry(Generic[T]):
    """Named entries of one sort, in registration order.

    ``unknown(name, known)`` builds the exception :meth:`get` raises for a name not
    registered (``known``: the sorted names); ``entries``: the first ones, {name: entry};
    ``load`` turns a stored entry into the value :meth:`get` returns (default: the entry
    itself), called on every :meth:`get`."""

    def __init__(self, unknown: Callable[[Any, tuple[str, ...]], Exception], *,
                 entries: Mapping[str, Any] | None = None,
                 load: Callable[[Any], T] | None = None, what: str = "entry") -> None:
        self._entries: dict[str, Any] = {}
        self._unknown = unknown
        self._load = load
        self.what = what
        """What an entry is, for the message of a name registered twice ("scorer kind")."""
        for name, entry in (entries or {}).items():
            self.add(name, entry)

    def add(self, name: str, entry: Any) -> None:
        """Register ``entry`` as ``name``; ValueError when the name is taken."""
        if name in self._entries:
            raise ValueError(f"{self.what} {name!r} is registered twice")
        self._entries[name] = entry

    def names(self) -> tuple[str, ...]:
        """The registered names, sorted."""
        return tuple(sorted(self._entries))

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._entries

    def get(self, name: Any) -> T:
        """The entry called ``name``; the owner's ``unknown`` error when there is none."""
        if name not in self:
            raise self._unknown(name, self.names())
        entry = self._entries[name]
        return entry if self._load is None else self._load(entry)

    def __iter__(self) -> Iterator[T]:
        """The entries in registration order (loaded)."""
        return (self.get(n) for n in list(self._entries))
