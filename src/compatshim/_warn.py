"""A warning attributed to the line that called compatshim, whatever path led to it.

A fixed ``stacklevel`` counts frames, so the same warning reached another way
(``rng.load`` calls ``rng.restore``; an import hook fires inside ``import torch``;
``checkpoint.load`` reads ``COMPATSHIM_ALLOW``) names compatshim's own file. Here the
warning goes to the first frame outside compatshim and the import machinery, as
``skip_file_prefixes`` does on Python 3.12+ (compatshim supports 3.9).

At interpreter start-up (the start-up hook ``compatshim_auto`` arming the patches) no line
of the user's led to it: the warning is shown at ``<compatshim start-up hook>``, with no
source line, not at the hook's ``__import__("compatshim.auto")``.
"""

from __future__ import annotations

import os
import sys

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep
_HOOK = "compatshim_auto"  # the start-up hook, a top-level module beside the package
START_UP = "<compatshim start-up hook>"  # where a warning raised at interpreter start shows


def internal_file(filename: str) -> bool:
    """Whether ``filename`` is compatshim's own (its package folder) or the import machinery."""
    return filename.startswith(_PACKAGE) or filename.startswith("<frozen importlib")


def warn(message: str, category: type[Warning]) -> None:
    """``warnings.warn(message, category)`` at the caller's line (the first frame outside
    compatshim); under ``-W error`` it raises, as ``warnings.warn`` does."""
    import warnings  # not imported at interpreter start: only when a warning is due

    frame = sys._getframe(1)
    while frame.f_back is not None and internal_file(frame.f_code.co_filename):
        frame = frame.f_back
    if internal_file(frame.f_code.co_filename):  # called from nowhere outside: say it here
        warnings.warn(message, category, stacklevel=2)
        return
    module_globals = frame.f_globals
    filename, lineno = frame.f_code.co_filename, frame.f_lineno
    if module_globals.get("__name__") == _HOOK:  # start-up: above it only site's machinery
        filename, lineno = START_UP, 0  # (line 0: linecache shows no source line)
    warnings.warn_explicit(
        message,
        category,
        filename,
        lineno,
        module=module_globals.get("__name__", "<string>"),
        registry=module_globals.setdefault("__warningregistry__", {}),
    )  # no module_globals: a loader's get_source raises for some (``python -c``)
