"""One background thread per process that keeps the store up to date and ends hopeless waits.

A rank stuck inside a C++ collective cannot raise a Python exception, so this
thread does what the main thread cannot:

- publishes a heartbeat and the latest breadcrumb (the hot path never does);
- answers another rank's desync report: a rank blocked in a watched call
  prints the report and exits (code 70), instead of hanging until torch's
  30-minute timeout;
- ends a watched call stuck past the timeout, with every rank's Python stack;
- in Lightning's launcher process, watches the child ranks it started and
  records their exit codes, so a child that exits before ``launch()`` or in the
  middle of a run is reported at once, with its exit code;
- writes this rank's exit record at interpreter exit.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
import time
import traceback
import uuid
from types import FrameType, TracebackType
from typing import Any, Callable, Optional

from . import _liveness
from ._sites import format_site
from ._store import Meeting, resolve_timeout
from ._trail import TRAIL
from .report import build_report

EXIT_CODE = 70  # EX_SOFTWARE: the process was ended after a desync/hang report
INTERVAL = 0.5
DESYNC_GRACE = 10.0  # seconds an unblocked rank gets to reach a sync point after a report
STACKS_WAIT = 3.0


def exit_description(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = "unknown signal"
        return f"killed by signal {-code} ({name})"
    return f"exit code {code}"


def thread_stacks() -> str:
    """Every thread's Python stack in this process, main thread first, this thread left out."""
    frames = sys._current_frames()
    names = {t.ident: t.name for t in threading.enumerate()}
    main = threading.main_thread().ident
    me = threading.get_ident()
    parts = []
    for ident in sorted(frames, key=lambda i: i != main):
        if ident == me:
            continue
        stack = "".join(traceback.format_stack(frames[ident]))
        parts.append(f'Thread "{names.get(ident, ident)}":\n{stack}')
    return "\n".join(parts)


