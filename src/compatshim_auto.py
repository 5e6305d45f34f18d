"""Interpreter start-up hook: ``COMPATSHIM_AUTO=1`` arms every patch in processes you do not write.

Run at every interpreter start by the two start-up files the wheel installs beside it:
``compatshim_auto.pth`` (an ``import`` line, for Pythons before 3.15) and
``compatshim_auto.start`` (PEP 829's entry point, ``compatshim_auto:start``; from Python
3.15 its presence disables the ``.pth`` file's ``import`` line, which 3.18 ignores).
It is a top-level module so that a process without ``COMPATSHIM_AUTO`` imports only this
file: importing the ``compatshim`` package costs tens of milliseconds. It repeats
``compatshim._settings.AUTO`` and ``truthy`` by hand for the same reason.
"""

import os


def start() -> None:
    """Import ``compatshim.auto`` (arm every applicable patch) when ``COMPATSHIM_AUTO`` is set."""
    if os.environ.get("COMPATSHIM_AUTO", "").strip().lower() not in ("", "0", "false", "no", "off"):
        __import__("compatshim.auto")
