"""Interpreter start-up hook: ``COMPATSHIM_AUTO=1`` arms every patch in processes you do not
write; ``COMPATSHIM_SAFE_LOAD=1`` arms the loading patches (hardened mode), with or without it.

Run at every interpreter start by the two start-up files the wheel installs beside it:
``compatshim_auto.pth`` (an ``import`` line, for Pythons before 3.15) and
``compatshim_auto.start`` (PEP 829's entry point, ``compatshim_auto:start``; from Python
3.15 its presence disables the ``.pth`` file's ``import`` line, which 3.18 ignores).
It is a top-level module so that a process without either variable imports only this
file: importing the ``compatshim`` package costs milliseconds. It repeats
``compatshim._settings.AUTO``, ``SAFE_LOAD``, ``truthy`` and the list of setting names by
hand for the same reason.

A misspelt variable (``COMPATSHIM_AUOT=1``) is warned about in every process, those that
never import compatshim included: one pass over the environment's names finds it, and only
then is ``compatshim._settings`` imported, whose import warns (once a process, naming the
nearest known name) as it does for a process that imports compatshim itself.

Hardened mode is a safety promise, so a process where it cannot be in force says so on
stderr, once, before any load: here when compatshim cannot be imported, and in
:mod:`compatshim._engine.safe_load` when a loading patch cannot be armed.
"""

import os

_said = False
# compatshim._settings' names (tests/core/test_settings_names.py keeps the two in step)
_KNOWN = frozenset(
    (
        "COMPATSHIM_AUTO",
        "COMPATSHIM_DISABLE",
        "COMPATSHIM_DESYNC_TIMEOUT",
        "COMPATSHIM_DOCTOR_TIMEOUT",
        "COMPATSHIM_LOG",
        "COMPATSHIM_SAFE_LOAD",
        "COMPATSHIM_ALLOW",
        "COMPATSHIM_ALLOW_FILE",
    )
)


def _on(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no", "off")


def _unknown_set() -> bool:
    """Whether a ``COMPATSHIM_*`` variable (any case) is set that compatshim does not read;
    the test suite's ``COMPATSHIM_TEST_*`` ones never count (``_settings.unknown_names``)."""
    for name in os.environ:
        upper = name[:16].upper()
        if upper[:11] == "COMPATSHIM_" and upper != "COMPATSHIM_TEST_" and name not in _KNOWN:
            return True
    return False


def start() -> None:
    """Arm every patch (``COMPATSHIM_AUTO``) and the loading patches (``COMPATSHIM_SAFE_LOAD``)."""
    safe = _on("COMPATSHIM_SAFE_LOAD")
    if not safe:
        if _on("COMPATSHIM_AUTO"):
            __import__("compatshim.auto")
        elif _unknown_set():
            try:  # noqa: SIM105 (contextlib would cost start-up time)
                __import__("compatshim._settings")  # its import warns about each unknown name
            except Exception:  # compatshim cannot be imported: none of its settings is read
                pass
        return
    try:
        if _on("COMPATSHIM_AUTO"):
            __import__("compatshim.auto")
        __import__("compatshim._engine.safe_load", fromlist=("arm",)).arm()
    except Exception as exc:  # site.py would print a traceback that reads as noise
        global _said
        if not _said:
            _said = True
            import sys

            sys.stderr.write(
                "compatshim: COMPATSHIM_SAFE_LOAD=1 is NOT in force in this process: compatshim "
                f"could not be imported at start-up ({type(exc).__name__}: {exc}); every "
                "torch.load and numpy.load here runs as the library's own. Install what it "
                "names into this interpreter's environment (compatshim needs packaging).\n"
            )
