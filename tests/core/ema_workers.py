"""Rank functions for tests/core/test_ema.py (module level so spawned ranks can import them)."""

from __future__ import annotations

from typing import Any


def gather_padded_shards(rank: int, world_size: int) -> dict[str, Any]:
    """Each rank holds its padded shard of a 3x5 tensor; gather_full rebuilds it on every rank."""
    import torch
    import torch.distributed as dist

    from compatshim.master.shards import gather_full, zero_shard_position

    full = torch.arange(15, dtype=torch.float32).reshape(3, 5)
    padding = (world_size - 15 % world_size) % world_size
    padded = torch.nn.functional.pad(full.reshape(-1), [0, padding])
    length = padded.numel() // world_size
    shard = padded[rank * length : (rank + 1) * length].clone()
    group = dist.new_group(list(range(world_size)))
    position = zero_shard_position(15, length, padding, rank, world_size, group)
    flat_world = gather_full(shard, position, (3, 5))
    # n-d groups (ColossalAI 0.5): outer group first; here (world, this rank alone)
    singles = [dist.new_group([r]) for r in range(world_size)]
    nested = zero_shard_position(15, length, padding, rank, world_size, (group, singles[rank]))
    flat_nested = gather_full(shard, nested, (3, 5))
    return {
        "offset": position.offset,
        "valid": position.valid_length,
        "equal": bool(torch.equal(flat_world, full)),
        "equal_nested": bool(torch.equal(flat_nested, full)),
    }


def zero_redundancy_identity(rank: int, world_size: int) -> dict[str, Any]:
    """torch's ZeroRedundancyOptimizer keeps no separate masters: params map to themselves."""
    import torch
    from torch.distributed.optim import ZeroRedundancyOptimizer

    import compatshim.ema as cema
    from compatshim.master import master_param

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    ema = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    ema.load_state_dict(model.state_dict())
    optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.SGD, lr=0.1)
    ref = {n: p.detach().double().clone() for n, p in ema.named_parameters()}
    for _ in range(5):
        model(torch.randn(8, 4)).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        cema.update_ema(ema, model, optimizer, decay=0.5)
        for n, p in model.named_parameters():
            ref[n].mul_(0.5).add_(p.detach().double(), alpha=0.5)
    err = max(float((p.double() - ref[n]).abs().max()) for n, p in ema.named_parameters())
    return {
        "identity": all(master_param(optimizer, p) is p for p in model.parameters()),
        "err": err,
    }
