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


def _small_net() -> Any:
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Tanh(), torch.nn.Linear(4, 3))


def _train_and_compare(
    model: Any, ema: Any, plain_names: bool, steps: int = 3, train: bool = True
) -> float:
    """Train ``model`` (or shift its params in place), update ``ema`` each step; max error
    against an fp64 reference."""
    import torch

    import compatshim.ema as cema
    from compatshim.ema.names import canonical

    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    ref = {canonical(n): p.detach().double().clone() for n, p in ema.named_parameters()}
    gen = torch.Generator().manual_seed(1)
    runner = getattr(model, "_orig_mod", model)  # torch.compile: wrap only, run eager
    for _ in range(steps):
        if train:
            runner(torch.randn(6, 5, generator=gen)).pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad()
        else:
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(torch.randn(p.shape, generator=gen))
        cema.update_ema(ema, model, optimizer, decay=0.5)
        for n, p in model.named_parameters():
            ref[canonical(n)].mul_(0.5).add_(p.detach().double(), alpha=0.5)
    errs = [
        float((p.detach().double() - ref[canonical(n)]).abs().max())
        for n, p in ema.named_parameters()
    ]
    assert plain_names or any(canonical(n) != n for n, _ in model.named_parameters())
    return max(errs)


def ddp_and_fsdp1_one_rank(rank: int, world_size: int) -> dict[str, Any]:
    """DDP and FSDP1 (use_orig_params) over a 1-rank gloo group, on either side of the EMA."""
    import copy

    import torch
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.nn.parallel import DistributedDataParallel

    import compatshim.ema as cema

    out: dict[str, Any] = {}
    base = _small_net()
    ema = copy.deepcopy(base)
    out["ddp_source"] = _train_and_compare(DistributedDataParallel(base), ema, False)
    base = _small_net()
    ema_ddp = DistributedDataParallel(copy.deepcopy(base))
    out["ddp_ema"] = _train_and_compare(base, ema_ddp, True)
    base = _small_net()
    ema = copy.deepcopy(base)
    fsdp = FullyShardedDataParallel(base, use_orig_params=True, device_id=torch.device("cpu"))
    out["fsdp1_names"] = [n for n, _ in fsdp.named_parameters()]
    # no forward: FSDP1's CPU forward needs torch 2.4+ (2.1: "Stream() takes no arguments")
    out["fsdp1_source"] = _train_and_compare(fsdp, ema, False, train=False)
    flat = FullyShardedDataParallel(_small_net(), device_id=torch.device("cpu"))  # one flat param
    try:
        cema.update_ema(copy.deepcopy(_small_net()), flat)
    except cema.EmaMismatchError as exc:
        out["fsdp1_flat_error"] = str(exc)
    return out


def fsdp2_sharded_ema(rank: int, world_size: int) -> dict[str, Any]:
    """FSDP2: model and EMA fully_shard-ed alike; each rank steps its local shards."""
    import copy

    import torch

    import compatshim.ema as cema

    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:  # torch 2.4 - 2.5
        from torch.distributed._composable.fsdp import fully_shard
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (world_size,))
    base = _small_net()
    ref = {n: p.detach().double().clone() for n, p in base.named_parameters()}
    model, ema, far = base, copy.deepcopy(base), copy.deepcopy(base)
    for module in (model, ema, far):
        for layer in (module[0], module[2]):
            fully_shard(layer, mesh=mesh)
        fully_shard(module, mesh=mesh)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(1)
    for _ in range(3):
        model(torch.randn(6, 5, generator=gen)).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        cema.update_ema(ema, model, optimizer, decay=0.5)
        for n, p in model.named_parameters():
            ref[n].mul_(0.5).add_(p.full_tensor().detach().double(), alpha=0.5)
    try:
        cema.update_ema(_small_net(), model, optimizer)  # an unsharded EMA of a sharded model
    except cema.EmaMismatchError as exc:
        one_side = str(exc)
    try:  # meta stands in for a shard kept on another device than the model's shard
        cema.update_ema(far.to("meta"), model, optimizer)
    except cema.EmaMismatchError as exc:
        device = str(exc)
    gathered = cema.gather_sharded_ema(ema, model, optimizer)
    full = {n: p.full_tensor() for n, p in ema.named_parameters()}  # the documented path
    return {
        "local_shapes": {n: tuple(p.to_local().shape) for n, p in ema.named_parameters()},
        "gather_err": max(float((gathered[n].double() - ref[n]).abs().max()) for n in ref),
        "full_err": max(float((full[n].double() - ref[n]).abs().max()) for n in ref),
        "gathered_types": sorted({type(v).__name__ for v in gathered.values()}),
        "one_side_error": one_side,
        "device_error": device,
    }


