"""A plain-torch ZeRO stage 1 (sharded fp32 masters) for the shard-arithmetic tests.

Each rank keeps a 1-D fp32 master shard of every trainable parameter:
``pad(p.view(-1), padding).split(length)[rank]``, ``padding`` making the
flattened parameter divisible by the world size. A step all-reduces the
gradients, updates this rank's master shards (SGD) and all-gathers them back
into the working parameters. The optimizer exposes its map under the
attribute names compatshim.master reads for ColossalAI 0.4.1-0.5.0's
``LowLevelZeroOptimizer`` layout (``working_to_master_param``,
``get_param_padding_size``, ``pid_to_bucket_store[id(p)]`` with
``local_rank``, ``world_size`` and ``torch_pg``); it is not ColossalAI, it
is the same flat shard layout built from torch alone, over a real group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class BucketStore:
    """What compatshim reads per parameter: this rank's place in the ZeRO group."""

    local_rank: int
    world_size: int
    torch_pg: Any


class FlatShardZero:
    """SGD over sharded fp32 masters (see the module docstring)."""

    def __init__(self, params: Iterable[torch.nn.Parameter], lr: float, group: Any = None) -> None:
        self.lr = lr
        self.group = group
        rank, world = dist.get_rank(group), dist.get_world_size(group)
        store = BucketStore(rank, world, group)
        self.params = [p for p in params if p.requires_grad]
        self.param_groups = [{"params": self.params, "lr": lr}]
        self.working_to_master_param: dict[int, torch.Tensor] = {}
        self.master_to_working_param: dict[int, torch.nn.Parameter] = {}
        self.pid_to_bucket_store: dict[int, BucketStore] = {}
        self._padding: dict[int, int] = {}
        for param in self.params:
            padding = (-param.numel()) % world
            flat = torch.nn.functional.pad(param.detach().reshape(-1).float(), [0, padding])
            length = flat.numel() // world
            master = flat[rank * length : (rank + 1) * length].clone()
            self.working_to_master_param[id(param)] = master
            self.master_to_working_param[id(master)] = param
            self.pid_to_bucket_store[id(param)] = store
            self._padding[id(param)] = padding
        self.rank, self.world = rank, world

    def get_param_padding_size(self, param: torch.Tensor) -> int:
        return self._padding[id(param)]

    @torch.no_grad()
    def step(self) -> None:
        for param in self.params:
            assert param.grad is not None
            grad = param.grad.reshape(-1).float().clone()
            dist.all_reduce(grad, group=self.group)
            grad.div_(self.world)
            padding = self._padding[id(param)]
            grad = torch.nn.functional.pad(grad, [0, padding])
            master = self.working_to_master_param[id(param)]
            length = master.numel()
            master.add_(grad[self.rank * length : (self.rank + 1) * length], alpha=-self.lr)
            parts = [torch.empty_like(master) for _ in range(self.world)]
            dist.all_gather(parts, master, group=self.group)
            full = torch.cat(parts)[: param.numel()]
            param.copy_(full.reshape(param.shape).to(param.dtype))

    def zero_grad(self) -> None:
        for param in self.params:
            param.grad = None