class Monitor:
    """State and loop of the per-process monitor thread (see the module docstring)."""

    def __init__(self) -> None:
        self.meeting: Optional[Meeting] = None
        self.timeout = resolve_timeout(None)
        self.watch_ops = False  # end watched calls stuck past ``timeout`` (Lightning patch)
        self.hang_timeout: Optional[float] = None  # public watchdog: main thread not moving
        self.hang_action = "exit"
        self.children: list[tuple[int, Any]] = []  # (rank, subprocess.Popen)
        self.launcher_children: Optional[Callable[[], list[tuple[int, Any]]]] = None
        self.child_exit_noticed: dict[int, float] = {}
        self.raised_desync = False
        self.uncaught: Optional[str] = None
        self._thread: Optional[threading.Thread] = None
        self._lock = threading.Lock()
        self._published: tuple[object, bool] = (None, False)
        self._desync_seen_at: Optional[float] = None
        self._answered_hangs: set[str] = set()
        self._store_failing_since: Optional[float] = None
        self._last_store_try = 0.0
        self._ppid = os.getppid()
        self._main_sample: tuple[int, int, float] = (0, 0, time.monotonic())
        self._ending = False

    # -- set-up ---------------------------------------------------------------------------
    def start(self) -> None:
        with self._lock:
            if self._thread is not None:
                return
            self._thread = threading.Thread(target=self._run, name="compatshim-dist-monitor", daemon=True)
            self._thread.start()
            atexit.register(self._at_exit)
            previous = sys.excepthook

            def hook(kind: type[BaseException], value: BaseException, tb: Optional[TracebackType]) -> None:
                self.uncaught = f"uncaught {kind.__name__}"
                previous(kind, value, tb)

            sys.excepthook = hook

    def attach(self, meeting: Meeting) -> None:
        if self.meeting is None or self.meeting.store is not meeting.store:
            self.meeting = meeting
            self._beat(meeting, time.time())  # at once: a rank killed soon after must be findable
        self.start()

    # -- the loop ---------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._ending:
            time.sleep(INTERVAL)
            try:
                self._tick()
            except Exception as exc:  # never let the monitor die silently
                print(f"compatshim.dist monitor: {type(exc).__name__}: {exc}", file=sys.stderr)

    def _tick(self) -> None:
        now = time.time()
        self._watch_children(now)
        meeting = self.meeting
        failing = self._store_failing_since
        if meeting is not None and (failing is None or now - self._last_store_try > 1.0):
            self._last_store_try = now
            try:
                self._publish(meeting, now)
                self._answer(meeting, now)
                self._store_failing_since = None
            except Exception as exc:
                self._store_lost(exc, now)
        self._check_stuck(now)
        self._check_parent()

    def _beat(self, meeting: Meeting, now: float) -> None:
        meeting.put(meeting.key("hb", meeting.rank), {"time": now, "pid": os.getpid(), "host": meeting.host})

    def _publish(self, meeting: Meeting, now: float) -> None:
        self._beat(meeting, now)
        crumb = TRAIL.where()
        state = (crumb, crumb is TRAIL.current)
        if crumb is not None and state != self._published:
            record = crumb.as_record()
            record["active"] = state[1]
            meeting.put(meeting.key("seen", meeting.rank), record)
            self._published = state

    def _answer(self, meeting: Meeting, now: float) -> None:
        """React to another rank's desync report or stack request."""
        hang = meeting.read(meeting.key("hang")) if meeting.has([meeting.key("hang")]) else None
        if hang and hang["id"] not in self._answered_hangs:
            self._answered_hangs.add(hang["id"])
            meeting.put(meeting.key("stack", hang["id"], meeting.rank), thread_stacks())
        if not meeting.has([meeting.key("desync")]):
            return
        meeting.put(meeting.key("ack", meeting.rank), now)
        if TRAIL.syncing or self._ending:
            return  # the sync point raises DesyncError itself
        desync = meeting.read(meeting.key("desync")) or {}
        if desync.get("from") == meeting.rank:
            return
        blocked = TRAIL.current is not None
        if self._desync_seen_at is None:
            self._desync_seen_at = now
        if blocked or now - self._desync_seen_at > DESYNC_GRACE:
            where = TRAIL.where()
            own = (
                f"{'blocked in' if blocked else 'last left'} {where.op} called at "
                f"{format_site(where.stack[0] if where.stack else None)}"
                if where
                else "outside any watched call"
            )
            report = (
                f"{desync.get('report', '')}\n"
                f"compatshim.dist: rank {meeting.rank} ({own}) received rank "
                f"{desync.get('from')}'s report and ends now (exit code {EXIT_CODE}); a rank blocked "
                "in a collective cannot raise, and would otherwise hang until torch's timeout."
            )
            self.terminate(report)

    def _store_lost(self, exc: Exception, now: float) -> None:
        if self._store_failing_since is None:
            self._store_failing_since = now
            return
        if now - self._store_failing_since > 3.0 and (TRAIL.current is not None) and not TRAIL.syncing:
            where = TRAIL.current
            self.terminate(
                f"compatshim.dist: rank {self.meeting.rank if self.meeting else '?'} lost the process "
                f"group's store ({type(exc).__name__}: {exc}) while blocked in {where.op} called at "
                f"{format_site(where.stack[0] if where.stack else None)}; the rank that hosts the "
                "store (rank 0) has most likely ended. Ending this rank too.",
                write_record=False,
            )

    def _check_parent(self) -> None:
        if self._ppid > 1 and os.getppid() != self._ppid and TRAIL.current is not None and not TRAIL.syncing:
            where = TRAIL.current
            self.terminate(
                f"compatshim.dist: the launcher process (pid {self._ppid}) is gone while this rank "
                f"is blocked in {where.op} called at "
                f"{format_site(where.stack[0] if where.stack else None)}; ending this rank."
            )

    # -- Lightning's launcher: the child ranks -------------------------------------------------
    def _watch_children(self, now: float) -> None:
        if self.launcher_children is not None:
            self.children = self.launcher_children()
        for rank, proc in self.children:
            code = proc.poll()
            if code is None:
                continue
            if rank not in self.child_exit_noticed:
                self.child_exit_noticed[rank] = now
                if self.meeting is not None:
                    how = f"{exit_description(code)} (process {proc.pid}, seen by the launcher)"
                    try:
                        self.meeting.put(self.meeting.key("exit", rank), {"how": how, "code": code})
                    except Exception:
                        pass
                continue
            where = TRAIL.current
            if where is None or TRAIL.syncing or where.since > self.child_exit_noticed[rank]:
                continue
            if now - self.child_exit_noticed[rank] >= 1.0:
                self.terminate(self._child_exit_report(rank, proc, code))

    def _child_exit_report(self, rank: int, proc: Any, code: int) -> str:
        where = TRAIL.current
        assert where is not None
        me = self.meeting.rank if self.meeting else 0
        ranks: dict[int, dict[str, Any]] = {}
        if self.meeting is not None:
            for r in range(self.meeting.world_size):
                try:
                    ranks[r] = _liveness.describe(self.meeting, r)
                except Exception:
                    ranks[r] = {}
        seen = where.as_record()
        seen["active"] = True
        ranks.setdefault(me, {})["seen"] = seen
        ranks[me]["self"] = True
        for other, other_proc in self.children:
            info = ranks.setdefault(other, {})
            other_code = other_proc.poll()
            if other_code is not None:
                info["exit"] = {"how": f"{exit_description(other_code)} (process {other_proc.pid})"}
        before = self.meeting is None
        headline = (
            f"rank {rank} {exit_description(code)} before joining the process group while rank {me} "
            f"waits in {where.op}"
            if before
            else f"rank {rank} {exit_description(code)} while rank {me} waits in {where.op}"
        )
        differs = [
            f"rank {me} called {where.op} at {format_site(where.stack[0] if where.stack else None)}; "
            f"rank {rank} ended without "
            + ("ever calling it (is launch() in code that only the main process runs?)" if before else "joining it")
        ]
        return build_report(headline=headline, ranks=ranks, differs=differs)

    # -- stuck calls and the public watchdog ----------------------------------------------------
    def _check_stuck(self, now: float) -> None:
        if TRAIL.syncing or self._ending:
            return
        current = TRAIL.current
        if self.watch_ops and current is not None and now - current.since > self.timeout:
            self.hang_report(
                f"rank {self._rank()} is stuck in {current.op} for more than {self.timeout:g} s "
                f"(called at {format_site(current.stack[0] if current.stack else None)})",
                action="exit",
            )
            return
        if self.hang_timeout is None:
            return
        frame: Optional[FrameType] = sys._current_frames().get(threading.main_thread().ident or 0)
        if frame is None:
            return
        sample = (id(frame), frame.f_lineno)
        if sample != self._main_sample[:2]:
            self._main_sample = (sample[0], sample[1], time.monotonic())
            return
        still = time.monotonic() - self._main_sample[2]
        if still > self.hang_timeout:
            self._main_sample = (0, 0, time.monotonic())
            self.hang_report(
                f"rank {self._rank()}'s main thread has not moved for {still:.0f} s "
                f"(watchdog timeout {self.hang_timeout:g} s)",
                action=self.hang_action,
            )

    def _rank(self) -> int:
        return self.meeting.rank if self.meeting else 0

    def hang_report(self, headline: str, action: str) -> str:
        """Collect every rank's stacks through the store, print one report, then act."""
        meeting = self.meeting
        stacks = {self._rank(): thread_stacks()}
        ranks: dict[int, dict[str, Any]] = {}
        if meeting is not None:
            try:
                ident = uuid.uuid4().hex[:12]
                self._answered_hangs.add(ident)
                meeting.put(meeting.key("hang"), {"id": ident, "from": meeting.rank})
                deadline = time.monotonic() + STACKS_WAIT
                others = [r for r in range(meeting.world_size) if r != meeting.rank]
                while others and time.monotonic() < deadline:
                    for r in list(others):
                        text = meeting.read(meeting.key("stack", ident, r))
                        if text is not None:
                            stacks[r] = text
                            others.remove(r)
                        elif _liveness.is_gone(meeting, r):
                            others.remove(r)
                    time.sleep(0.1)
                for r in range(meeting.world_size):
                    ranks[r] = _liveness.describe(meeting, r)
                    ranks[r]["self"] = r == meeting.rank
                    if r not in stacks:
                        stacks[r] = "(no answer: " + (
                            "the process has ended)" if ranks[r].get("exit") else
                            "its monitor did not run - blocked holding the GIL, or no compatshim "
                            "monitor in that rank)"
                        )
            except Exception as exc:
                stacks[self._rank()] += f"\n(could not reach the store: {type(exc).__name__}: {exc})"
        report = build_report(headline=headline, ranks=ranks, differs=[], stacks=stacks)
        if action == "exit":
            if meeting is not None:
                announce_desync(meeting, headline, report, wait=False)
            self.terminate(report)
        else:
            print(report, file=sys.stderr, flush=True)
        return report

    # -- ending ---------------------------------------------------------------------------
    def terminate(self, report: str, write_record: bool = True) -> None:
        """Print ``report``, end the child ranks this process launched, and exit (code 70)."""
        self._ending = True
        print(report, file=sys.stderr, flush=True)
        if write_record and self.meeting is not None:
            try:
                self.meeting.put(
                    self.meeting.key("exit", self.meeting.rank),
                    {"how": f"ended by compatshim after a desync report (exit code {EXIT_CODE})"},
                )
            except Exception:
                pass
        self._end_children(grace=3.0)
        sys.stdout.flush()
        os._exit(EXIT_CODE)

    def _end_children(self, grace: float) -> None:
        deadline = time.monotonic() + grace
        for _rank, proc in self.children:
            while proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
        for _rank, proc in self.children:
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)

    def _at_exit(self) -> None:
        self._ending = True
        if self.raised_desync and self.children:
            self._end_children(grace=5.0)
        meeting = self.meeting
        if meeting is None or self._store_failing_since is not None:
            return
        how = f"{self.uncaught} at interpreter exit" if self.uncaught else "interpreter exited normally"
        try:
            crumb = TRAIL.where()
            if crumb is not None:
                record = crumb.as_record()
                record["active"] = False
                meeting.put(meeting.key("seen", meeting.rank), record)
            if not meeting.has([meeting.key("exit", meeting.rank)]):
                meeting.put(meeting.key("exit", meeting.rank), {"how": how})
        except Exception:
            pass


_monitor: Optional[Monitor] = None
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


def announce_desync(meeting: Meeting, headline: str, report: str, wait: bool = True) -> None:
    """Tell every rank (through the store) that this one found them out of step."""
    monitor = get_monitor()
    monitor.raised_desync = True
    try:
        if not meeting.has([meeting.key("desync")]):
            meeting.put(meeting.key("desync"), {"from": meeting.rank, "headline": headline, "report": report})
        if not wait:
            return
        deadline = time.monotonic() + 3 * INTERVAL
        others = [r for r in range(meeting.world_size) if r != meeting.rank]
        while others and time.monotonic() < deadline:
            others = [
                r
                for r in others
                if not meeting.has([meeting.key("ack", r)]) and not _liveness.is_gone(meeting, r)
            ]
            time.sleep(0.05)
    except Exception:
        pass  # the report is still raised on this rank