def zero_batchnorm_ema(rank: int, world_size: int) -> dict[str, Any]:
    """A BatchNorm model under ZeRO-sharded fp32 masters (``tests.scale.zero``, ColossalAI's
    flat layout built from torch): full-size and sharded EMA, params from the masters and
    buffers from this rank's own model, each against an fp64 reference."""
    import copy

    import torch

    import compatshim.ema as cema
    from tests.scale.zero import FlatShardZero

    decay = 0.5
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(5, 4), torch.nn.BatchNorm1d(4), torch.nn.Tanh(), torch.nn.Linear(4, 3)
    )
    full_ema, sharded_ema = copy.deepcopy(model), copy.deepcopy(model)
    optimizer = FlatShardZero(model.parameters(), lr=0.1)
    cema.shard_ema(sharded_ema, model, optimizer)
    ref_params = {n: p.detach().double().clone() for n, p in model.named_parameters()}
    ref_buffers = {n: b.double().clone() for n, b in model.named_buffers() if b.is_floating_point()}
    gen = torch.Generator().manual_seed(rank)  # each rank its own data: its own statistics
    for _ in range(4):
        model(torch.randn(8, 5, generator=gen) + rank).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        cema.update_ema(full_ema, model, optimizer, decay=decay)
        cema.update_ema(sharded_ema, model, optimizer, decay=decay)
        for name, param in model.named_parameters():
            ref_params[name].mul_(decay).add_(param.detach().double(), alpha=1 - decay)
        for name, ref in ref_buffers.items():
            ref.mul_(decay).add_(model.get_buffer(name).double(), alpha=1 - decay)

    def err(values: dict[str, Any], ref: dict[str, Any]) -> float:
        return max(float((values[n].double() - ref[n]).abs().max()) for n in ref)

    def refusal(ema: Any) -> str:  # meta stands in for an EMA beside CPU-offloaded masters
        try:
            meta = copy.deepcopy(ema).to("meta")  # buffers="skip": the params' check, not theirs
            cema.update_ema(meta, model, optimizer, decay=decay, buffers="skip")
        except cema.EmaMismatchError as exc:
            return str(exc)
        return ""

    gathered = cema.gather_sharded_ema(sharded_ema, model, optimizer)
    return {
        "master_device_errors": [refusal(full_ema), refusal(sharded_ema)],
        "sharded_shapes": {n: tuple(p.shape) for n, p in sharded_ema.named_parameters()},
        "full_param_err": err(dict(full_ema.named_parameters()), ref_params),
        "sharded_param_err": err(gathered, ref_params),
        "full_buffer_err": err(dict(full_ema.named_buffers()), ref_buffers),
        "sharded_buffer_err": err(dict(sharded_ema.named_buffers()), ref_buffers),
        "counter": [int(full_ema[1].num_batches_tracked), int(sharded_ema[1].num_batches_tracked)],
        "gathered_buffers_equal": all(
            torch.equal(gathered[n], b) for n, b in sharded_ema.named_buffers()
        ),
        "running_mean": full_ema[1].running_mean.tolist(),
    }
