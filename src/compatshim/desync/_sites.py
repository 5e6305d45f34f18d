"""Call sites: the user's file:line behind a call, found cheaply enough to record on every step.

Frames inside compatshim, torch, Lightning and the standard library are
skipped, so a report points at the line in the training script, not at the
wrapper that noticed the problem. Frames are kept as (file, line, function)
tuples, never as frame objects, so no locals are kept alive.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from types import FrameType

from ._records import Site

_FRAMEWORKS = ("torch", "lightning", "lightning_fabric", "lightning_utilities")
_verdicts: dict[str, bool] = {}  # filename -> internal?
_loaded: tuple[bool, ...] = ()


def _framework_dirs() -> list[str]:
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    dirs = [here + os.sep]
    for name in _FRAMEWORKS:
        module = sys.modules.get(name)
        path = getattr(module, "__file__", None) if module is not None else None
        if path:
            dirs.append(os.path.dirname(os.path.abspath(path)) + os.sep)
    return dirs


def _judge(filename: str) -> bool:
    if filename.startswith("<"):
        return True
    if filename.startswith(tuple(_framework_dirs())):
        return True
    stdlib = sysconfig.get_paths()["stdlib"] + os.sep
    site_dirs = tuple(p + os.sep for p in sys.path if "-packages" in p)
    return filename.startswith(stdlib) and not filename.startswith(site_dirs)


def _refresh() -> None:
    """Judge files again once a framework has been imported since the last call."""
    global _loaded
    modules = sys.modules
    loaded = tuple(name in modules for name in _FRAMEWORKS)
    if loaded != _loaded:
        _loaded = loaded
        _verdicts.clear()


def is_internal(filename: str) -> bool:
    """Whether a frame in ``filename`` belongs to compatshim, a framework or the stdlib."""
    _refresh()
    verdict = _verdicts.get(filename)
    if verdict is None:
        verdict = _verdicts[filename] = _judge(filename)
    return verdict


def user_frames(limit: int = 6) -> list[Site]:
    """Up to ``limit`` innermost user frames of the calling thread, innermost first.

    Runs on every watched call, so the per-frame work is one dict lookup.
    """
    _refresh()
    verdicts = _verdicts
    frame: FrameType | None = sys._getframe(1)
    sites: list[Site] = []
    while frame is not None and len(sites) < limit:
        code = frame.f_code
        filename = code.co_filename
        internal = verdicts.get(filename)
        if internal is None:
            internal = verdicts[filename] = _judge(filename)
        if not internal:
            sites.append((filename, frame.f_lineno, code.co_name))
        frame = frame.f_back
    return sites


def format_site(site: Site | None) -> str:
    """``path/to/file.py:12 in fn``, the path relative to the working directory when shorter."""
    if not site:
        return "<unknown>"
    filename, line, function = str(site[0]), site[1], site[2]
    try:
        relative = os.path.relpath(filename)
        if len(relative) < len(filename) and not relative.startswith(os.pardir + os.sep):
            filename = relative
    except ValueError:
        pass
    return f"{filename}:{line} in {function}"
