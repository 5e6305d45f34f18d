"""``COMPATSHIM_SAFE_LOAD=1`` at start-up: arm the loading patches, or say loudly why not.

The start-up hook (``compatshim_auto.py``) calls :func:`arm` whenever the variable is set,
with or without ``COMPATSHIM_AUTO``: a user who sets the one variable named for safety is
protected without also arming every other patch. A loading patch that cannot be armed
(``COMPATSHIM_DISABLE`` names it, or a dependency is missing) leaves the promise broken,
so that is said once on stderr, where ``-W ignore`` cannot hide it.

Where the hook never runs (compatshim on ``PYTHONPATH`` or installed with ``pip --target``:
no ``.pth`` is read there), ``import compatshim`` arms them (:func:`arm_at_import`) and says
that loads before it ran were not hardened; an ``uninstall()`` that disarms one says so.
"""

from __future__ import annotations

import sys

from .. import _settings
from .registry import _install, disable_entries

#: the patches that make loading safe in hardened mode (each reads ``COMPATSHIM_SAFE_LOAD``)
LOADING_PATCHES = ("torch-load-safe-globals", "torch-dcp-safe-metadata", "numpy-load-hardened")

_said: set[str] = set()


def loud(key: str, message: str) -> None:
    """``message`` on stderr, once per ``key`` in this process (never through ``warnings``:
    a filter must not hide that a safety switch is off)."""
    if key in _said:
        return
    _said.add(key)
    say(message)


def say(message: str) -> None:
    """``message`` on stderr, every time (never raises)."""
    try:  # noqa: SIM105 (contextlib costs start-up time)
        sys.stderr.write(f"compatshim: {message}\n")
    except Exception:
        pass


#: the loading patches ``import compatshim`` armed because the start-up hook did not run:
#: the doctor does not count them as armed in processes started with this environment
armed_at_import: list[str] = []


def arm_at_import() -> None:
    """``COMPATSHIM_SAFE_LOAD=1`` set, the start-up hook absent (``compatshim_auto`` never
    imported): arm the loading patches now, and say that earlier loads were not hardened."""
    if not _settings.safe_load() or "compatshim_auto" in sys.modules:
        return
    armed_at_import[:] = arm()
    loud(
        "import",
        f"{_settings.SAFE_LOAD}=1: compatshim's start-up hook did not run in this interpreter "
        "(compatshim on PYTHONPATH or installed with pip --target: no .pth file is read "
        "there), so loads before `import compatshim` were not hardened; armed from here on. "
        "Install compatshim into this interpreter's site-packages to harden every process.",
    )


def disarmed(names: list[str]) -> None:
    """``uninstall()`` disarmed ``names``: say so where a loading patch was among them and
    ``COMPATSHIM_SAFE_LOAD=1`` is set (a library's uninstall() must not end it silently),
    at every such call: after an install(), a second uninstall() ends it as the first did."""
    lost = [name for name in names if name in LOADING_PATCHES]
    if lost and _settings.safe_load():
        say(
            f"{_settings.SAFE_LOAD}=1 is NOT in force in this process any more: "
            f"compatshim.uninstall() disarmed {', '.join(lost)}; compatshim.install() arms "
            "them again",
        )


def arm() -> list[str]:
    """Arm :data:`LOADING_PATCHES` (installing twice is installing once); the names armed."""
    armed = _install(LOADING_PATCHES, None, tell_disabled=False)  # said below, on stderr
    missing = [name for name in LOADING_PATCHES if name not in armed]
    if missing:
        disabled = {name for _, name in disable_entries(missing)}
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
