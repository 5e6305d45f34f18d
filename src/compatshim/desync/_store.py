"""The meeting place: the process group's key-value store, never blocked on without a bound.

A collective blocks until every rank joins; a store ``get`` or ``wait`` blocks
until the key exists. Only ``set`` and ``check`` return at once, so everything
here polls with ``check`` and reads a key only once it is known to exist; the
one blocking call, :meth:`Meeting.wait`, has a timeout (a rank leaving).
torch 2.1 has no ``Store.check`` in Python; there a ``wait`` with a 1 ms
timeout stands in for it (a missing key costs a few milliseconds).
A record nobody reads any more is deleted (``delete_key``, on every torch store
since 2.1); a store whose ``delete_key`` fails (a ``Store`` subclass without it)
keeps it, and is not asked again.
A store can outlive its process group: torchrun's agent store serves every
``init_process_group`` of a worker, so after ``destroy_process_group()`` and a new
``init_process_group()`` the records of the group before are still there (an exit
record saying the rank left, arrivals under the numbers the new group counts again
from 1). A meeting of the N-th default group this process meets in therefore keeps
its records under their own prefix (:func:`_generation_of`), the same on every rank
that met in the same groups.
Keys and record shapes: :mod:`._records`.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
import weakref
from datetime import timedelta
from typing import Any, TypeVar

from ._records import PREFIX, Record

_PROBE = timedelta(milliseconds=1)
R = TypeVar("R", bound=Record)
_cannot_delete: weakref.WeakSet[Any] = weakref.WeakSet()  # stores whose delete_key failed


class Meeting:
    """A store plus this process's rank and the world size, reading and writing typed records."""

    def __init__(
        self, store: Any, rank: int, world_size: int, group: object = None, generation: int = 0
    ) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside a world of size {world_size}")
        self.store = store
        self.generation = generation  # records under their own prefix past the first group
        self._space = f"{PREFIX}{generation}/" if generation else PREFIX
        self.rank = rank
        self.world_size = world_size
        self.group = group  # the default process group whose store this is (None: a given store)
        self.host = HOST
        self._check = getattr(store, "check", None)

    def group_alive(self) -> bool:
        """False once the default process group behind this meeting has been destroyed."""
        if self.group is None:
            return True
        c10d = sys.modules.get("torch.distributed.distributed_c10d")
        return c10d is not None and c10d.GroupMember.WORLD is self.group

    def others(self) -> list[int]:
        return [rank for rank in range(self.world_size) if rank != self.rank]

    def _key(self, key: str) -> str:
        """``key`` (from :class:`~._records.Keys`) under this meeting's generation."""
        return self._space + key[len(PREFIX) :] if self.generation else key

    def put(self, key: str, record: Record) -> None:
        self.store.set(self._key(key), record.to_json())

    def drop(self, keys: list[str]) -> None:
        """Delete ``keys``, which no rank reads any more; a store that cannot keeps them."""
        if _known(self.store, _cannot_delete):
            return
        try:
            for key in keys:
                self.store.delete_key(self._key(key))
        except Exception:  # no delete_key, or "pure virtual function" (a Store subclass)
            _remember(self.store, _cannot_delete)

    def has(self, keys: list[str]) -> bool:
        """Whether every key exists, without blocking."""
        if self._check is not None:
            return bool(self._check([self._key(key) for key in keys]))
        return self.wait(keys, _PROBE.total_seconds())

    def wait(self, keys: list[str], seconds: float) -> bool:
        """Whether every key exists within ``seconds``; the one bounded blocking call here
        (a rank leaving waits so, to wake with the others when the last key lands)."""
        try:
            self.store.wait([self._key(key) for key in keys], timedelta(seconds=seconds))
        except RuntimeError as exc:  # "Socket Timeout" (2.1), "wait timeout" (DistStoreError)
            if "timeout" not in str(exc).lower():
                raise
            return False
        return True

    def read(self, key: str, kind: type[R]) -> R | None:
        """The record under ``key``, or None when it does not exist (never blocks)."""
        if not self.has([key]):
            return None
        return self.get(key, kind)

    def get(self, key: str, kind: type[R]) -> R:
        """The record under ``key``, which ``has`` already found: no second probe (on a
        store without ``check``, a probe is a 1 ms wait that a busy machine can miss)."""
        return kind.from_json(self.store.get(self._key(key)))

    def count(self, key: str, add: int = 0) -> int:
        """Add ``add`` to the counter ``key`` and return its new value (0 to read it)."""
        return int(self.store.add(self._key(key), add))


