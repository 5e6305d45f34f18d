"""Breadcrumbs: where this process is, kept in memory so a training step pays almost nothing.

Entering a watched operation (a Fabric collective, a sync point) costs one
frame walk and two attribute writes. The background monitor publishes the
latest breadcrumb to the store; the hot path never talks to the network.
"""

from __future__ import annotations

import threading
import time

from ._records import Seen, Site
from ._sites import user_frames


class Crumb:
    """One entered operation: its name, the user's call site and a short stack."""

    __slots__ = ("collective", "op", "seq", "since", "stack")

    def __init__(self, op: str, stack: list[Site], seq: int, collective: bool) -> None:
        self.op = op
        self.stack = stack
        self.since = time.time()
        self.seq = seq
        self.collective = collective  # a world-wide collective: blocks until every rank joins it

    def as_seen(self, active: bool) -> Seen:
        """The store record of this breadcrumb; ``active`` while the call is still running."""
        return Seen(
            op=self.op,
            stack=self.stack,
            since=self.since,
            active=active,
            seq=self.seq,
            collective=self.collective,
        )


class Trail:
    """The operation this process is inside (``current``) and the last one it left."""

    def __init__(self) -> None:
        self.current: Crumb | None = None
        self.last: Crumb | None = None
        self.seq = 0
        self.syncing = 0  # >0 while a sync point waits (it keeps its own timeout)
        self._local = threading.local()

    def enter(self, op: str, collective: bool = False) -> Crumb | None:
        """Record entering ``op``; None when already inside a watched op on this thread."""
        if getattr(self._local, "depth", 0):
            self._local.depth += 1
            return None
        self._local.depth = 1
        self.seq += 1
        crumb = Crumb(op, user_frames(limit=4), self.seq, collective)
        self.current = crumb
        return crumb

    def leave(self, crumb: Crumb | None) -> None:
        self._local.depth -= 1
        if crumb is not None:
            self.last = crumb
            if self.current is crumb:
                self.current = None

    def where(self) -> Crumb | None:
        """The op this process is in, else the last one it left."""
        return self.current or self.last

    def waiting_in(self) -> Crumb | None:
        """The watched call this process is blocked in, None while a sync point waits.

        A sync point keeps its own timeout and raises its own report, so the
        monitor leaves a process inside one alone.
        """
        return None if self.syncing else self.current


TRAIL = Trail()
