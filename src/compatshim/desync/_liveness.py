"""Is a rank still there? Exit records, heartbeats and, on the same host, the process itself.

A rank's monitor writes a heartbeat (time, pid, host) every half second and an
exit record at interpreter exit; Lightning's launcher process also records the
exit code of each child it started. A process killed outright leaves no exit
record, so on the same host (and PID namespace: ``_store.HOST``) its pid is
checked directly.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Literal

from ._records import Arrival, ExitRecord, Heartbeat, Keys, Seen
from ._store import HOST, Meeting

SILENT_AFTER = 5.0  # seconds without heartbeat before a rank counts as silent

State = Literal["alive", "gone", "silent"]


@dataclass
class RankState:
    """Everything known of one rank when a report is written."""

    state: State = "alive"
    seen: Seen | None = None  # its latest breadcrumb
    exit: ExitRecord | None = None
    heartbeat_age: float | None = None
    silent_for: float | None = None
    arrived: Arrival | None = None  # its record at the sync point being reported
    is_self: bool = False


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie has exited; only its parent has not collected it yet
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return True


def _local_pid_gone(beat: Heartbeat | None) -> bool:
    """The heartbeat names a process on this host and PID namespace (not this one) that no
    longer runs."""
    if beat is None or beat.host != HOST or not beat.pid or beat.pid == os.getpid():
        return False
    return not pid_alive(int(beat.pid))


def is_gone(meeting: Meeting, rank: int) -> bool:
    """True when ``rank`` has certainly ended (exit record, or its local pid is dead)."""
    return gone_record(meeting, rank) is not None


def gone_record(meeting: Meeting, rank: int) -> ExitRecord | None:
    """Why ``rank`` has certainly ended (its exit record, or its local pid is dead), or None.

    Kept by whoever saw it: a later read of the same keys can miss where the store has no
    ``check`` (torch 2.1's 1 ms probe, on a busy machine), and the report would lose why."""
    exited = meeting.read(Keys.exit(rank), ExitRecord)
    if exited is not None:
        return exited
    beat = meeting.read(Keys.heartbeat(rank), Heartbeat)
    return _killed(beat) if beat is not None and _local_pid_gone(beat) else None


def _killed(beat: Heartbeat) -> ExitRecord:
    return ExitRecord(how=f"process {beat.pid} is gone (killed or crashed; it left no exit record)")


def describe(meeting: Meeting, rank: int) -> RankState:
    """Everything the store says about ``rank``: last breadcrumb, exit, heartbeat age."""
    info = RankState(seen=meeting.read(Keys.seen(rank), Seen), is_self=rank == meeting.rank)
    exited = meeting.read(Keys.exit(rank), ExitRecord)
    beat = meeting.read(Keys.heartbeat(rank), Heartbeat)
    if exited is not None:
        info.exit, info.state = exited, "gone"
    elif beat is not None:
        info.heartbeat_age = age = time.time() - beat.time
        if _local_pid_gone(beat):
            info.state, info.exit = "gone", _killed(beat)
        elif age > SILENT_AFTER and rank != meeting.rank:
            info.state, info.silent_for = "silent", age
    return info


def describe_all(meeting: Meeting) -> dict[int, RankState]:
    """:func:`describe` for every rank; a rank the store cannot answer for gets an empty state."""
    ranks: dict[int, RankState] = {}
    for rank in range(meeting.world_size):
        try:
            ranks[rank] = describe(meeting, rank)
        except Exception:
            ranks[rank] = RankState(is_self=rank == meeting.rank)
    return ranks
