"""Every rank's Python stacks in one report: answering requests, and asking for them.

A hang report (the public :func:`watchdog`, or a watched call stuck past the
timeout) bumps the store's ``hangs`` counter; every rank's monitor answers
each new request number with its own threads' stacks. A rank blocked while
holding the GIL cannot answer; the report says so and gives its last breadcrumb.
"""

from __future__ import annotations

import sys
import threading
import time
import traceback

from . import _liveness
from ._liveness import RankState
from ._records import Keys, StackDump
from ._store import Meeting
from ._watch import Watch
from .desync_report import build_report

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .monitor import Monitor

STACKS_WAIT = 3.0  # seconds to wait for the other ranks' answers


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


class AnswerStackRequests(Watch):
    """Post this process's stacks for every hang report asked for so far."""

    needs_store = True

    def __init__(self) -> None:
        self.answered = 0

    def tick(self, now: float, monitor: Monitor) -> None:
        meeting = monitor.meeting
        assert meeting is not None
        self.answer(meeting)

    def answer(self, meeting: Meeting) -> None:
        asked = meeting.count(Keys.hangs())
        for number in range(self.answered + 1, asked + 1):
            meeting.put(Keys.stacks(number, meeting.rank), StackDump(thread_stacks()))
        self.answered = max(self.answered, asked)


def _gather(meeting: Meeting, own: str, answering: AnswerStackRequests) -> dict[int, str]:
    """Ask every rank for its stacks and wait (briefly) for the answers.

    Runs on the monitor thread, so ``answering`` (the monitor's own watch) keeps
    answering meanwhile: another rank may be asking at the same moment.
    """
    number = meeting.count(Keys.hangs(), 1)
    meeting.put(Keys.stacks(number, meeting.rank), StackDump(own))
    stacks = {meeting.rank: own}
    deadline = time.monotonic() + STACKS_WAIT
    others = meeting.others()
    while others and time.monotonic() < deadline:
        answering.answer(meeting)
        for rank in list(others):
            dump = meeting.read(Keys.stacks(number, rank), StackDump)
            if dump is not None:
                stacks[rank] = dump.text
                others.remove(rank)
            elif _liveness.is_gone(meeting, rank):
                others.remove(rank)
        time.sleep(0.1)
    # only the asking rank reads them: a watchdog with action="report" asks again every
    # timeout while a rank stays still, and the store would keep every rank's stacks each time
    meeting.drop([Keys.stacks(number, rank) for rank in range(meeting.world_size)])
    return stacks


def _no_answer(info: RankState) -> str:
    if info.exit is not None:
        return "(no answer: the process has ended)"
    return (
        "(no answer: its monitor did not run - blocked holding the GIL, or no compatshim "
        "monitor in that rank)"
    )


def hang_report(monitor: Monitor, headline: str) -> str:
    """One report: ``headline``, every rank's state and every rank's Python stacks."""
    meeting = monitor.meeting
    own = thread_stacks()
    stacks = {monitor.rank: own}
    ranks: dict[int, RankState] = {}
    if meeting is not None:
        answering = next(
            (w for w in monitor.watches() if isinstance(w, AnswerStackRequests)),
            AnswerStackRequests(),
        )
        try:
            stacks = _gather(meeting, own, answering)
            ranks = _liveness.describe_all(meeting)
            for rank, info in ranks.items():
                stacks.setdefault(rank, _no_answer(info))
        except Exception as exc:
            stacks[monitor.rank] += f"\n(could not reach the store: {type(exc).__name__}: {exc})"
    return build_report(headline=headline, ranks=ranks, differs=[], stacks=stacks, meeting=False)
