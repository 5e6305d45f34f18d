"""Framework containers on the allowlist, with the real framework where the env has it."""

from __future__ import annotations

import argparse
import pickle
from pathlib import Path

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
