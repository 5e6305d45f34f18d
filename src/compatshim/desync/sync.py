"""``sync_point``: ranks meet in the key-value store, where a wait can time out.

Each rank writes an arrival record (tag, call site, short stack, pid) under a
per-group sequence number, then polls with ``check`` until every rank's record
for the same number is there. Arrivals with different tags, a rank whose
process exited or vanished, or the timeout turn into one :class:`DesyncError`
report built from what every rank left in the store. Once every record of a
number is in, each rank deletes its own records of the earlier numbers (no rank
reads them any more), so the store holds a few records per rank however many
sync points a run passes.
"""

from __future__ import annotations

import os
import time
from numbers import Integral, Real
from typing import Any, Callable, NoReturn

from .._settings import desync_timeout
from .._text import short
from .._warn import warn as warn_at_caller
from . import _liveness
from ._counters import next_seq, settle
from ._desync_notice import announce, notice_out
from ._liveness import RankState
from ._records import Arrival, DesyncNotice, ExitRecord, Heartbeat, Keys, Seen
from ._sites import user_frames
from ._store import Meeting, default_meeting
from ._trail import TRAIL
from .desync_report import DesyncError, build_report, rank_list, titled
from .monitor import ensure_monitor

Compare = Callable[[dict[int, Any]], list[str]]

HEALTH_EVERY = 0.25  # seconds between checks for an exited, blocked or reporting rank
DEADLOCK_AFTER = 2.0  # seconds of heartbeats showing the same collective before calling it
DEADLOCK_BEATS = 3


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
    given. In a 1-rank run it returns at once; with no process group at all it
    returns too (a script run without a launcher), after one warning per process
    that says how to make ranks meet, and raises when ``WORLD_SIZE`` says the run
    is distributed.
    """
    meet(tag, timeout, store=store, rank=rank, world_size=world_size, caller="sync_point")


def meet(
    tag: str,
    timeout: float | None = None,
    *,
    payload: Any = None,
    compare: Compare | None = None,
    store: Any = None,
    rank: int | None = None,
    world_size: int | None = None,
    caller: str = "",
) -> dict[int, Any] | None:
    """``sync_point`` with an optional payload compared across ranks; returns payloads by rank.

    ``caller``: the public function that asked, warned about when there is no process group
    (a framework's own sync points, which run only once a group exists, pass none)."""
    if not isinstance(tag, str) or not tag:
        raise TypeError(f"sync point tag must be a non-empty string, got {short(tag)}")
    check_arguments(timeout, store, rank, world_size)
    limit = desync_timeout(timeout)
    meeting = default_meeting(store, rank, world_size)
    if meeting is None:
        if caller and store is None:
            _warn_if_alone(caller)
        return None
    ensure_monitor(meeting)
    identity = _group_identity(meeting, store)
    seq = next_seq(identity)
    stack = user_frames(limit=6)
    op = f"sync_point {tag!r}"
    crumb = TRAIL.enter(op)
    TRAIL.syncing += 1
    try:
        now = time.time()
        arrival = Arrival(
            tag=tag,
            stack=stack,
            pid=os.getpid(),
            host=meeting.host,
            time=now,
            payload=payload,
            world_size=meeting.world_size,
        )
        suspects = _Suspects()
        try:
            meeting.put(Keys.arrival(seq, meeting.rank), arrival)
            meeting.put(Keys.seen(meeting.rank), Seen(op=op, stack=stack, since=now, active=True))
            arrivals = _wait_for_all(meeting, seq, limit, suspects)
        except RuntimeError as exc:  # torch's store errors (DistNetworkError, ...) are these
            _store_lost(meeting, seq, tag, exc)
        differs = _differences(arrivals, compare) if arrivals is not None else []
        if arrivals is not None and not differs:
            done = settle(identity, seq)
            if done:
                meeting.drop([Keys.arrival(n, meeting.rank) for n in done])
            return {rank: arrivals[rank].payload for rank in arrivals}
        _fail(meeting, seq, tag, limit, differs, suspects)
    finally:
        TRAIL.syncing -= 1
        TRAIL.leave(crumb)


def check_arguments(timeout: Any, store: Any, rank: Any, world_size: Any) -> None:
    """TypeError naming the argument, before anything waits on it (the values are checked
    where they are used: a positive timeout, a rank inside the world)."""
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, Real)):
        raise TypeError(f"timeout: expected seconds (a number) or None, got {short(timeout)}")
    for name, value in (("rank", rank), ("world_size", world_size)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, Integral)):
            raise TypeError(f"{name}: expected an int or None, got {short(value)}")
    missing = [m for m in _STORE_METHODS if not callable(getattr(store, m, None))]
    if store is not None and missing:
        raise TypeError(
            f"store: expected a torch.distributed.Store (with {', '.join(_STORE_METHODS)}), "
            f"got {short(store)} without {', '.join(missing)}"
        )


