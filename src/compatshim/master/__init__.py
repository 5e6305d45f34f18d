"""One master-parameter API over every ColossalAI release (and plain torch optimizers).

``working_to_master(optimizer)`` maps each working parameter (or its ``id()``)
to its fp32 master; ``master_param(optimizer, param)`` returns one master;
``master_shard_position`` says which slice of the flattened, padded parameter a
ZeRO master shard is; ``gather_master_param`` reassembles the full fp32 tensor.
A plain torch optimizer maps every parameter to itself, so the same EMA code
runs with and without ZeRO. Unknown layouts raise ``UnknownLayoutError``.

Where things are: ``layouts/`` holds one module per way a release stores the
map (a new release with a new layout is one new module there); ``resolve``
finds the layout behind what the user holds; ``shards`` knows shard
arithmetic and gathering; ``doctor`` reports the installed layout.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, Callable

from .doctor import doctor_rows
from .errors import UnknownLayoutError
from .resolve import layout_name, resolve
from .shards import ShardPosition, gather_full, whole_param_position

if TYPE_CHECKING:
    from torch import Tensor

__all__ = [
    "MasterMap",
    "ShardPosition",
    "UnknownLayoutError",
    "doctor_rows",
    "gather_master_param",
    "layout_name",
    "master_param",
    "master_shard_position",
    "working_to_master",
]


class MasterMap(Mapping[Any, "Tensor"]):
    """Read-only view: working param (object or ``id()``) -> master tensor.

    Iterates over the working parameters. Reads through to the optimizer's own
    dict, so it stays valid for the optimizer's lifetime; where the layout has no
    dict to read through (a plain optimizer, HybridParallel stage 0), it reads
    the optimizer again on a miss, a ``len()`` or an iteration, so a param group
    added after the map was taken is in it.
    """

    def __init__(
        self,
        by_id: Mapping[int, Tensor],
        working: Mapping[int, Tensor],
        reread: Callable[[], tuple[Mapping[int, Tensor], Mapping[int, Tensor]]] | None = None,
    ) -> None:
        self._by_id = by_id
        self._working = working
        self._reread = reread

    def _read_again(self) -> bool:
        if self._reread is None:
            return False
        self._by_id, self._working = self._reread()
        return True

    def __getitem__(self, key: Any) -> Tensor:
        pid = key if isinstance(key, int) else id(key)
        if pid not in self._by_id:
            self._read_again()
        try:
            return self._by_id[pid]
        except KeyError:
            raise KeyError(
                "compatshim.master: this parameter has no master in the optimizer "
                "(frozen, or not passed to it)"
            ) from None

    def __contains__(self, key: object) -> bool:
        pid = key if isinstance(key, int) else id(key)
        return pid in self._by_id or (self._read_again() and pid in self._by_id)

    def __iter__(self) -> Iterator[Any]:
        self._read_again()
        for pid, master in self._by_id.items():
            yield self._working.get(id(master), pid)

    def __len__(self) -> int:
        self._read_again()
        return len(self._by_id)


def _plain_map(optimizer: Any) -> MasterMap:
    def read() -> tuple[dict[int, Tensor], dict[int, Tensor]]:
        params = [p for group in optimizer.param_groups for p in group["params"]]
        by_id = {id(p): p for p in params}
        return by_id, by_id

    return MasterMap(*read(), reread=read)


def working_to_master(optimizer: Any) -> MasterMap:
    """The working -> fp32 master map of ``optimizer``, whatever release built it."""
    resolved = resolve(optimizer)
    layout = resolved.layout
    if layout is None:
        return _plain_map(resolved.holder)
    master_by_id, working_by_master_id = layout.master_by_id, layout.working_by_master_id
    assert master_by_id is not None  # resolve() returns supported layouts only
    holder = resolved.holder

    def read() -> tuple[Mapping[int, Tensor], Mapping[int, Tensor]]:
        working = working_by_master_id(holder) if working_by_master_id else None
        return master_by_id(holder), working or {}

    return MasterMap(*read(), reread=read)


def master_param(optimizer: Any, param: Tensor) -> Tensor:
    """The master of ``param``: this rank's fp32 shard under ZeRO, ``param`` itself without."""
    return working_to_master(optimizer)[param]


def master_shard_position(optimizer: Any, param: Tensor) -> ShardPosition:
    """Offset, length and padding of ``param``'s master inside the flattened, padded param."""
    resolved = resolve(optimizer)
    master = working_to_master(optimizer)[param]  # a param it does not hold: master_param's error
    if resolved.layout is None:
        return whole_param_position(param.numel())
    assert resolved.layout.shard_position is not None  # supported layouts have one
    return resolved.layout.shard_position(resolved.holder, param, master)


def gather_master_param(optimizer: Any, param: Tensor) -> Tensor:
    """The full master of ``param`` (shaped like it), all-gathered over the ZeRO group.

    A collective under ZeRO: every rank of the group must call it for the same param.
    """
    master = master_param(optimizer, param)
    return gather_full(master, master_shard_position(optimizer, param), param.shape)
