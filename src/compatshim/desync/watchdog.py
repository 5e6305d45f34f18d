"""``watchdog(timeout)``: when a rank's main thread stops moving, every rank's stack in one report.

The main thread "has not moved" when it has run no Python code for ``timeout``
seconds: it sits in one call that does not return (a collective that never
completes, a dead lock, a sleep, one C operation longer than the timeout). A
loop that runs Python code keeps moving, even one that polls forever; the
monitor asks every rank through the store for its Python stacks, prints one
report and, with ``action="exit"``, ends the ranks (exit code 70) instead of
waiting for torch's 30-minute timeout. A rank blocked while holding the GIL
cannot answer; the report says so and gives its last breadcrumb.
"""

from __future__ import annotations

import ctypes
import os
import sys
import time
from typing import Any

from .._settings import desync_timeout
from .._text import short
from ._desync_notice import announce_and_end
from ._stacks import hang_report
from ._store import default_meeting
from ._watch import Watch
from .monitor import Monitor, ensure_monitor, get_monitor
from .sync import check_arguments


class _Pulse:
    """How many times the main thread has run Python code when asked (once per tick).

    ``Py_AddPendingCall`` queues a call that the main thread makes between two
    bytecodes, where it handles signals; a thread inside one C call makes none.
    A sample of the main thread's frame cannot tell this: a helper called again
    usually gets its new frame at the old one's address, with the same line.
    """

    def __init__(self) -> None:
        self.beats = 0
        self._asked_in = 0  # the pid that has a call queued (a forked child has none)
        self._call = _PENDING_CALL(self._beat)  # referenced for as long as the process lives

    def _beat(self, _arg: object) -> int:
        self.beats += 1
        self._asked_in = 0
        return 0

    def ask(self) -> None:
        """Queue one call, unless the last one is still waiting for the main thread."""
        pid = os.getpid()
        if self._asked_in == pid:
            return
        self._asked_in = pid  # before: the main thread may answer before the call returns
        if ctypes.pythonapi.Py_AddPendingCall(self._call, None) != 0:
            self._asked_in = 0  # the queue is full: ask at the next tick


_PENDING_CALL = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
_pulse: _Pulse | None = None


def _main_thread_pulse() -> _Pulse:
    global _pulse
    if _pulse is None:
        _pulse = _Pulse()
    return _pulse


class MainThreadStill(Watch):
    """The main thread has run no Python code for ``timeout`` seconds."""

    def __init__(self, timeout: float, action: str) -> None:
        self.timeout = timeout
        self.action = action
        self._pulse = _main_thread_pulse()
        self._beats = self._pulse.beats
        self._since = time.monotonic()

    def tick(self, now: float, monitor: Monitor) -> None:
        beats = self._pulse.beats
        self._pulse.ask()
        if beats != self._beats:
            self._beats, self._since = beats, time.monotonic()
            return
        still = time.monotonic() - self._since
        if still <= self.timeout:
            return
        self._since = time.monotonic()
        headline = (
            f"rank {monitor.rank}'s main thread has not moved for {still:.0f} s "
            f"(watchdog timeout {self.timeout:g} s)"
        )
        report = hang_report(monitor, headline)
        if self.action == "exit":
            announce_and_end(monitor, headline, report)
        print(report, file=sys.stderr, flush=True)


class Watchdog:
    """Handle returned by :func:`watchdog`; ``stop()`` or leave the ``with`` block to disarm."""

    def __init__(self, monitor: Monitor, watch: MainThreadStill) -> None:
        self._monitor = monitor
        self._watch = watch

    def stop(self) -> None:
        self._monitor.remove(self._watch)

    def __enter__(self) -> Watchdog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def watchdog(
    timeout: float | None = None,
    *,
    action: str = "exit",
    store: Any = None,
    rank: int | None = None,
    world_size: int | None = None,
) -> Watchdog:
    """Arm the hang watchdog on this rank (call it on every rank after init_process_group).

    ``action="exit"`` ends every rank after the report; ``"report"`` only prints it.
    Disarmed by ``stop()``, or with everything else when the process group is destroyed.
    Without a process group it watches this process alone (its stacks, its own exit).
    """
    if action not in ("exit", "report"):
        raise ValueError(f"action must be 'exit' or 'report', got {short(action)}")
    check_arguments(timeout, store, rank, world_size)
    limit = desync_timeout(timeout)
    meeting = default_meeting(store, rank, world_size)
    monitor = ensure_monitor(meeting) if meeting is not None else get_monitor()
    watch = MainThreadStill(limit, action)
    monitor.add(watch)
    return Watchdog(monitor, watch)
