"""The desync notice: the rank that finds the ranks out of step tells every other rank.

The reporting rank raises :class:`DesyncError` and writes the notice (its full
report) to the store. Every other rank's monitor acknowledges it; a rank
blocked in a watched call cannot raise, so its monitor prints the report with
its own position and ends the process. A rank that is not blocked gets a grace
period to reach a sync point and raise there itself, except after a hang report
(the watchdog, a stuck call): the reporter ends its own process, so every rank
ends at once. Such a rank may be blocked in a collective compatshim does not
watch, and would otherwise die of gloo's "Connection closed by peer" when the
reporter leaves. A rank that has raised a DesyncError itself is left alone, and
its later sync points ignore the notice: the store holds one notice per run,
the one about what that rank has reported (and may have caught, to go on). A
run is one process group (or one store given as ``store=``): a group created
after the one it reported in is answered like any other.
"""

from __future__ import annotations

import time
import weakref
from typing import Callable, NoReturn

from . import _liveness
from ._ending import EXIT_CODE
from ._records import Ack, DesyncNotice, Keys
from ._sites import format_site
from ._store import Meeting
from ._trail import TRAIL
from ._watch import Watch

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .monitor import Monitor

DESYNC_GRACE = 10.0  # seconds an unblocked rank gets to reach a sync point after a notice
ACK_WAIT = 1.5  # seconds the reporter waits for the others to acknowledge
REPORTER_WAIT = 3.0  # seconds a rank ending on a notice lets the reporter finish printing

_raised_here = False
_raised_run: Callable[[], object] | None = None  # the run (group, or given store) it was in


def raised_here() -> bool:
    """Whether this process has reported ranks out of step (it ends its child ranks at exit)."""
    return _raised_here


def _run_of(meeting: Meeting) -> object:
    return meeting.group if meeting.group is not None else meeting.store


def _held(run: object) -> Callable[[], object]:
    return lambda: run


def raised_in(meeting: Meeting) -> bool:
    """Whether this process has reported ranks out of step in the run of ``meeting``: a
    process group created after the one it reported in (destroy, then init again) is a run
    of its own, whose notices it answers."""
    return _raised_run is not None and _raised_run() is _run_of(meeting)


def notice_out(meeting: Meeting) -> bool:
    """Another rank's desync notice is out, about something this rank has not raised itself."""
    return not raised_in(meeting) and meeting.has([Keys.desync()])


def announce(
    meeting: Meeting, headline: str, report: str, *, wait: bool = True, ends_run: bool = False
) -> None:
    """Tell every rank (through the store) that this one found them out of step.

    ``ends_run``: this rank ends its process after the report; so does every other rank.
    """
    global _raised_here, _raised_run
    _raised_here = True
    run = _run_of(meeting)
    try:
        _raised_run = weakref.ref(run)
    except TypeError:  # not weakly referable: held for as long as this process lives
        _raised_run = _held(run)
    try:
        if not meeting.has([Keys.desync()]):
            notice = DesyncNotice(
                reporter=meeting.rank, headline=headline, report=report, ends_run=ends_run
            )
            meeting.put(Keys.desync(), notice)
        if not wait:
            return
        deadline = time.monotonic() + ACK_WAIT
        others = meeting.others()
        while others and time.monotonic() < deadline:
            others = [
                r
                for r in others
                if not meeting.has([Keys.ack(r)]) and not _liveness.is_gone(meeting, r)
            ]
            time.sleep(0.05)
    except Exception:
        pass  # the report is still raised on this rank


def announce_and_end(monitor: Monitor, headline: str, report: str) -> NoReturn:
    """From the monitor thread: tell the other ranks, print ``report``, end this process."""
    if monitor.meeting is not None:
        announce(monitor.meeting, headline, report, wait=False, ends_run=True)
    monitor.end(report)


def _let_reporter_finish(meeting: Meeting, reporter: int) -> None:
    """Give the reporting rank a moment to print its DesyncError before this rank exits.

    Lightning's launcher kills every rank once a child exits non-zero; leaving
    first could cut the reporting rank off mid-traceback.
    """
    deadline = time.monotonic() + REPORTER_WAIT
    while time.monotonic() < deadline and 0 <= reporter < meeting.world_size:
        try:
            if _liveness.is_gone(meeting, reporter):
                return
        except Exception:
            return  # its store is gone: so is the reporter
        time.sleep(0.1)


class AnswerDesync(Watch):
    """Acknowledge another rank's notice; end this rank when it is blocked or the notice ends
    the run (otherwise after the grace)."""

    needs_store = True

    def __init__(self) -> None:
        self._seen_at: float | None = None

    def tick(self, now: float, monitor: Monitor) -> None:
        meeting = monitor.meeting
        assert meeting is not None
        if not meeting.has([Keys.desync()]):
            return
        meeting.put(Keys.ack(meeting.rank), Ack(time=now))
        if TRAIL.syncing or raised_in(meeting):
            return  # the sync point raises DesyncError itself, or this rank has raised one
        notice = meeting.read(Keys.desync(), DesyncNotice)
        if notice is None or notice.reporter == meeting.rank:
            return
        blocked = TRAIL.current is not None
        if self._seen_at is None:
            self._seen_at = now
        if blocked or notice.ends_run or now - self._seen_at > DESYNC_GRACE:
            _let_reporter_finish(meeting, notice.reporter)
            monitor.end(notice.report + "\n" + self._own_line(meeting.rank, notice.reporter))

    @staticmethod
    def _own_line(rank: int, reporter: int) -> str:
        where = TRAIL.where()
        own = (
            f"{'blocked in' if TRAIL.current is not None else 'last left'} {where.op} called at "
            f"{format_site(where.stack[0] if where.stack else None)}"
            if where is not None
            else "outside any watched call"
        )
        return (
            f"This rank ({rank}, {own}) received rank {reporter}'s report and ends now (exit "
            f"code {EXIT_CODE}): a rank blocked in a collective cannot raise, and would "
            "otherwise hang until torch's timeout."
        )
