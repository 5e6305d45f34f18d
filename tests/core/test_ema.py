"""compatshim.ema and compatshim.master without ColossalAI: plain optimizers, real gloo ranks."""

from __future__ import annotations

import copy
import fnmatch
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

import compatshim.ema as cema  # noqa: E402
from compatshim.master import (  # noqa: E402
    UnknownLayoutError,
    master_param,
    master_shard_position,
    working_to_master,
)
from tests.harness.dist import python_env, run_ranks  # noqa: E402

from .ema_workers import gather_padded_shards, zero_redundancy_identity  # noqa: E402


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Linear(6, 5)
        self.head = torch.nn.Linear(5, 2)
        self.pos_embed = torch.nn.Parameter(torch.zeros(1, 2))
        self.frozen = torch.nn.Parameter(torch.ones(2), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.body(x))) + self.pos_embed + self.frozen


def _train(model: torch.nn.Module, ema: torch.nn.Module, steps: int, **kwargs: object) -> dict:
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
    decay = float(kwargs.pop("decay", 0.8))  # type: ignore[arg-type]
    exclude = tuple(kwargs.pop("exclude", ()))  # type: ignore[arg-type]
    skip = set(exclude)
    ref = {n: p.detach().double().clone() for n, p in ema.named_parameters()}
    gen = torch.Generator().manual_seed(0)
    for _ in range(steps):
        x = torch.randn(4, 6, generator=gen).to(next(model.parameters()).dtype)
        model(x).float().pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        cema.update_ema(ema, model, optimizer, decay=decay, exclude=exclude)
        for n, p in model.named_parameters():
            if p.requires_grad and not any(fnmatch.fnmatchcase(n, pat) for pat in skip):
                ref[n].mul_(decay).add_(p.detach().double(), alpha=1 - decay)
    return ref


def _max_err(ema: torch.nn.Module, ref: dict) -> float:
    return max(float((p.double() - ref[n]).abs().max()) for n, p in ema.named_parameters())


def test_plain_optimizer_ema_matches_fp64_reference() -> None:
    torch.manual_seed(0)
    model = Net()
    ema = copy.deepcopy(model)
    ref = _train(model, ema, 20)
    assert _max_err(ema, ref) < 1e-6
    assert not torch.equal(ema.body.weight, model.body.weight)  # it lags behind


def test_frozen_and_excluded_params_untouched() -> None:
    torch.manual_seed(0)
    model = Net()
    ema = copy.deepcopy(model)
    with torch.no_grad():
        ema.frozen.fill_(7.0)
        ema.pos_embed.fill_(3.0)
        ema.head.bias.fill_(5.0)
    ref = _train(model, ema, 5, exclude=("pos_embed", "head.b*"))
    assert torch.equal(ema.frozen, torch.full((2,), 7.0))
    assert torch.equal(ema.pos_embed, torch.full((1, 2), 3.0))
    assert torch.equal(ema.head.bias, torch.full((2,), 5.0))
    assert _max_err(ema, ref) < 1e-6


def test_bf16_working_params_fp32_ema() -> None:
    torch.manual_seed(0)
    model = Net().to(torch.bfloat16)
    ema = copy.deepcopy(model).float()
    ref = _train(model, ema, 20)
    assert all(p.dtype == torch.float32 for p in ema.parameters())
    assert _max_err(ema, ref) < 1e-6


def test_plain_optimizer_maps_every_param_to_itself() -> None:
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters())
    mapping = working_to_master(optimizer)
    assert len(mapping) == 6
    assert all(mapping[p] is p and mapping[id(p)] is p for p in model.parameters())
    assert set(map(id, mapping)) == set(map(id, model.parameters()))
    assert master_param(optimizer, model.head.weight) is model.head.weight
    assert master_shard_position(optimizer, model.head.weight).is_whole


def test_plan_is_cached_and_rebuilt_when_the_model_changes() -> None:
    model = Net()
    ema = copy.deepcopy(model)
    cema.update_ema(ema, model, decay=0.5)
    plan = cema._plans[ema]
    cema.update_ema(ema, model, decay=0.5)
    assert cema._plans[ema] is plan
    model.body.weight.requires_grad_(False)
    cema.update_ema(ema, model, decay=0.5)
    assert cema._plans[ema] is not plan
    assert len(cema._plans[ema].same_ema) == len(plan.same_ema) - 1


def test_mismatched_ema_is_a_clear_error() -> None:
    model = Net()
    other = torch.nn.Linear(6, 5)
    with pytest.raises(cema.EmaMismatchError, match=r"no parameter 'head\.weight'"):
        cema.update_ema(other, model, exclude=("body.*", "pos_embed"))
    ema = copy.deepcopy(model)
    ema.head.weight.data = torch.zeros(3)
    with pytest.raises(cema.EmaMismatchError, match=r"head\.weight"):
        cema.update_ema(ema, model)
    with pytest.raises(ValueError, match="decay"):
        cema.update_ema(copy.deepcopy(model), model, decay=1.5)


def test_unknown_optimizer_layout_is_a_clear_error() -> None:
    class SomeFutureOptimizer:
        optim = None

    with pytest.raises(UnknownLayoutError) as info:
        working_to_master(SomeFutureOptimizer())
    message = str(info.value)
    assert "SomeFutureOptimizer" in message
    assert "colossalai" in message
    assert "optimizer._param_store.working_to_master_param" in message
    assert "zero-optimizer-attribute" in message and "plain-torch-optimizer" in message


def test_import_is_cheap() -> None:
    code = (
        "import sys, compatshim.ema, compatshim.master; "
        "heavy = [m for m in ('torch', 'numpy', 'colossalai') if m in sys.modules]; "
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env=python_env(), timeout=60)


@pytest.mark.dist
def test_sharded_gather_over_two_gloo_ranks() -> None:
    results = run_ranks(gather_padded_shards, 2, timeout=120)
    assert [r["offset"] for r in results] == [0, 8]
    assert [r["valid"] for r in results] == [8, 7]
    assert all(r["equal"] and r["equal_nested"] for r in results)


@pytest.mark.dist
def test_zero_redundancy_optimizer_params_are_their_own_masters() -> None:
    results = run_ranks(zero_redundancy_identity, 2, timeout=120)
    assert all(r["identity"] for r in results)
    assert all(r["err"] < 1e-6 for r in results)
