"""Why a patch did or did not apply: each decision, on the ``compatshim`` logger at DEBUG.

Decisions made at start-up (``install()`` under ``COMPATSHIM_AUTO=1``) come
before ``logging`` is imported, and importing it there would cost every
process a few milliseconds. So decisions are kept in a short in-memory list
and sent to the logger once ``logging`` is imported by anyone (a framework
import always does it), oldest first. ``COMPATSHIM_LOG=debug`` also prints
them to stderr, through a handler of the ``compatshim`` logger, which then stops
propagating (a root handler would print each line twice). The last few decisions
of each patch appear in ``status()``.
"""

from __future__ import annotations

import sys
from _thread import _local, allocate_lock

from .. import _settings

LOGGER = "compatshim"
_KEEP_PER_PATCH = 8
_pending: list[str] = []
_by_patch: dict[str, list[str]] = {}
_used: dict[str, list[str]] = {}
_stderr_attached = False
_warned: set[tuple[str, str]] = set()
_warned_lock = allocate_lock()
_probing = _local()  # .patch: the patch whose probe this thread is running


class probing:
    """While a patch's probe runs in this thread, that patch's decisions are not kept:
    a probe feeds the fix a harmless case it must refuse, and that refusal (or use) is
    the probe's, not the program's."""

    def __init__(self, patch: str) -> None:
        self.patch = patch

    def __enter__(self) -> None:
        self.outer = getattr(_probing, "patch", None)
        _probing.patch = self.patch

    def __exit__(self, *_: object) -> None:
        _probing.patch = self.outer


def record(patch: str, event: str, detail: str = "") -> None:
    """Note one decision about ``patch`` (e.g. ``armed``, ``applied``, ``probe failed``)."""
    if getattr(_probing, "patch", None) == patch:
        return
    line = f"{patch}: {event}" + (f" ({detail})" if detail else "")
    kept = _by_patch.setdefault(patch, [])
    kept.append(line)
    del kept[:-_KEEP_PER_PATCH]
    _pending.append(line)
    if "logging" in sys.modules or _settings.log_level() == "debug":
        _flush()


def recent(patch: str) -> list[str]:
    return list(_by_patch.get(patch, ()))


def note_use(patch: str, entry: str) -> None:
    """Note that this process used ``entry`` of ``patch`` (once; ``status()`` lists it)."""
    if getattr(_probing, "patch", None) == patch:
        return
    used = _used.setdefault(patch, [])
    if entry not in used:
        used.append(entry)
        record(patch, "used", entry)


def used(patch: str) -> list[str]:
    return list(_used.get(patch, ()))


def _flush() -> None:
    global _stderr_attached
    try:
        import logging

        logger = logging.getLogger(LOGGER)
        if _settings.log_level() == "debug" and not _stderr_attached:
            _stderr_attached = True
            handler = logging.StreamHandler()
            handler.setFormatter(logging.Formatter("compatshim: %(message)s"))
            logger.addHandler(handler)
            logger.setLevel(logging.DEBUG)
            # the line is printed here: the root's handlers (basicConfig) would print it again
            logger.propagate = False
        while True:
            try:
                line = _pending.pop(0)
            except IndexError:  # another thread took the last one
                break
            logger.debug(line)
    except Exception:  # a log line must never break an import
        _pending.clear()


def warn(message: str) -> None:
    """A ``RuntimeWarning`` that can never raise, even under ``python -W error``, at the
    user's line that led to it (an ``install()``, ``import torch``, a load)."""
    try:
        from .._warn import warn as warn_at_caller

        warn_at_caller(message, RuntimeWarning)
    except Exception:  # the filters turned it into an error: say it on stderr instead
        try:  # noqa: SIM105 (contextlib would cost start-up time)
            sys.stderr.write(f"RuntimeWarning: {message}\n")
        except Exception:
            pass


def warn_once(scope: str, key: str, message: str) -> None:
    """:func:`warn`, once per ``(scope, key)`` in this process; thread-safe."""
    with _warned_lock:
        if (scope, key) in _warned:
            return
        _warned.add((scope, key))
    warn(message)


def forget_warnings(scope: str) -> None:
    """Let ``scope``'s warnings be given again (tests)."""
    with _warned_lock:
        _warned.difference_update([k for k in _warned if k[0] == scope])
