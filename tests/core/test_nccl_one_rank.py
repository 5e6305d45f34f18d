"""Patch ``torch-processgroup-copy`` with a real NCCL group on ONE GPU (a one-GPU machine runs it).

The two-rank NCCL test needs two GPUs; this one needs one: a one-rank NCCL world, a
``dist.new_group([0])`` subgroup inside a SyncBatchNorm model (and held as an attribute, as EMA
and DDP code do). Each case runs in a fresh interpreter (``python this_file MODE PORT``), so a
NCCL communicator never outlives its test:

- plain: ``copy.deepcopy``, ``pickle`` and ``torch.save`` fail with ``cannot pickle ...
  ProcessGroup`` (still so in torch 2.11);
- armed (``compatshim.install()``): a deep copy shares the group, a pickle or ``torch.save``
  round trip re-binds to the group with the same global ranks (in this process: the group
  itself), and the copy trains a step on CUDA; ``compatshim.clone_module`` works as well.
"""

from __future__ import annotations

import copy
import io
import json
import os
import pickle
import subprocess
import sys
from typing import Any, Callable

import pytest

CASES = ("deepcopy", "pickle", "torch.save")
pytestmark = [pytest.mark.gpu, pytest.mark.timeout(300)]


def run(mode: str) -> dict[str, Any]:
    from tests.harness.dist import free_port, python_env

    done = subprocess.run(
        [sys.executable, __file__, mode, str(free_port())],
        env=python_env(
            COMPATSHIM_AUTO="0", CUDA_VISIBLE_DEVICES=os.environ.get("CUDA_VISIBLE_DEVICES", "0")
        ),
        capture_output=True,
        text=True,
        timeout=240,
    )
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            result: dict[str, Any] = json.loads(line[len("RESULT ") :])
            return result
    raise AssertionError(
        f"{mode}: no result, exit {done.returncode}\n{done.stdout}\n{done.stderr[-4000:]}"
    )


def test_plain_copies_of_a_model_holding_an_nccl_group_fail() -> None:
    result = run("plain")
    assert result["backend"] == "nccl", result
    for case in CASES:
        assert not result[case]["ok"], (case, result)
        assert "cannot pickle" in result[case]["error"] and "ProcessGroup" in result[case]["error"]


def test_armed_copies_share_or_rebind_the_nccl_group_and_train() -> None:
    result = run("armed")
    assert result["backend"] == "nccl", result
    for case in CASES:
        assert result[case] == {"ok": True, "same_group": True, "ranks": [0], "trains": True}, (
            case,
            result,
        )
    assert result["clone_module"] == {"ok": True, "same_group": True, "trains": True}, result


def _child(mode: str, port: str) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    if mode == "armed":
        import compatshim

        compatshim.install()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1)
    sub = dist.new_group([0], backend="nccl")
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8)).cuda()
    model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model, process_group=sub)
    model.holder_group = sub  # type: ignore[assignment]  # held directly too, as EMA code does

    def trains(copied: torch.nn.Module) -> bool:
        copied.train()
        copied(torch.randn(4, 8, device="cuda")).sum().backward()
        torch.cuda.synchronize()
        return all(p.grad is not None for p in copied.parameters())

    def saved_and_loaded() -> Any:
        buffer = io.BytesIO()
        torch.save(model, buffer)
        buffer.seek(0)
        return torch.load(buffer, weights_only=False)  # our own file, this process

    copies: dict[str, Callable[[], Any]] = {
        "deepcopy": lambda: copy.deepcopy(model),
        "pickle": lambda: pickle.loads(pickle.dumps(model)),
        "torch.save": saved_and_loaded,
    }
    out: dict[str, Any] = {"backend": str(dist.get_backend(sub))}
    for name, make in copies.items():
        try:
            copied = make()
            group = copied[1].process_group
            out[name] = {
                "ok": True,
                "same_group": group is sub and copied.holder_group is sub,
                "ranks": dist.get_process_group_ranks(group),
                "trains": trains(copied),
            }
        except Exception as exc:
            out[name] = {"ok": False, "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    if mode == "armed":
        from compatshim import clone_module

        try:
            cloned = clone_module(model)
            same = cloned[1].process_group is sub and cloned.holder_group is sub
            out["clone_module"] = {"ok": True, "same_group": same, "trains": trains(cloned)}
        except Exception as exc:
            out["clone_module"] = {"ok": False, "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    dist.destroy_process_group()
    return out


if __name__ == "__main__":
    print("RESULT " + json.dumps(_child(sys.argv[1], sys.argv[2])), flush=True)
