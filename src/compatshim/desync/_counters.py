"""Sync-point numbering: one counter per process group (or explicit store), the same on every rank.

The counter keeps a reference to its group so a new group that reuses an old
id starts again from 1; ``forget_groups`` drops those references at exit so
torch tears its groups down in its own order.
"""

from __future__ import annotations

import threading

_counters: dict[int, tuple[object, int]] = {}
_lock = threading.Lock()


def next_seq(identity: object) -> int:
    """The next sync-point number for the group (or store) ``identity``."""
    with _lock:
        owner, count = _counters.get(id(identity), (None, 0))
        if owner is not identity:
            count = 0
        count += 1
        _counters[id(identity)] = (identity, count)
        return count


def forget_groups() -> None:
    with _lock:
        _counters.clear()
