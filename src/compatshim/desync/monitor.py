"""The per-process monitor thread: runs the watches about twice a second, and only while needed.

A rank stuck inside a C++ collective cannot raise a Python exception, so a
background thread does what the main thread cannot. Each job is a
:class:`~._watch.Watch` in its own module:

- with the process group's store (a run of 2+ ranks): heartbeats and
  breadcrumbs (``_heartbeat``), other ranks' stack requests (``_stacks``),
  another rank's desync report (``_desync_notice``), the launcher process
  vanishing (``_parent``);
- on request: watched calls stuck past the timeout (``_stuck``, armed by a
  framework patch through ``_framework``), the public :func:`watchdog`, and a
  framework's own watches (Lightning's launcher children).

The thread runs only while there is something to watch. It stops - the
thread joined, its ``atexit`` handler unregistered, ``destroy_process_group``
restored - when the default process group is destroyed, when the last watch
is removed, at interpreter exit, or on :meth:`Monitor.stop` (also reachable as
``thread.stop()``, which test suites' thread checks call). Nothing else in the
process is replaced: an uncaught exception is read from ``sys.last_value`` at
exit rather than through a ``sys.excepthook`` of ours.
"""

from __future__ import annotations

import atexit
import sys
import threading
import time
from typing import NoReturn

from . import _ending, _group_end
from ._counters import forget_groups
from ._desync_notice import AnswerDesync, raised_here
from ._heartbeat import Heartbeats, beat
from ._parent import ParentGone
from ._stacks import AnswerStackRequests
from ._store import Meeting
from ._store_loss import StoreLoss
from ._watch import Watch

INTERVAL = 0.5  # seconds between ticks
THREAD_NAME = "compatshim-dist-monitor"
JOIN_TIMEOUT = 10.0  # a tick in progress may be finishing a store call


class MonitorThread(threading.Thread):
    """The monitor's thread; ``stop()`` ends the monitor and joins it (for thread checks)."""

    def __init__(self, monitor: Monitor) -> None:
        super().__init__(name=THREAD_NAME, daemon=True)
        self.monitor = monitor
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.wait(INTERVAL):
            self.monitor.tick()

    def stop(self) -> None:
        self.monitor.stop()


class Monitor:
    """The watches of this process and the thread that runs them (see the module docstring)."""

    def __init__(self) -> None:
        self.meeting: Meeting | None = None
        self.ending = False  # this process is ending after a report: watches stand down
        self.store = StoreLoss()
        self._group_watches: list[Watch] = []  # those that come with the meeting
        self._watches: list[Watch] = []  # those added on request
        self._thread: MonitorThread | None = None
        self._lock = threading.RLock()

    @property
    def rank(self) -> int:
        return self.meeting.rank if self.meeting is not None else 0

    @property
    def running(self) -> bool:
        return self._thread is not None

    def watches(self) -> list[Watch]:
        with self._lock:
            return [*self._group_watches, *self._watches]

    # -- what to watch ------------------------------------------------------------------------
    def attach(self, meeting: Meeting) -> None:
        """Watch the process group behind ``meeting`` (2+ ranks); starts the thread."""
        with self._lock:
            if self.meeting is None or self.meeting.store is not meeting.store:
                self.meeting = meeting
                self.store = StoreLoss()
                self._group_watches = [
                    Heartbeats(),
                    AnswerStackRequests(),
                    AnswerDesync(),
                    ParentGone(),
                ]
                beat(meeting, time.time())  # at once: a rank killed soon after must be findable
            self._start()

    def add(self, watch: Watch) -> None:
        with self._lock:
            if watch not in self._watches:
                self._watches.append(watch)
            self._start()

    def remove(self, watch: Watch) -> None:
        """Stop running ``watch``; the monitor stops when nothing is left to watch."""
        with self._lock:
            if watch in self._watches:
                self._watches.remove(watch)
            idle = self.meeting is None and not self._watches
        if idle:
            self.stop()

    # -- the thread ---------------------------------------------------------------------------
    def _start(self) -> None:
        if self._thread is not None:
            return
        self._thread = MonitorThread(self)
        atexit.register(self._at_exit)
        _group_end.install(self._group_destroyed)
        self._thread.start()

    def stop(self) -> None:
        """Forget the process group and every watch, restore what was wrapped, join the thread."""
        thread = self._halt(unregister=True)
        if thread is not None and thread is not threading.current_thread():
            thread.join(JOIN_TIMEOUT)

    def _halt(self, *, unregister: bool) -> MonitorThread | None:
        with self._lock:
            thread, self._thread = self._thread, None
            if thread is None:
                return None
            thread.stopping.set()
            if unregister:  # not from inside the atexit run itself
                atexit.unregister(self._at_exit)
            _group_end.uninstall()
            self.meeting = None  # torch tears its store down in its own order
            self._group_watches, self._watches = [], []
            forget_groups()
            return thread

    def _group_destroyed(self) -> None:
        """Just before the default process group goes: tell the others, then stop watching."""
        meeting = self.meeting
        if meeting is not None and self.store.healthy and not self.ending:
            _ending.left_group(meeting)
        self.stop()

    def tick(self) -> None:
        """One look by every watch; runs on the monitor thread."""
        now = time.time()
        meeting = self.meeting
        if meeting is not None and not meeting.group_alive():
            self._halt(unregister=True)  # destroyed behind our back: nothing left to watch
            return
        store_ok = meeting is not None and self.store.may_try(now)
        for watch in self.watches():
            if self.ending:
                return
            if watch.needs_store and not store_ok:
                continue
            try:
                watch.tick(now, self)
            except Exception as exc:
                if not watch.needs_store:  # never let the monitor die silently
                    print(f"compatshim.dist monitor: {type(exc).__name__}: {exc}", file=sys.stderr)
                    continue
                store_ok = False
                self.store.failed(exc, now, self)
        if store_ok:
            self.store.answered()

    # -- ending -------------------------------------------------------------------------------
    def end(self, report: str, *, write_record: bool = True) -> NoReturn:
        """Print ``report``, let every watch clean up, and end this process (exit code 70)."""
        self.ending = True
        _ending.end_process(report, self.meeting, self.watches(), write_record=write_record)

    def _at_exit(self) -> None:
        meeting, watches, healthy = self.meeting, self.watches(), self.store.healthy
        thread = self._halt(unregister=False)
        if thread is not None:
            thread.join(2.0)
        _ending.at_exit(meeting if healthy else None, watches, reported=raised_here())


_monitor: Monitor | None = None
_monitor_lock = threading.Lock()


def get_monitor() -> Monitor:
    global _monitor
    with _monitor_lock:
        if _monitor is None:
            _monitor = Monitor()
        return _monitor


def ensure_monitor(meeting: Meeting) -> Monitor:
    monitor = get_monitor()
    monitor.attach(meeting)
    return monitor
