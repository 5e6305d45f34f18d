"""compatshim.master / compatshim.ema shard arithmetic at 8 and 32 thread ranks (real numerics).

A plain-torch ZeRO stage 1 (:mod:`scale.zero`) trains a model whose parameters
include ones smaller than the world (most ranks then hold only padding). On
every rank: each master's position tiles the flattened parameter exactly once
across ranks, ``gather_master_param`` rebuilds the full master, and both EMA
shapes (full-size over gathered masters, and Open-Sora's sharded EMA gathered
for saving) equal an unsharded float64 reference.

ColossalAI's own LowLevelZeroOptimizer is not run here: it needs its own env
(the colossalai family runs it on 2 real gloo ranks), ~13 s to import, and
builds its groups through ProcessGroupMesh/new_group paths that assume one
process per rank.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

torch = pytest.importorskip("torch")
dist = torch.distributed

import compatshim.ema as cema  # noqa: E402
from compatshim.master import (  # noqa: E402
    gather_master_param,
    layout_name,
    master_param,
    master_shard_position,
)
from tests.scale.worlds import GLOBAL_LOCK, run_threaded  # noqa: E402
from tests.scale.zero import FlatShardZero  # noqa: E402

DECAY, STEPS = 0.75, 3


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(5, 7)  # 35 + 7 elements
        self.b = torch.nn.Linear(7, 3)  # 21 + 3: the bias is smaller than every world here
        self.scale = torch.nn.Parameter(torch.ones(2))
        self.frozen = torch.nn.Parameter(torch.zeros(4), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.tanh(self.a(x))) * self.scale.sum() + self.frozen.sum()


def _train(rank: int, world_size: int) -> dict[str, Any]:
    with GLOBAL_LOCK:  # the same initial model on every rank
        torch.manual_seed(0)
        model = Net()
    optimizer = FlatShardZero(model.parameters(), lr=0.1)
    full_ema = copy.deepcopy(model)
    sharded_ema = copy.deepcopy(model)
    cema.shard_ema(sharded_ema, model, optimizer)
    reference = {n: p.detach().double().clone() for n, p in model.named_parameters()}
    data = torch.Generator().manual_seed(rank)
    for _ in range(STEPS):
        model(torch.randn(4, 5, generator=data)).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        cema.update_ema(full_ema, model, optimizer, decay=DECAY)
        cema.update_ema(sharded_ema, model, optimizer, decay=DECAY)
        for name, param in model.named_parameters():
            if param.requires_grad:
                reference[name].mul_(DECAY).add_(param.detach().double(), alpha=1 - DECAY)
    positions = {}
    gathered_ok = True
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        pos = master_shard_position(optimizer, param)
        positions[name] = (pos.offset, pos.length, pos.padding, pos.valid_length)
        assert master_param(optimizer, param) is optimizer.working_to_master_param[id(param)]
        gathered_ok &= bool(torch.equal(gather_master_param(optimizer, param), param.detach()))
    saved = cema.gather_sharded_ema(sharded_ema, model, optimizer)
    full = full_ema.state_dict()
    return {
        "layout": layout_name(optimizer),
        "positions": positions,
        "gathered_ok": gathered_ok,
        "shard_shapes": {n: tuple(p.shape) for n, p in sharded_ema.named_parameters()},
        "sharded_equals_full": all(torch.equal(saved[n], full[n]) for n in full),
        "err": max(float((full[n].double() - ref).abs().max()) for n, ref in reference.items()),
        "frozen_untouched": bool(torch.equal(full["frozen"], torch.zeros(4))),
        "checksum": [float(full[n].double().sum()) for n in sorted(full)],
    }


@pytest.mark.timeout(180)
@pytest.mark.parametrize("world", [8, 32])
def test_flat_shard_masters_and_ema_match_the_unsharded_reference(world: int) -> None:
    results = run_threaded(_train, world, timeout=150)
    sizes = {"a.weight": 35, "a.bias": 7, "b.weight": 21, "b.bias": 3, "scale": 2}
    for rank, result in enumerate(results):
        assert result["layout"] == "zero-optimizer-attribute"
        assert result["gathered_ok"], rank
        assert result["sharded_equals_full"] and result["frozen_untouched"], rank
        assert result["err"] < 1e-6, (rank, result["err"])
        for name, numel in sizes.items():
            offset, length, padding, valid = result["positions"][name]
            assert length * world == numel + padding and 0 <= padding < world
            assert offset == rank * length
            assert valid == max(0, min(length, numel - offset))
            assert result["shard_shapes"][name] == (length,)
        assert result["checksum"] == results[0]["checksum"], rank  # every rank agrees
    # across ranks the valid parts tile each parameter exactly once
    for name, numel in sizes.items():
        assert sum(r["positions"][name][3] for r in results) == numel
    if world == 32:  # the 3-element bias lives on ranks 0-2 only; the rest hold padding
        assert [r["positions"]["b.bias"][3] for r in results] == [1, 1, 1] + [0] * 29
