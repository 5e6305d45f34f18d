"""A watched call stuck past the timeout, with nobody else moving: end the run with stacks.

Armed by a framework patch (:func:`._framework.watch_calls`), not by
``sync_point`` alone. A call may get an allowance on top of the timeout
(Fabric's ``launch`` waits for the other ranks to import torch). A long wait
alone ends nothing while another rank still runs its own code: rank 0
evaluating for an hour while the others wait in ``barrier()`` is left alone,
and torch's own timeout stays in charge there.
"""

from __future__ import annotations

from typing import Mapping

from . import _liveness
from ._desync_notice import announce_and_end
from ._records import Heartbeat, Keys
from ._sites import format_site
from ._stacks import hang_report
from ._store import Meeting
from ._trail import TRAIL
from ._watch import Watch

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .monitor import Monitor

ASK_EVERY = 5.0  # seconds between asking every rank whether it is moving


class StuckCalls(Watch):
    """End a watched call older than ``timeout`` (plus its op's allowance) once nobody moves."""

    def __init__(self, timeout: float, allowances: Mapping[str, float]) -> None:
        self.timeout = timeout
        self.allowances = dict(allowances)
        self._next_ask = 0.0

    def tick(self, now: float, monitor: Monitor) -> None:
        current = TRAIL.waiting_in()
        if current is None:
            return
        limit = self.timeout + self.allowances.get(current.op, 0.0)
        if now - current.since > limit and self._nobody_moving(monitor.meeting, now):
            headline = (
                f"rank {monitor.rank} is stuck in {current.op} for more than {limit:g} s "
                f"(called at {format_site(current.stack[0] if current.stack else None)})"
            )
            announce_and_end(monitor, headline, hang_report(monitor, headline))

    def _nobody_moving(self, meeting: Meeting | None, now: float) -> bool:
        """Every other rank is inside a watched call too, has ended, or has gone silent."""
        if meeting is None:
            return True  # before the process group exists (launch): nothing else to ask
        if now < self._next_ask:
            return False
        self._next_ask = now + ASK_EVERY  # asks every rank: not on every tick
        try:
            for rank in meeting.others():
                if _liveness.is_gone(meeting, rank):
                    continue
                beat = meeting.read(Keys.heartbeat(rank), Heartbeat)
                silent = beat is None or now - beat.time > _liveness.SILENT_AFTER
                if not silent and beat is not None and beat.op_seq is None:
                    return False
        except Exception:
            return False
        return True
