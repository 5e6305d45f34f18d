"""Sync-point numbering: one counter per process group (or explicit store), the same on every rank.

The counter keeps a reference to its group so a new group that reuses an old
id starts again from 1; ``forget_groups`` drops those references at exit so
torch tears its groups down in its own order. It also remembers which of this
rank's arrival records are still in the store (see :func:`settle`).
"""

from __future__ import annotations

import threading

# id(group) -> (group, last number, numbers whose arrival record this rank has not deleted)
_counters: dict[int, tuple[object, int, list[int]]] = {}
_lock = threading.Lock()


def next_seq(identity: object) -> int:
    """The next sync-point number for the group (or store) ``identity``."""
    with _lock:
        owner, count, kept = _counters.get(id(identity), (None, 0, []))
        if owner is not identity:
            count, kept = 0, []
        count += 1
        kept.append(count)
        _counters[id(identity)] = (identity, count, kept)
        return count


def settle(identity: object, seq: int) -> list[int]:
    """Every rank has arrived at sync point ``seq``: the earlier numbers whose arrival record
    this rank may now delete (no rank reads them any more), forgotten here.

    A rank writes its arrival at ``seq`` only after it has left sync point ``seq - 1``
    (report included), so once all of ``seq``'s arrivals are in, nobody reads an earlier
    one; ``seq``'s own stay for the ranks still waiting there (one may lag behind).
    """
    with _lock:
        owner, count, kept = _counters.get(id(identity), (None, 0, []))
        if owner is not identity:
            return []
        done = [n for n in kept if n < seq]
        _counters[id(identity)] = (identity, count, [n for n in kept if n >= seq])
        return done


def forget_groups() -> None:
    with _lock:
        _counters.clear()
