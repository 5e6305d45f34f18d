"""Installed versions read from distribution metadata, never by importing the package.

Nothing here raises on what it finds installed: a version that is not PEP 440
(a stray ``torch-notaversion.dist-info`` folder) is reported as unreadable,
and the caller lets the probe decide.
"""

from __future__ import annotations

TYPE_CHECKING = False  # no ``typing`` import at run time (start-up path)
if TYPE_CHECKING:
    from .._records import Position

_cache: dict[str, str | None] = {}
#: versions of running copies, by normalised name: ``compatshim/__init__.py`` puts its own
#: ``__version__`` here, which wins over whatever metadata is installed (a source checkout)
running: dict[str, str] = {}


def _normalise(name: str) -> str:
    return name.lower().replace("-", "_").replace(".", "_")


_scanned: tuple[tuple[object, ...], dict[str, str]] | None = None  # (sys.path, name -> version)


def _from_dist_info(distribution: str) -> str | None:
    """The version in a ``<name>-<version>.dist-info`` folder on ``sys.path``, if any.

    Hooks run in the middle of a framework's own import, where importing
    ``importlib.metadata`` costs ~10 ms; the folder name carries the same fact.
    One listing of ``sys.path`` answers for every distribution (the first entry
    holding it wins, as for imports) until ``sys.path`` changes.
    """
    global _scanned
    import sys

    path = tuple(sys.path)
    scanned = _scanned
    if scanned is None or scanned[0] != path:
        scanned = _scanned = (path, _scan(path))
    return scanned[1].get(_normalise(distribution))


def _scan(path: tuple[object, ...]) -> dict[str, str]:
    import os

    found: dict[str, str] = {}
    for entry in path:
        try:
            names = os.listdir(os.fsdecode(entry) or ".")  # type: ignore[arg-type]
        except (OSError, TypeError, ValueError):
            continue
        for name in names:
            if name.endswith(".dist-info"):
                project, _, version = name[: -len(".dist-info")].partition("-")
                if version:
                    found.setdefault(_normalise(project), version)
    return found


def _from_metadata(distribution: str) -> str | None:
    try:
        from importlib import metadata

        return metadata.version(distribution)
    except Exception:  # not installed, or metadata too broken to read
        return None


def installed_version(distribution: str) -> str | None:
    """The installed version of ``distribution`` as written in its metadata, or None.

    ``"python"`` is the running interpreter, for patches of the standard library.
    """
    if distribution == "python":
        import sys

        return ".".join(map(str, sys.version_info[:3]))
    own = running.get(_normalise(distribution))
    if own is not None:
        return own
    if distribution not in _cache:
        version = _from_dist_info(distribution)
        if version is None:  # egg-info, zipped or unusual layouts
            version = _from_metadata(distribution)
        _cache[distribution] = version
    return _cache[distribution]


def _release(version: str) -> tuple[int, ...] | None:
    """``(2, 15, 0)`` for a final release (``2.15.0``, ``2.15.0+cpu``); None for anything else."""
    public = version.strip().partition("+")[0]
    parts = public.split(".")
    if not all(part.isdigit() and part.isascii() for part in parts):
        return None
    return tuple(int(part) for part in parts)


_COMPARE = {
    ">=": lambda a, b: a >= b,
    "<=": lambda a, b: a <= b,
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
    ">": lambda a, b: a > b,
    "<": lambda a, b: a < b,
}


_answers: dict[tuple[str, str], bool | None] = {}  # (specifier, version) -> _simple_contains


def _simple_contains(specifier: str, version: str) -> bool | None:
    """PEP 440 containment for a final release and clauses like ``>=2.1,<2.16``, without
    importing ``packaging`` (~13 ms inside a framework's import); None: ask ``packaging``.

    Memoised: the alias table asks the same few questions for every entry of a module."""
    key = (specifier, version)
    try:
        return _answers[key]
    except KeyError:
        answer = _answers[key] = _contains_release(specifier, version)
        return answer


def _contains_release(specifier: str, version: str) -> bool | None:
    release = _release(version)
    if release is None:
        return None
    for clause in specifier.split(","):
        clause = clause.strip()
        op = clause[:2] if clause[:2] in _COMPARE else clause[:1]
        bound = _release(clause[len(op) :]) if op in _COMPARE else None
        if bound is None or "+" in clause:
            return None
        width = max(len(release), len(bound))  # 2.15 == 2.15.0
        padded = release + (0,) * (width - len(release)), bound + (0,) * (width - len(bound))
        if not _COMPARE[op](*padded):
            return False
    return True


def contains(specifier: str, version: str) -> bool | None:
    """``version in specifier`` (pre-releases included); None when either is not PEP 440."""
    fast = _simple_contains(specifier, version)
    if fast is not None:
        return fast
    from packaging.specifiers import InvalidSpecifier, SpecifierSet
    from packaging.version import InvalidVersion, Version

    try:
        return SpecifierSet(specifier).contains(Version(version), prereleases=True)
    except (InvalidSpecifier, InvalidVersion):
        return None


def position(
    distribution: str, version: str | None, requires: str, tested: str
) -> tuple[Position | None, str | None]:
    """Where ``version`` falls for a patch: ``(position, note)``.

    ``"unsupported"`` outside ``requires``, ``"tested"`` inside ``tested``,
    ``"untested"`` otherwise. ``(None, note)`` when the distribution is not
    installed or its version cannot be parsed: the probe decides, the note says why.
    """
    if version is None:
        return None, f"{distribution} is not installed"
    if not requires and not tested:  # nothing declared (a table of entries gates itself)
        return "untested", None
    inside = [_simple_contains(spec, version) if spec else True for spec in (requires, tested)]
    if None not in inside:
        return (
            "unsupported" if not inside[0] else "tested" if tested and inside[1] else "untested"
        ), None
    from packaging.specifiers import InvalidSpecifier, SpecifierSet
    from packaging.version import InvalidVersion, Version

    try:
        parsed = Version(version)
    except InvalidVersion:
        return None, (
            f"{distribution} reports version {version!r}, which is not a PEP 440 version; "
            "the probe decides"
        )
    try:
        if requires and not SpecifierSet(requires).contains(parsed, prereleases=True):
            return "unsupported", None
        if tested and SpecifierSet(tested).contains(parsed, prereleases=True):
            return "tested", None
    except InvalidSpecifier as exc:
        return None, f"the patch declares an invalid version range ({exc}); the probe decides"
    return "untested", None


def version_at_least(version: str | None, minimum: str) -> bool:
    """``version >= minimum``; False when not installed or unreadable."""
    if version is None:
        return False
    fast = _simple_contains(f">={minimum}", version)
    if fast is not None:
        return fast
    from packaging.version import InvalidVersion, Version

    try:
        return Version(version) >= Version(minimum)
    except InvalidVersion:
        return False