_STORE_METHODS = ("set", "get", "add", "wait")
_warned_alone: set[str] = set()


def _warn_if_alone(caller: str) -> None:
    """Once per process and function: no process group exists, so this process meets no one.

    A 1-rank group is a deliberate single-process run and says nothing; no group at all is
    either a script run without a launcher (supported: it goes on alone) or a call placed
    before ``init_process_group`` (a bug that would hide every desync): say which to do.
    """
    import torch.distributed as dist

    if caller in _warned_alone or (dist.is_available() and dist.is_initialized()):
        return
    _warned_alone.add(caller)
    warn_at_caller(
        f"compatshim.dist.{caller}: no default process group is initialized, so this process "
        "runs alone and meets no other rank (it returns at once); for ranks to meet, call "
        "torch.distributed.init_process_group() on every rank first, or pass store=, rank=, "
        "world_size=",
        RuntimeWarning,
    )


def _wait_for_all(
    meeting: Meeting, seq: int, limit: float, suspects: _Suspects
) -> dict[int, Arrival] | None:
    """All arrival records for ``seq``, or None when waiting is hopeless or timed out."""
    keys = [Keys.arrival(seq, r) for r in range(meeting.world_size)]
    start = time.monotonic()
    deadline = start + limit
    pause = 0.0005
    next_health = start + HEALTH_EVERY
    while True:
        if meeting.has(keys):  # every record is there: read each (a missing one hid a desync)
            return {r: meeting.get(keys[r], Arrival) for r in range(meeting.world_size)}
        now = time.monotonic()
        if now >= deadline:
            return None
        if now >= next_health:
            next_health = now + HEALTH_EVERY
            if notice_out(meeting):
                suspects.noticed = True
                return None
            missing = [r for r in range(meeting.world_size) if not meeting.has([keys[r]])]
            for r in missing:
                if (record := _liveness.gone_record(meeting, r)) is not None:
                    suspects.gone[r] = record
            if suspects.gone or any(suspects.blocked(meeting, r) for r in missing):
                return None
        time.sleep(pause)
        pause = min(pause * 2, 0.02)


class _Suspects:
    """What the wait learned about the missing ranks: those it saw end (and why), and those
    whose heartbeats keep showing them inside the same world-wide collective.

    Such a collective cannot finish while this rank waits in a sync point, so it
    is a dead lock - but only once fresh heartbeats (not a stale record) have
    shown the same call for a couple of seconds.
    """

    def __init__(self) -> None:
        self._seen: dict[int, tuple[int, float, set[float]]] = {}
        self.confirmed: list[int] = []
        self.gone: dict[int, ExitRecord] = {}  # ranks the wait saw end, and why
        self.noticed = False  # the wait ended on another rank's report, not on the timeout

    def blocked(self, meeting: Meeting, rank: int) -> bool:
        beat = meeting.read(Keys.heartbeat(rank), Heartbeat)
        if beat is None or not beat.collective or beat.op_seq is None:
            self._seen.pop(rank, None)
            return False
        first = self._seen.get(rank)
        if first is None or first[0] != beat.op_seq:
            self._seen[rank] = (beat.op_seq, time.monotonic(), {beat.time})
            return False
        first[2].add(beat.time)
        if len(first[2]) >= DEADLOCK_BEATS and time.monotonic() - first[1] >= DEADLOCK_AFTER:
            self.confirmed.append(rank)
            return True
        return False


