"""``COMPATSHIM_SAFE_LOAD=1`` at start-up: arm the loading patches, or say loudly why not.

The start-up hook (``compatshim_auto.py``) calls :func:`arm` whenever the variable is set,
with or without ``COMPATSHIM_AUTO``: a user who sets the one variable named for safety is
protected without also arming every other patch. A loading patch that cannot be armed
(``COMPATSHIM_DISABLE`` names it, or a dependency is missing) leaves the promise broken,
so that is said once on stderr, where ``-W ignore`` cannot hide it.
"""

from __future__ import annotations

import sys

from .. import _settings
from .registry import _canonical, install

#: the patches that make loading safe in hardened mode (each reads ``COMPATSHIM_SAFE_LOAD``)
LOADING_PATCHES = ("torch-load-safe-globals", "torch-dcp-safe-metadata", "numpy-load-hardened")

_said: set[str] = set()


def loud(key: str, message: str) -> None:
    """``message`` on stderr, once per ``key`` in this process (never through ``warnings``:
    a filter must not hide that a safety switch is off)."""
    if key in _said:
        return
    _said.add(key)
    try:  # noqa: SIM105 (contextlib costs start-up time)
        sys.stderr.write(f"compatshim: {message}\n")
    except Exception:
        pass


def arm() -> list[str]:
    """Arm :data:`LOADING_PATCHES` (installing twice is installing once); the names armed."""
    armed = install(include=LOADING_PATCHES)
    missing = [name for name in LOADING_PATCHES if name not in armed]
    if missing:
        disabled = {_canonical(name) for name in _settings.disabled_names()}
        why = (
            f"{_settings.DISABLE} names it"
            if all(name in disabled for name in missing)
            else "compatshim's dependencies are missing (see the warning above)"
        )
        loud(
            "arm",
            f"{_settings.SAFE_LOAD}=1 is NOT in force in this process for "
            f"{', '.join(missing)}: {why}",
        )
    return armed
