"""Every ``COMPATSHIM_*`` environment variable: its name, default, parsing and error, in one place.

Modules ask this one for a setting instead of reading ``os.environ`` themselves,
so a misspelt or malformed value gets the same treatment everywhere: a clear
:class:`SettingError` (a ``ValueError``) where the caller can report it, or a
single warning where it cannot (start-up, import hooks). The start-up hook
(``compatshim_auto.py``, run by ``compatshim_auto.pth`` and ``compatshim_auto.start``)
is the one exception: it runs in every interpreter, before this package is imported,
and repeats :data:`AUTO`, :data:`SAFE_LOAD`, :func:`truthy` and the names by hand; where
it finds a name not declared here, it imports this module, whose import warns about it.
"""

from __future__ import annotations

import os

AUTO = "COMPATSHIM_AUTO"  # arm every patch at interpreter start (compatshim_auto.py)
DISABLE = "COMPATSHIM_DISABLE"  # comma-separated patch names to leave off
DESYNC_TIMEOUT = "COMPATSHIM_DESYNC_TIMEOUT"  # seconds before a desync/hang report
DOCTOR_TIMEOUT = "COMPATSHIM_DOCTOR_TIMEOUT"  # seconds allowed for the doctor's live probes
LOG = "COMPATSHIM_LOG"  # "debug": print the registry's decision trail to stderr
SAFE_LOAD = "COMPATSHIM_SAFE_LOAD"  # hardened mode, armed at start-up even without AUTO
ALLOW = "COMPATSHIM_ALLOW"  # comma-separated module.name globals every checkpoint load accepts
ALLOW_FILE = "COMPATSHIM_ALLOW_FILE"  # a file of such globals, one "module.name  # reason" a line

DEFAULT_DESYNC_TIMEOUT = 300.0
DEFAULT_DOCTOR_TIMEOUT = 300.0
_FALSE = ("", "0", "false", "no", "off")
_TRUE = ("1", "true", "yes", "on")
LOG_LEVELS = ("", "debug")
RESOLVER_PREFIX = "omegaconf-resolver:"  # an allow entry naming an omegaconf resolver


class SettingError(ValueError):
    """A ``COMPATSHIM_*`` variable holds a value that cannot be used."""


def truthy(raw: str | None) -> bool:
    return (raw or "").strip().lower() not in _FALSE


def auto() -> bool:
    return truthy(os.environ.get(AUTO))


def disabled_names() -> list[str]:
    """The names listed in ``COMPATSHIM_DISABLE``, as written (the registry checks them)."""
    raw = os.environ.get(DISABLE, "")
    return [part.strip() for part in raw.split(",") if part.strip()]


def seconds(
    name: str, default: float, value: float | None = None, argument: str = "timeout"
) -> float:
    """``value`` if given (named ``argument`` in an error), else the variable ``name``
    (seconds), else ``default``; always > 0."""
    if value is None:
        raw = os.environ.get(name, "").strip()
        if not raw:
            return default
        try:
            value = float(raw)
        except ValueError:
            raise SettingError(f"{name}={raw!r} is not a number of seconds") from None
        where = f"{name}={raw!r}"
    else:
        where = argument
    if not value > 0 or value != value or value == float("inf"):
        raise SettingError(f"{where}: expected a positive, finite number of seconds, got {value!r}")
    return float(value)


def desync_timeout(value: float | None = None) -> float:
    return seconds(DESYNC_TIMEOUT, DEFAULT_DESYNC_TIMEOUT, value)


def doctor_timeout(value: float | None = None) -> float:
    """``value``: ``compatshim doctor --timeout``'s, so an error names that option."""
    return seconds(DOCTOR_TIMEOUT, DEFAULT_DOCTOR_TIMEOUT, value, "--timeout")


def log_level() -> str:
    return os.environ.get(LOG, "").strip().lower()


def safe_load() -> bool:
    """``COMPATSHIM_SAFE_LOAD``: the loading patches (``_engine.safe_load.LOADING_PATCHES``)
    make every torch.load, DCP ``.metadata`` read and numpy.load pickle safe."""
    return truthy(os.environ.get(SAFE_LOAD))


def allow_text() -> str:
    """``COMPATSHIM_ALLOW`` as set (``checkpoint._names.parse_text`` reads the entries)."""
    return os.environ.get(ALLOW, "")


def allow_file() -> str | None:
    """The path in ``COMPATSHIM_ALLOW_FILE``, or None."""
    return os.environ.get(ALLOW_FILE, "").strip() or None


# -- names nobody reads ------------------------------------------------------------------------
_PREFIX = "COMPATSHIM_"
_TESTS = "COMPATSHIM_TEST_"  # compatshim's own test suite's variables: never checked


def _known() -> tuple[str, ...]:
    """Every ``COMPATSHIM_*`` name this module declares (a constant above; the prefixes end
    in ``_``), so a setting added here is known without a second list to keep in step."""
    found = list(globals().values())
    return tuple(v for v in found if type(v) is str and v.startswith(_PREFIX) and v[-1] != "_")


def unknown_names() -> list[str]:
    """``COMPATSHIM_*`` variables set in this process that compatshim does not read (any case:
    ``compatshim_auto`` is a slip too)."""
    ours = [name for name in os.environ if name[: len(_PREFIX)].upper() == _PREFIX]
    if not ours:  # the common case costs one pass over the environment
        return []
    known = _known()
    return sorted(n for n in ours if n not in known and not n.upper().startswith(_TESTS))


def malformed() -> list[str]:
    """A line for each switch set to a value it does not know, and what compatshim reads it as:
    ``COMPATSHIM_AUTO=flase`` still arms (any value but the false ones does, as the start-up
    hook reads it; a safety switch fails closed), ``COMPATSHIM_LOG=verbose`` logs nothing."""
    found = []
    for name in (AUTO, SAFE_LOAD):
        raw = os.environ.get(name)
        if raw is not None and raw.strip().lower() not in _TRUE + _FALSE:
            found.append(
                f"compatshim: {name}={raw!r} is read as on (on: {', '.join(_TRUE)}; "
                f"off: unset, empty, {', '.join(_FALSE[1:])})"
            )
    raw = os.environ.get(LOG)
    if raw is not None and raw.strip().lower() not in LOG_LEVELS:
        found.append(f"compatshim: {LOG}={raw!r} is ignored (known: debug)")
    return found


def _warn_settings() -> None:
    """Each unknown ``COMPATSHIM_*`` name (with the nearest known one) and each switch set to a
    value it does not know, warned once. Runs once per process, when this module is imported
    (by the start-up hook, in a process that never imports compatshim); difflib is imported
    only for an unknown name."""
    unknown, values = unknown_names(), malformed()
    if not unknown and not values:
        return
    from ._engine import decisions

    for line in values:
        decisions.warn_once("settings", line, line)
    if not unknown:
        return
    for name in unknown:
        decisions.warn_once(
            "settings",
            name,
            f"compatshim: {name} is not a compatshim setting, ignored; {hint(name)}",
        )


def hint(name: str) -> str:
    """For an unknown ``COMPATSHIM_*`` name: the nearest known one, else every known one."""
    import difflib

    known = {n[len(_PREFIX) :]: n for n in _known()}
    near = difflib.get_close_matches(name[len(_PREFIX) :].upper(), known, n=1, cutoff=0.6)
    return f"did you mean {known[near[0]]}?" if near else f"known: {', '.join(known.values())}"


_warn_settings()