def _split(arrivals: dict[int, Arrival], field: str, head: str, verb: str) -> list[str]:
    """The line naming which ranks hold which ``field`` of their arrival, when they do not
    all hold one (None: an older writer, not counted)."""
    groups: dict[Any, list[int]] = {}
    for rank, arrival in sorted(arrivals.items()):
        value = getattr(arrival, field)
        if value is not None:
            groups.setdefault(value, []).append(rank)
    if len(groups) > 1:
        return [
            head
            + "; ".join(
                f"ranks {rank_list(ranks)} {verb} {value!r}" for value, ranks in groups.items()
            )
        ]
    return []


def _disagreements(arrivals: dict[int, Arrival]) -> list[str]:
    """Which ranks wait for which world size (with ``store=``, a rank told a smaller world
    would otherwise pass without the others), and which are at which sync point."""
    return _split(arrivals, "world_size", "ranks disagree on the world size: ", "say") + _split(
        arrivals, "tag", "ranks are at different sync points: ", "at"
    )


def _differences(arrivals: dict[int, Arrival], compare: Compare | None) -> list[str]:
    tags = _disagreements(arrivals)
    if tags:
        return tags
    if compare is not None:
        return compare({rank: arrival.payload for rank, arrival in arrivals.items()})
    return []


def _store_lost(meeting: Meeting, seq: int, tag: str, exc: RuntimeError) -> NoReturn:
    """The store stopped answering while this rank waited: its host has most likely ended."""
    raise DesyncError(
        titled(
            f"rank {meeting.rank} lost the process group's store while waiting at sync point "
            f"#{seq} {tag!r} (world size {meeting.world_size}): {type(exc).__name__}: {exc}. "
            "The process that hosts the store (rank 0, or the launcher's agent under "
            "torchrun) has most likely ended: its own error or exit comes first in the logs."
        )
    ) from exc


def _gone_words(gone: list[int], ranks: dict[int, RankState]) -> str:
    """``rank(s) [1] exited`` / ``... left the process group`` (it destroyed its group)."""
    left = [r for r in gone if (record := ranks[r].exit) is not None and record.left]
    exited = [r for r in gone if r not in left]
    words = []
    if exited:
        words.append(f"rank(s) {rank_list(exited)} exited")
    if left:
        words.append(f"rank(s) {rank_list(left)} left the process group")
    return " and ".join(words)


def _fail(
    meeting: Meeting,
    seq: int,
    tag: str,
    limit: float,
    differs: list[str],
    suspects: _Suspects,
) -> NoReturn:
    ranks = _liveness.describe_all(meeting)
    blocked = suspects.confirmed
    for rank, record in suspects.gone.items():  # what the wait saw stands if a re-read misses it
        if rank in ranks and ranks[rank].exit is None:
            ranks[rank].exit, ranks[rank].state = record, "gone"
    missing: list[int] = []
    for rank, info in ranks.items():
        info.arrived = meeting.read(Keys.arrival(seq, rank), Arrival)
        if info.arrived is None:
            missing.append(rank)
    if missing and not differs:  # those that did arrive may disagree too: name them
        arrived = {rank: info.arrived for rank, info in ranks.items() if info.arrived is not None}
        differs = _disagreements(arrived)
    if missing:
        gone = [r for r in missing if ranks[r].exit is not None or ranks[r].state == "gone"]
        if gone:
            why = _gone_words(gone, ranks)
        elif blocked:
            why = (
                f"rank(s) {rank_list(blocked)} wait in a collective that cannot complete while "
                f"rank {meeting.rank} waits here: a dead lock"
            )
        elif suspects.noticed:  # it waited less than the timeout: say why it stopped
            why = "this rank stopped waiting when another rank reported the ranks out of step"
        else:
            why = f"not all ranks arrived within {limit:g} s"
        differs = [
            *differs,
            f"rank(s) {rank_list(missing)} never reached sync point #{seq} {tag!r} ({why})",
        ]
        other = meeting.read(Keys.desync(), DesyncNotice)
        if other is not None and other.reporter != meeting.rank:
            differs.append(f"rank {other.reporter} already reported: {other.headline}")
    headline = (
        f"ranks are out of step at sync point #{seq} {tag!r} "
        f"(world size {meeting.world_size}, timeout {limit:g} s)"
    )
    report = build_report(headline=headline, ranks=ranks, differs=differs)
    announce(meeting, headline, report)
    raise DesyncError(report, ranks)
