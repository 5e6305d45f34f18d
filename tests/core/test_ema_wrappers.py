"""EMA across wrappers: torch.compile, DDP, FSDP1, activation checkpointing, FSDP2 (real ones).

Parameters pair through one name normaliser (``compatshim.ema.names``) on either
side; a real mismatch still raises ``EmaMismatchError`` naming the parameter.
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")

import compatshim.ema as cema  # noqa: E402
from compatshim.ema.names import canonical  # noqa: E402
from tests.harness.dist import run_ranks  # noqa: E402
from tests.harness.fsdp2 import fsdp2_cpu_problem  # noqa: E402

from .ema_workers import (  # noqa: E402
    _small_net,
    _train_and_compare,
    ddp_and_fsdp1_one_rank,
    fsdp2_sharded_ema,
)


def test_canonical_strips_every_wrapper_segment_anywhere() -> None:
    name = "_orig_mod.module.blocks.0._checkpoint_wrapped_module._fsdp_wrapped_module.w"
    assert canonical(name) == "blocks.0.w"
    assert canonical("blocks.0.w") == "blocks.0.w"


def _checkpoint_wrapped() -> torch.nn.Module:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    net = _small_net()
    net[0] = checkpoint_wrapper(net[0])
    return net


@pytest.mark.parametrize("side", ["source", "ema", "both"])
def test_compiled_models_pair_by_name(side: str) -> None:
    base = _small_net()
    ema = copy.deepcopy(base)
    model = torch.compile(base) if side in ("source", "both") else base
    if side in ("ema", "both"):
        ema = torch.compile(ema)
    assert _train_and_compare(model, ema, side == "ema") < 1e-6


@pytest.mark.parametrize("side", ["source", "ema"])
def test_activation_checkpoint_wrapper_pairs_by_name(side: str) -> None:
    wrapped = _checkpoint_wrapped()
    plain = _small_net()
    plain.load_state_dict({canonical(k): v for k, v in wrapped.state_dict().items()})
    model, ema = (wrapped, plain) if side == "source" else (plain, wrapped)
    assert _train_and_compare(model, ema, side == "ema") < 1e-6


def test_compiled_and_checkpointed_source() -> None:
    model = torch.compile(_checkpoint_wrapped())
    ema = _small_net()
    assert any(
        "_orig_mod." in n and "_checkpoint_wrapped_module." in n
        for n, _ in model.named_parameters()
    )
    assert _train_and_compare(model, ema, False) < 1e-6


def test_real_mismatch_behind_a_wrapper_still_names_the_parameter() -> None:
    model = torch.compile(_small_net())
    ema = torch.nn.Sequential(torch.nn.Linear(5, 4))
    with pytest.raises(
        cema.EmaMismatchError, match=r"no parameter '_orig_mod\.2\.weight'.*'2\.weight'"
    ):
        cema.update_ema(ema, model)


def test_names_that_normalise_alike_are_ambiguous() -> None:
    class Twice(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.module = torch.nn.Module()
            self.module.w = torch.nn.Parameter(torch.zeros(2))
            self.w = torch.nn.Parameter(torch.zeros(2))

    ema = Twice()
    source = torch.nn.Module()
    source._orig_mod = torch.nn.Module()
    source._orig_mod.w = torch.nn.Parameter(torch.zeros(2))
    with pytest.raises(cema.EmaMismatchError, match="several EMA parameters"):
        cema.update_ema(ema, source)


@pytest.mark.dist
def test_ddp_and_fsdp1_on_a_one_rank_gloo_group() -> None:
    [result] = run_ranks(ddp_and_fsdp1_one_rank, 1, timeout=120)
    assert result["ddp_source"] < 1e-6 and result["ddp_ema"] < 1e-6
    assert all("_fsdp_wrapped_module." in n for n in result["fsdp1_names"])
    assert result["fsdp1_source"] < 1e-6
    assert "use_orig_params=True" in result["fsdp1_flat_error"]


@pytest.mark.dist
@pytest.mark.skipif(fsdp2_cpu_problem() is not None, reason=str(fsdp2_cpu_problem()))
def test_fsdp2_each_rank_steps_its_shards_and_gathering_gives_the_full_ema() -> None:
    results = run_ranks(fsdp2_sharded_ema, 2, timeout=180)
    assert results[0]["local_shapes"]["0.weight"] == (2, 5)
    assert results[1]["local_shapes"]["0.weight"] == (2, 5)
    for result in results:
        assert result["gather_err"] < 1e-6 and result["full_err"] < 1e-6
        assert result["gathered_types"] == ["Tensor"]
        assert "DTensor (FSDP2) on one side only" in result["one_side_error"]
        assert "is on meta but the model's shard is on cpu" in result["device_error"]
