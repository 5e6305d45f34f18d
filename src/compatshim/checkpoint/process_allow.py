"""Process-wide allow entries: globals every checkpoint load in this process accepts.

``allow=`` admits globals for one ``compatshim.checkpoint.load`` call; frameworks
call ``torch.load``, which has no such argument. These entries reach both, from
four sources, each entry with a reason:

code
    ``compatshim.checkpoint.allow("module.name", ..., reason="...")`` (and
    ``disallow``): strings, classes/functions, or ``(object, "module.name")``.
environment
    ``COMPATSHIM_ALLOW="module.name,module.name"``, for processes you do not write.
file
    ``COMPATSHIM_ALLOW_FILE=path``: one ``module.name`` a line, an optional ``# reason``
    after it (a line of several words is one malformed entry).
entry points
    group ``compatshim.allow``: each names a list of entries, or a callable
    returning one, so a framework can ship entries for its own checkpoints.
    An entry is a ``"module.name"`` string, a ``("module.name", "reason")``
    pair, or a class/function.

Every source also takes ``omegaconf-resolver:NAME`` (``NAME`` a plain resolver
name such as ``eval``): loaded omegaconf configs may keep ``${NAME:...}``
interpolations, as ``allow=["omegaconf-resolver:NAME"]`` lets one call
(``_omegaconf.py``; a resolver name computed by an interpolation is refused
whatever is allowed). These are consulted only when a config calls a resolver
outside omegaconf's safe ones, and never name a global.

Only ``_gate.judge`` consults them, for a global that neither compatshim's
allowlist nor the call's ``allow=`` admits and the deny list does not name: a
load that needs none of them never reads the file or the entry points, and a
string names a module that is imported only when a file needs it. An entry never
replaces the allowlist's handling of a global it already lists. Entries are read
by ``_names.parse``, as ``allow=`` is. A malformed entry in the variable, the file or an
entry point's list is warned about once and skipped, admitting nothing, while the entries
beside it stay in force; a file that cannot be read, or an entry point that cannot be loaded
or gives no list, is warned about once and ignored.
Ignoring an entry only makes loading stricter.
Allowed classes are constructed and functions called with the file's
arguments, as with ``allow=``: name only globals you trust.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Iterable, Iterator

from .. import _settings
from .._engine import decisions
from .._text import names, short
from ._names import RESOLVER, UNRESOLVED, Parsed, parse, parse_text
from .deny import REFUSAL as DENIED_REFUSAL
from .deny import denied_entry

GROUP = "compatshim.allow"
MAX_FILE_BYTES = 1 << 20

Key = str  # ``_names.canonical`` of a global, or "omegaconf-resolver:NAME"


@dataclass(frozen=True)
class Allowed:
    """One process-wide entry: the global, why it is trusted, and where it was declared."""

    qualname: str
    reason: str
    source: str


_lock = threading.Lock()
_code: dict[Key, tuple[Any, Allowed]] = {}  # the object, or UNRESOLVED for a string
_entry_points: dict[Key, tuple[Any, Allowed]] | None = None
_file: tuple[Any, dict[Key, tuple[Any, Allowed]]] | None = None  # (stat key, entries)


def allow(*globals: Any, reason: str) -> None:
    """Let every checkpoint load in this process use ``globals`` (idempotent, thread-safe).

    ``reason`` says why they are trusted (shown by ``allowed()`` and the
    doctor). Strings are not imported here, only when a file needs them.
    """
    if not isinstance(reason, str):
        raise TypeError(
            f"allow(): reason must be a str (why they are trusted), got {short(reason)}"
        )
    if not reason.strip():
        raise ValueError("allow() needs a reason: why these globals are trusted")
    found = [parse(item, "allow()") for item in globals]  # the same items and errors as allow=
    for entry in found:
        why = None if entry.resolver else denied_entry(entry.key, _object(entry))
        if why is not None:
            raise ValueError(f"{entry.written} is {DENIED_REFUSAL}: {why}")
    with _lock:
        for entry in found:
            _code[entry.key] = (
                entry.obj,
                Allowed(entry.written, reason.strip(), "compatshim.checkpoint.allow"),
            )


def disallow(*globals: Any) -> None:
    """Undo :func:`allow` for ``globals`` (entries from other sources stay)."""
    found = [parse(item, "disallow()") for item in globals]
    with _lock:
        for entry in found:
            _code.pop(entry.key, None)


def _object(entry: Parsed) -> Any:
    return None if entry.obj is UNRESOLVED else entry.obj


def allowed() -> list[Allowed]:
    """Every process-wide entry from every source, code first (reads the file, entry points)."""
    found: dict[Key, Allowed] = {}
    for source in _sources():
        for key, (_, entry) in source.items():
            found.setdefault(key, entry)
    return list(found.values())


def declared(key: str) -> tuple[Any, Allowed] | None:
    """The first process-wide entry for the global ``key`` (``_names.canonical``): (object or
    UNRESOLVED, entry), or None. Sources are read in order and only as far as needed: entry
    points last. Only ``_gate.judge`` asks, after the allowlist and the deny list."""
    if key.startswith(RESOLVER):  # a pickle may spell any module: a resolver is no global
        return None
    return _first(key)


def _first(key: Key) -> tuple[Any, Allowed] | None:
    for source in _sources():
        hit = source.get(key)
        if hit is not None:
            return hit
    return None


def admits_resolver(name: str) -> bool:
    """Whether a process-wide ``omegaconf-resolver:NAME`` entry names ``name`` (never "")."""
    return bool(name) and _first(RESOLVER + name) is not None


class Resolvers:
    """The omegaconf resolvers one load keeps: its ``allow=`` ones, then process-wide ones
    (the sources read only when a config calls a resolver outside the safe ones)."""

    def __init__(self, call: Any) -> None:
        self.call = call

    def __contains__(self, name: object) -> bool:
        return type(name) is str and (name in self.call or admits_resolver(name))

    def __iter__(self) -> Iterator[str]:  # Container needs only __contains__; for repr/debug
        return iter(self.call)


def _sources() -> Iterable[dict[Key, tuple[Any, Allowed]]]:
    with _lock:
        code = dict(_code)
    yield code
    yield _from_environment()
    yield _from_file()
    yield _from_entry_points()


def _strings(entries: Iterable[tuple[Parsed, str, str]]) -> dict[Key, tuple[Any, Allowed]]:
    """``(entry, reason, source)`` triples as entries, less the denied ones (warned about)."""
    out: dict[Key, tuple[Any, Allowed]] = {}
    for entry, reason, source in entries:
        if entry.resolver or not _denied_entry(entry, source):
            out.setdefault(entry.key, (entry.obj, Allowed(entry.written, reason, source)))
    return out


def _from_environment() -> dict[Key, tuple[Any, Allowed]]:
    # "#" starts a comment, as in the file: inspect shows "mod.Name  # reason", and a dotted
    # word of a comment copied into the variable was an entry
    entries, skipped = parse_text(_settings.allow_text().partition("#")[0], _settings.ALLOW)
    _warn_skipped(_settings.ALLOW, skipped)
    return _strings((e, f"listed in {_settings.ALLOW}", _settings.ALLOW) for e in entries)


def _warn_skipped(source: str, skipped: list[str]) -> None:
    """One warning (once) for a source's malformed entries: each is skipped, admitting
    nothing, and the source's other entries stay in force."""
    if skipped:
        message = (
            f"compatshim: {len(skipped)} malformed allow entr{'y' if len(skipped) == 1 else 'ies'}"
            f" skipped (the other entries of {source} stay in force): {names(skipped, 5)}"
        )
        decisions.warn_once("allow", message, message)


