"""Heartbeats and breadcrumbs: what the other ranks know of this one, written by the monitor.

The hot path (a Fabric collective, a sync point) only updates the in-memory
trail; this watch copies it to the store every tick, so other ranks can tell
a rank that is alive and inside a call from one that is stuck or gone.
"""

from __future__ import annotations

import os

from ._records import Heartbeat, Keys
from ._store import Meeting
from ._trail import TRAIL, Crumb
from ._watch import Watch

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .monitor import Monitor


def beat(meeting: Meeting, now: float) -> None:
    """Heartbeat with the call this rank is in right now, so others can tell a stuck rank."""
    current = TRAIL.current
    meeting.put(
        Keys.heartbeat(meeting.rank),
        Heartbeat(
            time=now,
            pid=os.getpid(),
            host=meeting.host,
            op_seq=current.seq if current is not None else None,
            collective=bool(current is not None and current.collective),
        ),
    )


class Heartbeats(Watch):
    """Every tick: a heartbeat; the breadcrumb whenever it changed since the last one."""

    needs_store = True

    def __init__(self) -> None:
        self._published: tuple[Crumb | None, bool] = (None, False)

    def tick(self, now: float, monitor: Monitor) -> None:
        meeting = monitor.meeting
        assert meeting is not None
        beat(meeting, now)
        crumb = TRAIL.where()
        state = (crumb, crumb is TRAIL.current)
        if crumb is not None and state != self._published:
            meeting.put(Keys.seen(meeting.rank), crumb.as_seen(active=state[1]))
            self._published = state
