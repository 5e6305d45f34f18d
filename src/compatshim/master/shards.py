"""Where a ZeRO master shard sits inside its working parameter, and how to gather it back.

ZeRO keeps, on each rank, a 1-D fp32 shard of the *flattened, zero-padded*
working parameter: ``pad(p.view(-1), padding).split(len)[rank]``. Code that
mixes masters with full-size tensors (EMA, checkpoints) needs that position.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import Tensor


@dataclass(frozen=True)
class ShardPosition:
    """This rank's slice ``[offset, offset + length)`` of the flattened, padded working param.

    ``padding`` zeros were appended to the ``numel`` real elements before the
    split into ``world_size`` equal shards; ``group`` is the process group (or
    the tuple of groups, outermost first) the shards are split over, ``None``
    when the master is the whole parameter.
    """

    offset: int
    length: int
    padding: int
    numel: int
    rank: int
    world_size: int
    group: Any = None

    @property
    def valid_length(self) -> int:
        """How many elements of this shard are real (not padding)."""
        return max(0, min(self.length, self.numel - self.offset))

    @property
    def is_whole(self) -> bool:
        """True when the master holds the whole parameter (no sharding, no padding)."""
        return self.world_size == 1 and self.padding == 0


def whole_param_position(numel: int) -> ShardPosition:
    """The position of a master that is a full copy of its parameter."""
    return ShardPosition(offset=0, length=numel, padding=0, numel=numel, rank=0, world_size=1)


def zero_shard_position(
    numel: int, master_numel: int, padding: int, rank: int, world_size: int, group: Any
) -> ShardPosition:
    """Position of a ZeRO shard; checks the store's numbers agree with the tensors."""
    if (numel + padding) != master_numel * world_size:
        raise ValueError(
            f"compatshim.master: shard arithmetic does not add up: param of {numel} elements "
            f"+ {padding} padding != {world_size} ranks x {master_numel}-element master shard"
        )
    return ShardPosition(
        offset=rank * master_numel,
        length=master_numel,
        padding=padding,
        numel=numel,
        rank=rank,
        world_size=world_size,
        group=group,
    )


def store_shard_position(
    store: Any, param: Tensor, master: Tensor, padding: int, group: Any
) -> ShardPosition:
    """Position of ``param``'s master from a ZeRO store's ``local_rank`` and ``world_size``."""
    numel = param.numel()
    if master.numel() == numel and padding == 0 and int(store.world_size) == 1:
        return whole_param_position(numel)
    return zero_shard_position(
        numel=numel,
        master_numel=master.numel(),
        padding=padding,
        rank=int(store.local_rank),
        world_size=int(store.world_size),
        group=group,
    )


def all_gather_flat(shard: Tensor, group: Any) -> Tensor:
    """Concatenate every rank's equal-size 1-D ``shard`` in rank order over ``group``.

    ``group`` may be a tuple of groups (ColossalAI 0.5's n-d ZeRO groups, outer
    first); the innermost is gathered first, which gives the row-major order
    ColossalAI uses to number ranks. Uses ``all_gather`` (lists), which every
    backend, gloo included, implements.
    """
    import torch
    import torch.distributed as dist

    groups = group if isinstance(group, tuple) else (group,)
    data = shard.contiguous()
    for pg in reversed(groups):
        size = dist.get_world_size(group=pg)
        parts = [torch.empty_like(data) for _ in range(size)]
        dist.all_gather(parts, data, group=pg)
        data = torch.cat(parts)
    return data


def gather_full(shard: Tensor, position: ShardPosition, shape: Any) -> Tensor:
    """The full tensor of ``shape`` from every rank's shard, padding stripped."""
    if position.is_whole or position.world_size == 1:
        return shard.reshape(-1)[: position.numel].reshape(shape)
    flat = all_gather_flat(shard.reshape(-1), position.group)
    return flat[: position.numel].reshape(shape)
