"""How a global and an allow entry are spelled: one canonical name, one entry parser.

A pickle may name one global several ways (``numpy.core.multiarray`` and numpy 2's
``numpy._core.multiarray``; ``__builtin__`` in Python 2 pickles), and a caller may split a
dotted name anywhere (``("module", "Class.method")``). :func:`canonical` gives each global
one key, so the allowlist, ``allow=``, the process-wide sources and the deny list are all
asked about the same string (``_gate.judge``); that key is typed :data:`Key`, which only
:func:`canonical` makes, so the allowlist cannot be indexed by a spelling judge never asks
about. :func:`parse` is the one reader of allow entries, whatever their source: ``allow=``,
``compatshim.checkpoint.allow``, ``COMPATSHIM_ALLOW``, the allow file and entry points.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple, NewType

from .. import _settings
from .._text import short

RESOLVER = _settings.RESOLVER_PREFIX  # "omegaconf-resolver:NAME": a resolver, never a global
UNRESOLVED: Any = object()  # the object of a string entry, imported only when a file needs it
_QUALNAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+")
# a resolver name as omegaconf's grammar spells one (``eval``, ``oc.env``); never computed
_RESOLVER_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*(\.[A-Za-z_][A-Za-z0-9_-]*)*")


Key = NewType("Key", str)
"""A global's canonical name (pypa/packaging's ``NormalizedName`` pattern): built only by
:func:`canonical` / :func:`canonical_name`, so mypy refuses a raw qualname where one is due."""


def canonical(module: str, name: str) -> Key:
    """The one key of the global ``module.name``: numpy's core under numpy 2's name,
    ``__builtin__`` as ``builtins``. Any split of a dotted name gives the same key; linear
    in the name (a file may name a 1 MiB module)."""
    return canonical_name(f"{module}.{name}")


def canonical_name(qualname: str) -> Key:
    """:func:`canonical` of a dotted name already joined."""
    for old, new in _ALIASES:
        if qualname.startswith(old):
            return Key(new + qualname[len(old) :])
    return Key(qualname)


# module prefixes one global is pickled under, to the spelling judged (numpy 2 renamed
# numpy.core; Python 2 pickles name builtins __builtin__)
_ALIASES = (("numpy.core.", "numpy._core."), ("__builtin__.", "builtins."))


def spellings(key: str) -> tuple[str, ...]:
    """``key`` and the other spellings it stands for (numpy 1.x's ``numpy.core``), for a
    lookup in the modules imported now (no import)."""
    for old, new in _ALIASES:
        if key.startswith(new):
            return key, old + key[len(new) :]
    return (key,)


class Parsed(NamedTuple):
    """One allow entry: its key (:func:`canonical`, or ``omegaconf-resolver:NAME``), the
    object (:data:`UNRESOLVED` for a string, None for a resolver) and the name as written."""

    key: str
    obj: Any
    written: str

    @property
    def resolver(self) -> bool:
        return self.key.startswith(RESOLVER)


def parse(item: Any, where: str = "allow=", strict: bool = False) -> Parsed:
    """An entry: a ``"module.name"`` string, an ``"omegaconf-resolver:NAME"`` string, an
    ``(object, "module.name")`` pair or a class/function. ``strict`` (the environment, the
    allow file, entry points): a string must be an ASCII dotted name, else SettingError;
    otherwise a malformed entry is a TypeError."""
    if isinstance(item, str):
        if item.startswith(RESOLVER):
            name = item[len(RESOLVER) :]
            if not _RESOLVER_NAME.fullmatch(name):
                error = (
                    f"{where}: {short(item, 80)} does not name a resolver ('{RESOLVER}NAME', NAME "
                    "such as eval or oc.env; a computed resolver name is never allowed)"
                )
                raise _settings.SettingError(error) if strict else TypeError(error)
            return Parsed(item, None, item)
        if strict and not _QUALNAME.fullmatch(item):
            error = f"{where}: {short(item, 80)} is not a 'module.name' global"
            raise _settings.SettingError(error)
        module, _, name = item.rpartition(".")
        if not module:
            raise TypeError(f"{where} string {short(item, 80)} is not 'module.name'")
        return Parsed(canonical(module, name), UNRESOLVED, item)
    if isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], str):
        module, _, name = item[1].rpartition(".")
        return Parsed(canonical(module, name), item[0], item[1])
    if hasattr(item, "__module__") and hasattr(item, "__qualname__"):
        written = f"{item.__module__}.{item.__qualname__}"
        return Parsed(canonical(item.__module__, item.__qualname__), item, written)
    raise TypeError(
        f"{where} takes classes, functions, 'module.name' strings or "
        f"(object, 'module.name') pairs, got {type(item).__name__}"
    )


def parse_text(raw: str, where: str) -> tuple[list[Parsed], list[str]]:
    """Entries separated by commas or whitespace (``COMPATSHIM_ALLOW``; the allow file takes
    one entry a line, ``process_allow._parse_file``), and why each malformed one was
    skipped: a bad entry costs only itself (it admits nothing), never the entries beside it."""
    entries: list[Parsed] = []
    skipped: list[str] = []
    for part in re.split(r"[\s,]+", raw):
        if part:
            try:
                entries.append(parse(part, where, strict=True))
            except _settings.SettingError as exc:
                skipped.append(str(exc))
    return entries, skipped