def _pid_host() -> str:
    """This host as far as pids go: its name, and its PID namespace where it has one.

    Containers that share a hostname (``docker --network=host``, Kubernetes ``hostNetwork``
    pods: one per GPU is common) each number their processes apart; a pid from another
    cannot be looked up here, and a rank merely late there would be taken for dead.
    """
    name = socket.gethostname()
    try:
        return f"{name} (pid namespace {os.stat('/proc/self/ns/pid').st_ino})"
    except OSError:  # no /proc (macOS): the hostname alone
        return name


HOST = _pid_host()


def _known(store: Any, stores: weakref.WeakSet[Any]) -> bool:
    """Whether ``store`` is in ``stores`` (one that cannot be weakly referenced never is)."""
    try:
        return store in stores
    except TypeError:
        return False


def _remember(store: Any, stores: weakref.WeakSet[Any]) -> None:
    with contextlib.suppress(TypeError):  # not weakly referable: it is asked every time
        stores.add(store)


_last_group: weakref.ref[Any] | None = None  # the default group the last meeting was for
_generation = 0
_generation_lock = threading.Lock()


def _generation_of(group: object) -> int:
    """How many default process groups this process has met in before ``group`` (0, 1, ...).

    Every rank re-initialises together, so a rank that met in the same groups counts the
    same; the records of a group destroyed before stay where they were, unread.
    torch's ``threaded`` test backend gives each thread (rank) a group of its own at once:
    those are one world, not one after another, and always count 0.
    """
    global _last_group, _generation
    import torch.distributed as dist

    with _generation_lock:
        if _last_group is not None and _last_group() is group:
            return _generation
        with contextlib.suppress(Exception):  # a backend name is only a hint here
            if str(dist.get_backend()) == "threaded":
                return 0
        if _last_group is not None:
            _generation += 1
        _last_group = weakref.ref(group)
        return _generation


def _is_fake_world() -> bool:
    """torch's ``fake`` backend: one process plays one rank of a world with no peers.

    Its collectives return at once without communicating, and its ``FakeStore``
    cannot hold a record (``set`` is not implemented), so there is no one to
    meet: a sync point returns at once there, as the collectives do.
    """
    import torch.distributed as dist

    try:
        return str(dist.get_backend()) == "fake"
    except Exception:  # a backend name is only a hint here
        return False


def default_meeting(
    store: Any = None, rank: int | None = None, world_size: int | None = None
) -> Meeting | None:
    """The meeting for the given store, else the default process group's; None in a 1-rank run
    (and under torch's ``fake`` backend, whose ranks have no peers to meet).

    Raises when the environment says the run is distributed but no process group
    exists yet, because silently skipping the check there would hide the bug, and
    when ``rank`` or ``world_size`` (without ``store``) disagrees with the group's.
    """
    if store is not None:
        if rank is None or world_size is None:
            raise ValueError("pass rank= and world_size= together with store=")
        return Meeting(store, rank, world_size)
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        env_world = os.environ.get("WORLD_SIZE", "1")
        said = f"world_size={world_size}" if (world_size or 0) > 1 else f"WORLD_SIZE={env_world}"
        if (world_size or 0) > 1 or (env_world.isdigit() and int(env_world) > 1):
            raise RuntimeError(
                f"compatshim.dist: {said} but no default process group is "
                "initialized; call torch.distributed.init_process_group() first (or pass "
                "store=, rank=, world_size=)"
            )
        return None
    world, own_rank = dist.get_world_size(), dist.get_rank()
    for name, given, actual in (("world_size", world_size, world), ("rank", rank, own_rank)):
        if given is not None and given != actual:  # it would wait for ranks that never come
            raise ValueError(
                f"compatshim.dist: {name}={given} but the default process group has "
                f"{name}={actual}; pass rank= and world_size= only together with store=, "
                "or leave them out"
            )
    if world <= 1 or _is_fake_world():
        return None
    from torch.distributed.distributed_c10d import GroupMember, _get_default_store

    group = GroupMember.WORLD
    return Meeting(
        _get_default_store(), own_rank, world, group=group, generation=_generation_of(group)
    )
