"""One training job for the resume tests: runs on real gloo ranks via ``run_ranks``.

The model is tiny and the data a fixed global batch per step (each rank takes
its slice), so a replicated (DDP) or FSDP2 run computes the same losses at any
world size up to float rounding. The saving run goes on past its checkpoint:
it is the uninterrupted run the resumed one is compared with.

torch 2.2 to 2.8 (at least; see ``reduce_scatter_ignores_op``) have gloo's
``reduce_scatter_tensor`` ignore its ``ReduceOp`` and sum: FSDP2 asks for
``ReduceOp.AVG``, so on CPU ranks its gradients were the sum over ranks, N
times the mean (pytorch issue 162338). AdamW hides a constant factor, so a run
looks right until it resumes on another world size: the moments saved at N
ranks then meet gradients of another scale (2->1 diverged at the first resumed
step). Where the live group shows the defect, the job scales its loss by
1/world before ``backward`` so the summed gradient is the mean (exact for the
world sizes used here, powers of two).
"""

from __future__ import annotations

import copy
import inspect
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

import compatshim
import compatshim.ema
import compatshim.optim
import compatshim.rng
from tests.harness.fsdp2 import fully_shard_api

GLOBAL_BATCH = 4  # divisible by every world size the tests use (1, 2, 4)
DECAY = 0.9


def reduce_scatter_ignores_op(group: Any = None) -> bool:
    """Whether ``reduce_scatter_tensor`` on ``group`` sums when asked to average (probed live).

    Seen summing on gloo in torch 2.2.2, 2.4.1, 2.5.1, 2.7.1 and 2.8.0; averaging in
    2.13 and 2.15. A group without ``reduce_scatter_tensor`` (gloo before 2.2) answers
    False: FSDP2 cannot run on it anyway.
    """
    world = dist.get_world_size(group)
    if world == 1:
        return False  # a sum of one is its mean
    rank = dist.get_rank(group)
    out = torch.zeros(1)
    # the name FSDP2 calls: reduce_scatter_single from 2.13 (reduce_scatter_tensor warns there)
    reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    try:
        reduce_scatter(
            out, torch.full((world,), float(rank + 1)), op=dist.ReduceOp.AVG, group=group
        )
    except RuntimeError:
        return False
    mean = (world + 1) / 2
    if float(out) == mean:
        return False
    if float(out) == mean * world:
        return True
    raise AssertionError(f"reduce_scatter_tensor(AVG) gave {float(out)}: neither mean nor sum")


# torch 2.2: dcp.save/load take no checkpoint_id, and load leaves non-tensor items unloaded
_OLD_DCP = "checkpoint_id" not in inspect.signature(dcp.save).parameters


def _save_to(folder: str) -> dict[str, Any]:
    """``dcp.save``'s target: torch 2.2's takes a writer, not ``checkpoint_id``."""
    if not _OLD_DCP:
        return {"checkpoint_id": folder}
    return {"storage_writer": dcp.FileSystemWriter(folder)}


def _batch(step: int, rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(GLOBAL_BATCH, 6, generator=gen)
    y = torch.randn(GLOBAL_BATCH, 3, generator=gen)
    per = GLOBAL_BATCH // world
    return x[rank * per : (rank + 1) * per], y[rank * per : (rank + 1) * per]


def _build(layout: str, world: int) -> tuple[Any, torch.nn.Module, Any, Any, Any]:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    ema = copy.deepcopy(net)
    if layout == "ddp":
        model: Any = torch.nn.parallel.DistributedDataParallel(net)
    else:
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cpu", (world,))
        shard = fully_shard_api()
        # the EMA is sharded as the model is: each rank steps its own shards, and DCP
        # reshards the EMA's DTensors at load like the model's
        for module in (net, ema):
            shard(module[0], mesh=mesh)
            shard(module[2], mesh=mesh)
            shard(module, mesh=mesh)
        model = net
    opt = torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    return model, net, ema, opt, sched


def _state(model: Any, ema: Any, opt: Any, sched: Any, step: int) -> dict[str, Any]:
    model_sd, optim_sd = get_state_dict(model, opt)
    # the step as a tensor: torch 2.2's dcp.load leaves a top-level int as it was
    state = {
        "model": model_sd,
        "optim": optim_sd,
        "sched": sched.state_dict(),
        "step": torch.tensor(step),
    }
    if ema is not None:
        state["ema"] = ema.state_dict()
    return state


def train(
    rank: int, world: int, layout: str, folder: str, save_at: int, steps: int, resume: bool
) -> dict[str, Any]:
    """Train to ``steps``; save at ``save_at`` (or, with ``resume``, load from there first).

    Returns the global losses and this rank's draws from torch's generator after
    each step, the first step's gradients, the step counters seen after loading,
    the RNG restore report, whether FSDP2's reduce-scatter summed (see the module
    docstring) and the final EMA and model parameters (full tensors).
    """
    model, net, ema, opt, sched = _build(layout, world)
    # FSDP2 averages gradients with reduce_scatter_tensor(AVG): where that sums, scale the loss
    sums = layout == "fsdp2" and reduce_scatter_ignores_op()
    out: dict[str, Any] = {
        "losses": {},
        "draws": {},
        "reduce_scatter_sums": sums,
        "gloo_patch": any(
            r.name == "torch-gloo-reduce-scatter-op" and r.applied for r in compatshim.status()
        ),
    }
    start = 0
    if resume:
        state = _state(model, ema, opt, sched, -1)
        compatshim.optim.load_dcp(state, {"optim": opt}, checkpoint_id=folder)
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        sched.load_state_dict(state["sched"])
        if _OLD_DCP:  # torch 2.2's dcp.load leaves non-tensor items (the scheduler's) as they were
            sched.load_state_dict(torch.load(Path(folder) / "sched.pt"))
        if ema is not None:
            ema.load_state_dict(state["ema"])
        start = int(state["step"])
        out["optim_steps"] = sorted({float(s["step"]) for s in opt.state.values()})
        out["sched_epoch"] = sched.last_epoch
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            report = compatshim.rng.load(Path(folder) / "rng.pt")  # last: nothing draws after it
        out["rng"] = {
            "restored": report.restored,
            "derived": report.derived,
            "saved_world": report.saved_world_size,
            "warned": [type(w.message).__name__ for w in caught],
        }
    for step in range(start, steps):
        if step == save_at and not resume:
            dcp.save(_state(model, ema, opt, sched, step), **_save_to(folder))
            compatshim.rng.save(Path(folder) / "rng.pt")
            if _OLD_DCP and rank == 0:
                torch.save(sched.state_dict(), Path(folder) / "sched.pt")
        x, y = _batch(step, rank, world)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        (loss / world if sums else loss).backward()
        if step == start:  # the first step's gradient: equal at every world size
            out["grads"] = _full({name: p.grad for name, p in net.named_parameters()})
        opt.step()
        sched.step()
        if ema is not None:
            compatshim.ema.update_ema(ema, net, decay=DECAY)
        total = loss.detach().clone()
        dist.all_reduce(total)
        out["losses"][step] = float(total) / world
        out["draws"][step] = float(torch.rand(()))  # this rank's stream, step by step
    out["params"] = _full(net.state_dict())
    out["ema"] = _full(ema.state_dict())
    return out


def _full(tensors: dict[str, Any]) -> dict[str, Any]:
    """Whole tensors (DTensors gathered: a collective) as plain lists, which outlive the rank."""
    return {
        name: (value.full_tensor() if hasattr(value, "full_tensor") else value).tolist()
        for name, value in tensors.items()
    }