def _from_file() -> dict[Key, tuple[Any, Allowed]]:
    """The entries in ``COMPATSHIM_ALLOW_FILE``, read again only when the file changes; a
    file :func:`_read_file` cannot take is warned about once and admits nothing."""
    path = _settings.allow_file()
    if path is None:
        return {}
    try:
        return _read_file(path)
    except (OSError, ValueError) as exc:
        decisions.warn_once(
            "allow",
            f"file:{path}:{exc}",
            f"compatshim: {_settings.ALLOW_FILE}={path!r} is ignored: {type(exc).__name__}: {exc}",
        )
        return {}


def _read_file(path: str) -> dict[Key, tuple[Any, Allowed]]:
    """The allow file's entries as every load reads them; OSError or ValueError (a
    ``SettingError``) where a load ignores the file: the one judge of that, the doctor's too."""
    global _file
    import os

    stat = os.stat(path)
    _regular(stat.st_mode)  # a FIFO or device would block or never end every load
    key = (path, stat.st_mtime_ns, stat.st_size)
    with _lock:
        if _file is not None and _file[0] == key:
            return _file[1]
    if stat.st_size > MAX_FILE_BYTES:
        raise _settings.SettingError(f"larger than {MAX_FILE_BYTES} bytes")
    # non-blocking open: a FIFO swapped in after the stat must not block here either
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    with open(fd, "rb") as handle:
        _regular(os.fstat(handle.fileno()).st_mode)
        # a line that is not UTF-8 is a malformed entry (skipped), not a lost file
        text = handle.read(MAX_FILE_BYTES).decode("utf-8", errors="replace")
    entries = _strings(_parse_file(text, path))
    with _lock:
        _file = (key, entries)
    return entries


