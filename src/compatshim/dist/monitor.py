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
import contextlib
import os
import signal
import sys
import threading
import time
import traceback
from types import FrameType, TracebackType
from typing import Any, Callable

from . import _liveness
from ._counters import forget_groups
from ._sites import format_site
from ._store import Meeting, resolve_timeout
from ._trail import TRAIL
from .report import build_report

EXIT_CODE = 70  # EX_SOFTWARE: the process was ended after a desync/hang report
INTERVAL = 0.5
DESYNC_GRACE = 10.0  # seconds an unblocked rank gets to reach a sync point after a report
STACKS_WAIT = 3.0
START_UP_ALLOWANCE = 60.0  # extra seconds for ops that wait on other processes starting up


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
        self.meeting: Meeting | None = None
        self.timeout = resolve_timeout(None)
        self.watch_ops = False  # end watched calls stuck past ``timeout`` (Lightning patch)
        self.start_up_ops: set[str] = set()  # ops that get START_UP_ALLOWANCE on top
        self.hang_timeout: float | None = None  # public watchdog: main thread not moving
        self.hang_action = "exit"
        self.children: list[tuple[int, Any]] = []  # (rank, subprocess.Popen)
        self.launcher_children: Callable[[], list[tuple[int, Any]]] | None = None
        self.child_exit_noticed: dict[int, float] = {}
        self.raised_desync = False
        self.uncaught: str | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._published: tuple[object, bool] = (None, False)
        self._desync_seen_at: float | None = None
        self._stacks_answered = 0
        self._store_failing_since: float | None = None
        self._last_store_try = 0.0
        self._ppid = os.getppid()
        self._main_sample: tuple[int, int, float] = (0, 0, time.monotonic())
        self._ending = False
        self._wake = threading.Event()
        self._next_stuck_check = 0.0

    # -- set-up ---------------------------------------------------------------------------
    def start(self) -> None:
        with self._lock:
            if self._thread is not None:
                return
            self._thread = threading.Thread(
                target=self._run, name="compatshim-dist-monitor", daemon=True
            )
            self._thread.start()
            atexit.register(self._at_exit)
            previous = sys.excepthook

            def hook(
                kind: type[BaseException], value: BaseException, tb: TracebackType | None
            ) -> None:
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
            self._wake.wait(INTERVAL)
            if self._ending:
                break
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
        """Heartbeat with the op this rank is in right now, so others can tell a stuck rank."""
        current = TRAIL.current
        meeting.put(
            meeting.key("hb", meeting.rank),
            {
                "time": now,
                "pid": os.getpid(),
                "host": meeting.host,
                "op_seq": current.seq if current is not None else None,
                "collective": bool(current is not None and current.collective),
            },
        )

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
        self._answer_stack_requests(meeting)
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
                f"compatshim.dist.DesyncError reported by rank {desync.get('from')}:\n"
                f"{desync.get('report', '')}\n"
                f"compatshim.dist: rank {meeting.rank} ({own}) received rank "
                f"{desync.get('from')}'s report and ends now (exit code {EXIT_CODE}); a rank "
                "blocked "
                "in a collective cannot raise, and would otherwise hang until torch's timeout."
            )
            self._let_reporter_finish(meeting, int(desync.get("from", -1)))
            self.terminate(report)

    def _answer_stack_requests(self, meeting: Meeting) -> None:
        """Post this process's stacks for every hang report asked for so far."""
        asked = int(meeting.store.add(meeting.key("hangs"), 0))
        for number in range(self._stacks_answered + 1, asked + 1):
            meeting.put(meeting.key("stack", number, meeting.rank), thread_stacks())
        self._stacks_answered = max(self._stacks_answered, asked)

    def _let_reporter_finish(self, meeting: Meeting, reporter: int) -> None:
        """Give the reporting rank a moment to print its DesyncError before this rank exits.

        Lightning's launcher kills every rank once a child exits non-zero; leaving
        first could cut the reporting rank off mid-traceback.
        """
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline and 0 <= reporter < meeting.world_size:
            try:
                if _liveness.is_gone(meeting, reporter):
                    return
            except Exception:
                return  # its store is gone: so is the reporter
            time.sleep(0.1)

    def _store_lost(self, exc: Exception, now: float) -> None:
        if self._store_failing_since is None:
            self._store_failing_since = now
            return
        if (
            now - self._store_failing_since > 3.0
            and (TRAIL.current is not None)
            and not TRAIL.syncing
        ):
            where = TRAIL.current
            self.terminate(
                f"compatshim.dist: rank {self._rank()} lost the process group's store "
                f"({type(exc).__name__}: {exc}) while blocked in {where.op} called at "
                f"{format_site(where.stack[0] if where.stack else None)}; the rank that hosts the "
                "store (rank 0) has most likely ended. Ending this rank too.",
                write_record=False,
            )

    def _check_parent(self) -> None:
        if (
            self._ppid > 1
            and os.getppid() != self._ppid
            and TRAIL.current is not None
            and not TRAIL.syncing
        ):
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
                    with contextlib.suppress(Exception):
                        self.meeting.put(self.meeting.key("exit", rank), {"how": how, "code": code})
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
            f"rank {rank} ended ({exit_description(code)}) before joining the process group "
            f"while rank {me} "
            f"waits in {where.op}"
            if before
            else f"rank {rank} ended ({exit_description(code)}) while rank {me} waits in {where.op}"
        )
        differs = [
            f"rank {me} called {where.op} at "
            f"{format_site(where.stack[0] if where.stack else None)}; "
            f"rank {rank} ended without "
            + (
                "ever calling it (is launch() in code that only the main process runs?)"
                if before
                else "joining it"
            )
        ]
        return build_report(headline=headline, ranks=ranks, differs=differs)

    # -- stuck calls and the public watchdog ----------------------------------------------------
    def _check_stuck(self, now: float) -> None:
        if TRAIL.syncing or self._ending:
            return
        current = TRAIL.current
        limit = self.timeout
        if current is not None and current.op in self.start_up_ops:
            limit += START_UP_ALLOWANCE
        if (
            self.watch_ops
            and current is not None
            and now - current.since > limit
            and self._nobody_moving(now)
        ):
            self.hang_report(
                f"rank {self._rank()} is stuck in {current.op} for more than {limit:g} s "
                f"(called at {format_site(current.stack[0] if current.stack else None)})",
                action="exit",
            )
            return
        if self.hang_timeout is None:
            return
        frame: FrameType | None = sys._current_frames().get(threading.main_thread().ident or 0)
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

    def _nobody_moving(self, now: float) -> bool:
        """Every other rank is inside a watched call too, has ended, or has gone silent.

        A rank still running its own code (rank 0 evaluating while the others wait
        in a barrier) may yet arrive, so a long wait alone ends nothing: torch's own
        timeout stays in charge of that case.
        """
        meeting = self.meeting
        if meeting is None:
            return True  # before the process group exists (launch): nothing else to ask
        if now < self._next_stuck_check:
            return False
        self._next_stuck_check = now + 5.0  # asks every rank: not on every tick
        try:
            for rank in range(meeting.world_size):
                if rank == meeting.rank or _liveness.is_gone(meeting, rank):
                    continue
                beat = meeting.read(meeting.key("hb", rank)) or {}
                silent = now - float(beat.get("time", 0)) > _liveness.SILENT_AFTER
                if beat.get("op_seq") is None and not silent:
                    return False
        except Exception:
            return False
        return True

    def _rank(self) -> int:
        return self.meeting.rank if self.meeting else 0

    def hang_report(self, headline: str, action: str) -> str:
        """Collect every rank's stacks through the store, print one report, then act."""
        meeting = self.meeting
        stacks = {self._rank(): thread_stacks()}
        ranks: dict[int, dict[str, Any]] = {}
        if meeting is not None:
            try:
                number = int(meeting.store.add(meeting.key("hangs"), 1))
                meeting.put(meeting.key("stack", number, meeting.rank), stacks[meeting.rank])
                deadline = time.monotonic() + STACKS_WAIT
                others = [r for r in range(meeting.world_size) if r != meeting.rank]
                while others and time.monotonic() < deadline:
                    self._answer_stack_requests(meeting)  # another rank may be asking at once
                    for r in list(others):
                        text = meeting.read(meeting.key("stack", number, r))
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
                            "the process has ended)"
                            if ranks[r].get("exit")
                            else "its monitor did not run - blocked holding the GIL, or no "
                            "compatshim "
                            "monitor in that rank)"
                        )
            except Exception as exc:
                stacks[self._rank()] += (
                    f"\n(could not reach the store: {type(exc).__name__}: {exc})"
                )
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
            with contextlib.suppress(Exception):
                self.meeting.put(
                    self.meeting.key("exit", self.meeting.rank),
                    {"how": f"ended by compatshim after a desync report (exit code {EXIT_CODE})"},
                )
        self._await_departures(limit=2.0)
        self._end_children(grace=3.0)
        sys.stdout.flush()
        os._exit(EXIT_CODE)

    def _await_departures(self, limit: float) -> None:
        """Leave together, for at most ``limit`` seconds.

        A rank that exits first closes the transport under a peer blocked in a
        collective, whose main thread then raises gloo's "Connection closed"
        instead of ending with this report. Every ending rank (and every rank's
        interpreter exit) writes an exit record, so wait for all of them.
        """
        meeting = self.meeting
        if meeting is None:
            return
        keys = [meeting.key("exit", rank) for rank in range(meeting.world_size)]
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            try:
                if meeting.has(keys):
                    return
            except Exception:
                return  # the store is gone: nobody left to wait for
            time.sleep(0.01)

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
        self._wake.set()
        if self._thread is not None:
            self._thread.join(2.0)
        meeting, self.meeting = self.meeting, None  # let torch tear its store down in its own order
        forget_groups()
        if meeting is not None and self._store_failing_since is None:
            self._write_exit_record(meeting)  # first: ranks waiting on this one may leave now
        if self.raised_desync and self.children:
            self._end_children(grace=5.0)

    def _write_exit_record(self, meeting: Meeting) -> None:
        how = (
            f"{self.uncaught} at interpreter exit"
            if self.uncaught
            else "interpreter exited normally"
        )
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


def announce_desync(meeting: Meeting, headline: str, report: str, wait: bool = True) -> None:
    """Tell every rank (through the store) that this one found them out of step."""
    monitor = get_monitor()
    monitor.raised_desync = True
    try:
        if not meeting.has([meeting.key("desync")]):
            meeting.put(
                meeting.key("desync"),
                {"from": meeting.rank, "headline": headline, "report": report},
            )
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
