"""The meeting place: the process group's key-value store, used without ever blocking on it.

A collective blocks until every rank joins; a store ``get`` or ``wait`` blocks
until the key exists. Only ``set`` and ``check`` return at once, so everything
here polls with ``check`` and reads a key only once it is known to exist.
torch 2.1 has no ``Store.check`` in Python; there a ``wait`` with a 1 ms
timeout stands in for it (a missing key costs a few milliseconds).
"""

from __future__ import annotations

import json
import os
import socket
from datetime import timedelta
from typing import Any

PREFIX = "compatshim/dist/"
DEFAULT_TIMEOUT = 300.0
TIMEOUT_ENV = "COMPATSHIM_DESYNC_TIMEOUT"
_PROBE = timedelta(milliseconds=1)


def resolve_timeout(timeout: float | None) -> float:
    """The argument, else ``COMPATSHIM_DESYNC_TIMEOUT`` (seconds), else 5 minutes."""
    if timeout is None:
        raw = os.environ.get(TIMEOUT_ENV, "").strip()
        if not raw:
            return DEFAULT_TIMEOUT
        try:
            timeout = float(raw)
        except ValueError:
            raise ValueError(f"{TIMEOUT_ENV}={raw!r} is not a number of seconds") from None
    if not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    return float(timeout)


class Meeting:
    """A store plus this process's rank and the world size, with JSON helpers."""

    def __init__(self, store: Any, rank: int, world_size: int) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside a world of size {world_size}")
        self.store = store
        self.rank = rank
        self.world_size = world_size
        self.host = socket.gethostname()
        self._check = getattr(store, "check", None)

    def key(self, *parts: object) -> str:
        return PREFIX + "/".join(str(p) for p in parts)

    def put(self, key: str, value: Any) -> None:
        self.store.set(key, json.dumps(value, default=str))

    def has(self, keys: list[str]) -> bool:
        """Whether every key exists, without blocking."""
        if self._check is not None:
            return bool(self._check(keys))
        try:
            self.store.wait(keys, _PROBE)
        except RuntimeError as exc:  # torch 2.1: "Socket Timeout" means "not there yet"
            if "timeout" not in str(exc).lower():
                raise
            return False
        return True

    def read(self, key: str) -> Any:
        """The decoded value of ``key``, or None when it does not exist (never blocks)."""
        if not self.has([key]):
            return None
        raw = self.store.get(key)
        return json.loads(raw.decode() if isinstance(raw, (bytes, bytearray)) else raw)

    def read_ranks(self, *parts: object) -> dict[int, Any]:
        """``key(*parts, rank)`` for every rank that has written it."""
        found: dict[int, Any] = {}
        for rank in range(self.world_size):
            value = self.read(self.key(*parts, rank))
            if value is not None:
                found[rank] = value
        return found


def default_meeting(
    store: Any = None, rank: int | None = None, world_size: int | None = None
) -> Meeting | None:
    """The meeting for the given store, else the default process group's; None in a 1-rank run.

    Raises when the environment says the run is distributed but no process group
    exists yet, because silently skipping the check there would hide the bug.
    """
    if store is not None:
        if rank is None or world_size is None:
            raise ValueError("pass rank= and world_size= together with store=")
        return Meeting(store, rank, world_size)
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        env_world = os.environ.get("WORLD_SIZE", "1")
        if env_world.isdigit() and int(env_world) > 1:
            raise RuntimeError(
                f"compatshim.dist: WORLD_SIZE={env_world} but no default process group is "
                "initialized; call torch.distributed.init_process_group() first (or pass "
                "store=, rank=, world_size=)"
            )
        return None
    world = dist.get_world_size() if world_size is None else world_size
    if world <= 1:
        return None
    from torch.distributed.distributed_c10d import _get_default_store

    return Meeting(_get_default_store(), dist.get_rank() if rank is None else rank, world)
