"""``sync_point``: ranks meet in the key-value store, where a wait can time out.

Each rank writes an arrival record (tag, call site, short stack, pid) under a
per-group sequence number, then polls with ``check`` until every rank's record
for the same number is there. Arrivals with different tags, a rank whose
process exited or vanished, or the timeout turn into one :class:`DesyncError`
report built from what every rank left in the store.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable

from . import _liveness
from ._counters import next_seq
from ._sites import user_frames
from ._store import Meeting, default_meeting, resolve_timeout
from ._trail import TRAIL
from .report import DesyncError, build_report

Compare = Callable[[dict[int, Any]], list[str]]


def _group_identity(meeting: Meeting, store: Any) -> object:
    if store is not None:
        return store
    import torch.distributed as dist

    return dist.distributed_c10d._get_default_group()


def sync_point(
    tag: str,
    timeout: float | None = None,
    *,
    store: Any = None,
    rank: int | None = None,
    world_size: int | None = None,
) -> None:
    """Wait until every rank reaches a sync point with the same ``tag``; else raise DesyncError.

    ``timeout`` defaults to ``COMPATSHIM_DESYNC_TIMEOUT`` or 300 s. Uses the default
    process group's store unless ``store`` (with ``rank`` and ``world_size``) is
    given. In a single-process run it returns at once.
    """
    meet(tag, timeout, store=store, rank=rank, world_size=world_size)


def meet(
    tag: str,
    timeout: float | None = None,
    *,
    payload: Any = None,
    compare: Compare | None = None,
    store: Any = None,
    rank: int | None = None,
    world_size: int | None = None,
) -> dict[int, Any] | None:
    """``sync_point`` with an optional payload compared across ranks; returns payloads by rank."""
    if not isinstance(tag, str) or not tag:
        raise TypeError(f"sync point tag must be a non-empty string, got {tag!r}")
    limit = resolve_timeout(timeout)
    meeting = default_meeting(store, rank, world_size)
    if meeting is None:
        return None
    from .monitor import ensure_monitor

    ensure_monitor(meeting)
    seq = next_seq(_group_identity(meeting, store))
    stack = user_frames(limit=6)
    crumb = TRAIL.enter(f"sync_point {tag!r}")
    TRAIL.syncing += 1
    try:
        record = {
            "tag": tag,
            "stack": stack,
            "pid": os.getpid(),
            "host": meeting.host,
            "time": time.time(),
            "payload": payload,
        }
        meeting.put(meeting.key("sp", seq, meeting.rank), record)
        seen = {
            "op": f"sync_point {tag!r}",
            "stack": stack,
            "since": record["time"],
            "active": True,
        }
        meeting.put(meeting.key("seen", meeting.rank), seen)
        suspects = _Suspects()
        arrivals = _wait_for_all(meeting, seq, limit, suspects)
        differs = _differences(arrivals, compare) if arrivals is not None else []
        if arrivals is not None and not differs:
            return {rank: arrivals[rank].get("payload") for rank in arrivals}
        _fail(meeting, seq, tag, limit, differs, suspects.confirmed)
        return None  # unreachable: _fail raises
    finally:
        TRAIL.syncing -= 1
        TRAIL.leave(crumb)


def _wait_for_all(
    meeting: Meeting, seq: int, limit: float, suspects: _Suspects
) -> dict[int, Any] | None:
    """All arrival records for ``seq``, or None when waiting is hopeless or timed out."""
    keys = [meeting.key("sp", seq, r) for r in range(meeting.world_size)]
    desync_key = meeting.key("desync")
    start = time.monotonic()
    deadline = start + limit
    pause = 0.0005
    next_health = start + 0.25
    while True:
        if meeting.has(keys):
            return {r: meeting.read(keys[r]) for r in range(meeting.world_size)}
        now = time.monotonic()
        if now >= deadline:
            return None
        if now >= next_health:
            next_health = now + 0.25
            if meeting.has([desync_key]):
                return None
            missing = [r for r in range(meeting.world_size) if not meeting.has([keys[r]])]
            if any(_liveness.is_gone(meeting, r) or suspects.blocked(meeting, r) for r in missing):
                return None
        time.sleep(pause)
        pause = min(pause * 2, 0.02)


DEADLOCK_AFTER = 2.0  # seconds of heartbeats showing the same collective before calling it
DEADLOCK_BEATS = 3


class _Suspects:
    """Ranks whose heartbeats keep showing them inside the same world-wide collective.

    Such a collective cannot finish while this rank waits in a sync point, so it
    is a dead lock - but only once fresh heartbeats (not a stale record) have
    shown the same call for a couple of seconds.
    """

    def __init__(self) -> None:
        self._seen: dict[int, tuple[object, float, set[float]]] = {}
        self.confirmed: list[int] = []

    def blocked(self, meeting: Meeting, rank: int) -> bool:
        beat = meeting.read(meeting.key("hb", rank)) or {}
        op_seq = beat.get("op_seq")
        if not beat.get("collective") or op_seq is None:
            self._seen.pop(rank, None)
            return False
        first = self._seen.get(rank)
        if first is None or first[0] != op_seq:
            self._seen[rank] = (op_seq, time.monotonic(), {float(beat.get("time", 0))})
            return False
        first[2].add(float(beat.get("time", 0)))
        if len(first[2]) >= DEADLOCK_BEATS and time.monotonic() - first[1] >= DEADLOCK_AFTER:
            self.confirmed.append(rank)
            return True
        return False


def _differences(arrivals: dict[int, Any], compare: Compare | None) -> list[str]:
    tags: dict[str, list[int]] = {}
    for rank, record in sorted(arrivals.items()):
        tags.setdefault(record["tag"], []).append(rank)
    if len(tags) > 1:
        return [
            "ranks are at different sync points: "
            + "; ".join(f"ranks {ranks} at {tag!r}" for tag, ranks in tags.items())
        ]
    if compare is not None:
        return compare({rank: record.get("payload") for rank, record in arrivals.items()})
    return []


def _fail(
    meeting: Meeting, seq: int, tag: str, limit: float, differs: list[str], blocked: list[int]
) -> None:
    ranks: dict[int, dict[str, Any]] = {}
    missing: list[int] = []
    for rank in range(meeting.world_size):
        info = _liveness.describe(meeting, rank)
        arrival = meeting.read(meeting.key("sp", seq, rank))
        if arrival is not None:
            info["arrived"] = arrival
        else:
            missing.append(rank)
        info["self"] = rank == meeting.rank
        ranks[rank] = info
    if missing:
        gone = [r for r in missing if ranks[r].get("exit") or ranks[r].get("state") == "gone"]
        if gone:
            why = f"rank(s) {gone} exited"
        elif blocked:
            why = (
                f"rank(s) {blocked} wait in a collective that cannot complete while rank "
                f"{meeting.rank} waits here: a dead lock"
            )
        else:
            why = f"not all ranks arrived within {limit:g} s"
        differs = [
            *differs,
            f"rank(s) {missing} never reached sync point #{seq} {tag!r} ({why})",
        ]
        other = meeting.read(meeting.key("desync"))
        if other and other.get("from") != meeting.rank:
            differs.append(f"rank {other.get('from')} already reported: {other.get('headline')}")
    headline = (
        f"ranks are out of step at sync point #{seq} {tag!r} "
        f"(world size {meeting.world_size}, timeout {limit:g} s)"
    )
    report = build_report(headline=headline, ranks=ranks, differs=differs)
    from .monitor import announce_desync

    announce_desync(meeting, headline, report)
    raise DesyncError(report, ranks)
