"""``watchdog(timeout)``: when a rank's main thread stops moving, every rank's stack in one report.

The per-process monitor samples the main thread's current frame; if it has not
moved for ``timeout`` seconds (a collective that never completes, a dead lock),
the monitor asks every rank through the store for its Python stacks, prints one
report and, with ``action="exit"``, ends the ranks (exit code 70) instead of
waiting for torch's 30-minute timeout. A rank blocked while holding the GIL
cannot answer; the report says so and gives its last breadcrumb.
"""

from __future__ import annotations

import sys
import threading
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


class MainThreadStill(Watch):
    """The main thread's frame and line have not changed for ``timeout`` seconds."""

    def __init__(self, timeout: float, action: str) -> None:
        self.timeout = timeout
        self.action = action
        self._sample: tuple[int, int, float] = (0, 0, time.monotonic())

    def tick(self, now: float, monitor: Monitor) -> None:
        frame = sys._current_frames().get(threading.main_thread().ident or 0)
        if frame is None:
            return
        sample = (id(frame), frame.f_lineno)
        if sample != self._sample[:2]:
            self._sample = (sample[0], sample[1], time.monotonic())
            return
        still = time.monotonic() - self._sample[2]
        if still <= self.timeout:
            return
        self._sample = (0, 0, time.monotonic())
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
