"""Framework containers on the allowlist, with the real framework where the env has it."""

from __future__ import annotations

import argparse
import pickle
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

import torch

from compatshim.checkpoint import UnsafeCheckpointError, inspect, load


def test_lightning_attribute_dict_stays_an_attribute_dict(tmp_path: Path) -> None:
    data = pytest.importorskip("lightning.fabric.utilities.data")
    parsing = pytest.importorskip("lightning.pytorch.utilities.parsing")
    hparams = parsing.AttributeDict(lr=0.1, args=argparse.Namespace(depth=3))
    state = data.AttributeDict(step=7, weights=torch.ones(2))
    path = tmp_path / "last.ckpt"
    torch.save({"hyper_parameters": hparams, "state": state}, path)
    got = load(path)
    assert type(got["hyper_parameters"]) is parsing.AttributeDict
    assert type(got["state"]) is data.AttributeDict
    assert got["hyper_parameters"].lr == 0.1 and got["hyper_parameters"].args.depth == 3
    assert got["state"].step == 7 and torch.equal(got["state"].weights, torch.ones(2))
    assert inspect(path).loadable


def test_framework_global_without_the_framework_is_refused_with_the_reason(
    tmp_path: Path,
) -> None:
    try:
        import deepspeed  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("deepspeed is installed here")
    path = tmp_path / "zero.pt"
    path.write_bytes(b"\x80\x02cdeepspeed.runtime.zero.config\nZeroStageEnum\nK\x02\x85R.")
    with pytest.raises(UnsafeCheckpointError, match="deepspeed is not installed"):
        load(path)
    use = inspect(path).globals[0]
    assert use.entry == "deepspeed.runtime.zero.config.ZeroStageEnum"
    assert use.note == "deepspeed is not installed" and not use.covered


def test_attribute_dict_build_cannot_reach_the_class(tmp_path: Path) -> None:
    data = pytest.importorskip("lightning.fabric.utilities.data")
    path = tmp_path / "evil.pkl"
    path.write_bytes(
        b"\x80\x02clightning.fabric.utilities.data\nAttributeDict\n}X\x01\x00\x00\x00xK\x01sb."
    )
    with pytest.raises(UnsafeCheckpointError, match="BUILD"):
        load(path)
    assert "x" not in vars(data.AttributeDict)
    assert pickle.loads(pickle.dumps(data.AttributeDict(a=1))) == {"a": 1}


@pytest.mark.parametrize("strategy", ["cos", "linear"])
def test_one_cycle_lr_state_from_torch_before_2_3_loads(tmp_path: Path, strategy: str) -> None:
    """torch 2.0-2.2's OneCycleLR keeps its staticmethod in ``anneal_func``, so its
    ``state_dict()`` pickles ``getattr(OneCycleLR, '_annealing_cos')``; newer torch still
    resumes from such a state (``_anneal_func`` falls back to it)."""
    one_cycle = torch.optim.lr_scheduler.OneCycleLR
    opt = torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=0.1)
    sched = one_cycle(opt, max_lr=1.0, total_steps=10, anneal_strategy=strategy)
    sched.anneal_func = vars(one_cycle)[f"_annealing_{strategy}"].__func__  # as 2.0-2.2 set it
    vars(sched).pop("_anneal_func_type", None)
    path = tmp_path / "scheduler.pt"
    torch.save(sched.state_dict(), path)
    assert b"getattr" in path.read_bytes()  # protocol 2 spells the method this way
    got = load(path)
    assert got == torch.load(path, weights_only=False)
    assert got["anneal_func"] is getattr(one_cycle, f"_annealing_{strategy}")
    assert inspect(path).loadable
    fresh = torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=0.1)
    resumed = one_cycle(fresh, max_lr=1.0, total_steps=10, anneal_strategy=strategy)
    resumed.load_state_dict(got)
    for optimizer, scheduler in ((opt, sched), (fresh, resumed)):
        optimizer.step()
        scheduler.step()
    assert resumed.get_last_lr() == sched.get_last_lr()


def test_one_cycle_lr_getattr_reads_only_its_two_anneal_functions(tmp_path: Path) -> None:
    path = tmp_path / "other.pt"
    path.write_bytes(
        b"\x80\x02cbuiltins\ngetattr\nctorch.optim.lr_scheduler\nOneCycleLR\nX\x04\x00\x00\x00step\x86R."
    )
    with pytest.raises(UnsafeCheckpointError, match="not a listed method"):
        load(path)
    path.write_bytes(b"\x80\x02ctorch.optim.lr_scheduler\nOneCycleLR\n)R.")
    with pytest.raises(UnsafeCheckpointError, match="may not be called"):
        load(path)


@pytest.mark.parametrize("strategy", ["cos", "linear"])
def test_swalr_state_from_torch_before_2_6_loads(tmp_path: Path, strategy: str) -> None:
    """torch 2.0-2.5's SWALR keeps its staticmethod in ``anneal_func`` and its
    ``state_dict()`` keeps it (Lightning's StochasticWeightAveraging saves that state);
    newer torch resumes from it."""
    swalr = torch.optim.swa_utils.SWALR
    function = {"cos": "_cosine_anneal", "linear": "_linear_anneal"}[strategy]

    def scheduler() -> tuple[torch.optim.Optimizer, Any]:
        opt = torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=0.1)
        return opt, swalr(opt, swa_lr=0.05, anneal_epochs=4, anneal_strategy=strategy)

    opt, sched = scheduler()
    state = {k: v for k, v in vars(sched).items() if k not in ("optimizer", "_anneal_strategy")}
    assert state["anneal_func"] is getattr(swalr, function)  # as 2.0-2.5 saved it
    path = tmp_path / "swa.pt"
    torch.save(state, path)
    got = load(path)
    assert got == torch.load(path, weights_only=False)
    assert got["anneal_func"] is getattr(swalr, function)
    assert inspect(path).loadable
    fresh, resumed = scheduler()
    resumed.load_state_dict(got)
    for optimizer, each in ((opt, sched), (fresh, resumed)):
        optimizer.step()
        each.step()
    assert resumed.get_last_lr() == sched.get_last_lr()