def _regular(mode: int) -> None:
    import stat

    if not stat.S_ISREG(mode):
        raise _settings.SettingError("not a regular file")


def _parse_file(text: str, path: str) -> list[tuple[Parsed, str, str]]:
    """One ``module.name`` a line, an optional ``# reason`` after it (else the reason is
    where it was listed). A line is one entry, not split on spaces: a reason written without
    ``#`` would make each dotted word of it an allowed global."""
    found = []
    skipped: list[str] = []
    for number, line in enumerate(text.splitlines(), 1):
        entry, _, comment = line.partition("#")
        entry = entry.strip()
        where = f"{path}:{number}"
        if not entry:
            continue
        if len(entry.split()) > 1 or "," in entry:
            skipped.append(
                f"{where}: {short(entry, 80)} is more than one 'module.name' (one entry a "
                "line; a reason follows '#')"
            )
            continue
        try:
            parsed = parse(entry, where, strict=True)
        except _settings.SettingError as exc:
            skipped.append(str(exc))
            continue
        found.append((parsed, comment.strip() or f"listed in {where}", where))
    _warn_skipped(f"{_settings.ALLOW_FILE}={path!r}", skipped)
    return found


def _from_entry_points() -> dict[Key, tuple[Any, Allowed]]:
    """Entries from the ``compatshim.allow`` entry points, loaded once, at the first need."""
    global _entry_points
    with _lock:
        if _entry_points is not None:
            return _entry_points
    loaded: dict[Key, tuple[Any, Allowed]] = {}
    for point in _points():  # imports other packages' modules: never under the lock
        source = f"entry point {point.name} = {point.value}"
        try:
            value = point.load()
            if callable(value) and not isinstance(value, (list, tuple)):
                value = value()
            for key, hit in _entry_point_items(value, source).items():
                loaded.setdefault(key, hit)
        except Exception as exc:
            decisions.warn_once(
                "allow",
                f"ep:{source}",
                f"compatshim: {GROUP} {source} is ignored: {type(exc).__name__}: {exc}",
            )
    with _lock:
        if _entry_points is None:
            _entry_points = loaded
        return _entry_points


def _points() -> list[Any]:
    from importlib import metadata

    try:
        points: Any = metadata.entry_points()
        if hasattr(points, "select"):
            return list(points.select(group=GROUP))
        return list(points.get(GROUP, ()))  # Python 3.9
    except Exception as exc:
        decisions.warn_once(
            "allow", "ep:list", f"compatshim: could not list {GROUP} entry points: {exc}"
        )
        return []


def _entry_point_items(value: Any, source: str) -> dict[Key, tuple[Any, Allowed]]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise TypeError(f"expected a list of entries, got {type(value).__name__}")
    found = []
    skipped: list[str] = []
    for number, item in enumerate(value, 1):
        reason = f"declared by {source}"
        if isinstance(item, tuple) and len(item) == 2 and all(isinstance(i, str) for i in item):
            item, reason = item
        try:
            entry = parse(item, f"item {number}", strict=isinstance(item, str))
        except (TypeError, ValueError) as exc:  # as COMPATSHIM_ALLOW: the others stay in force
            what = "" if isinstance(item, str) else f" ({short(item)})"  # a str's error names it
            skipped.append(f"{exc}{what}")
            continue
        found.append((entry, reason, source))
    _warn_skipped(source, skipped)
    return _strings(found)


def _denied_entry(entry: Parsed, source: str) -> bool:
    """Whether an entry names a denied global (warned about once, then ignored)."""
    why = denied_entry(entry.key, _object(entry))
    if why is None:
        return False
    decisions.warn_once(
        "allow",
        f"denied:{source}:{entry.written}",
        f"compatshim: {entry.written} ({source}) is ignored: {DENIED_REFUSAL}: {why}",
    )
    return True


def _reset() -> None:
    """Forget every entry and cached source (tests)."""
    global _entry_points, _file
    with _lock:
        _code.clear()
        _entry_points = None
        _file = None
    decisions.forget_warnings("allow")
