"""The LR-scheduler runs the cross-release tests share: the same model, data and steps on any torch.

``python -m tests.dcpresume.sched_job OUT`` (run under each release the tests
resume from: ``fixtures/sched/torch<version>`` was written in the
``dcpresume-*`` envs) writes, per scheduler, AdamW + the scheduler after
``SAVED`` steps (optimizer and scheduler stepped each time) as ``torch.save``
(``plain.pt``) and as a DCP folder (``dcp``; nested optimizer state), and what
the uninterrupted run does next (``next.pt``): the schedulers' ``last_epoch`` (:func:`epochs`) and
learning rate at the save, and the parameters and learning rate one step later.
Where the release has a CPU ``torch.amp.GradScaler`` (2.3+), its state is saved
beside them (``"scaler"``) after ``SAVED`` scaled steps. ``python -m tests.dcpresume.sched_job OUT
--plateau`` writes :func:`write_plateau`'s folder instead (``fixtures/plateau/torch2.2.2``).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import torch

from tests.dcpresume.optim_job import dcp_kwargs
from tests.dcpresume.optim_job import step as optim_step

SAVED = 3
WARMUP, TOTAL = 2, 8


def warmup_cosine(epoch: int) -> float:
    """Linear warmup then cosine decay: the usual LM schedule (a function: not saved by torch)."""
    if epoch < WARMUP:
        return (epoch + 1) / WARMUP
    return 0.5 * (1 + math.cos(math.pi * (epoch - WARMUP) / (TOTAL - WARMUP)))


def _sequential(opt: Any) -> Any:
    sched = torch.optim.lr_scheduler
    warm = sched.LinearLR(opt, start_factor=0.25, total_iters=WARMUP)
    cosine = sched.CosineAnnealingLR(opt, T_max=TOTAL - WARMUP)
    return sched.SequentialLR(opt, [warm, cosine], milestones=[WARMUP])


def _chained(opt: Any) -> Any:
    sched = torch.optim.lr_scheduler
    return sched.ChainedScheduler(
        [sched.ConstantLR(opt, factor=0.5, total_iters=WARMUP), sched.ExponentialLR(opt, 0.9)]
    )


def _nested(opt: Any) -> Any:
    """A SequentialLR inside a ChainedScheduler: nesting two deep (torch's SequentialLR
    cannot hold a ChainedScheduler: it steps it with an epoch)."""
    sched = torch.optim.lr_scheduler
    return sched.ChainedScheduler([_sequential(opt), sched.ExponentialLR(opt, 0.95)])


SCHEDULERS = {
    "lambda": lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine),
    "step": lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5),
    "sequential": _sequential,
    "chained": _chained,
    "nested": _nested,
}


def build(name: str) -> tuple[torch.nn.Module, Any, Any]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.5)
    return model, opt, SCHEDULERS[name](opt)


def epochs(sched: Any) -> list[int]:
    """``last_epoch`` of the scheduler and of each one it nests, depth first (a
    ChainedScheduler has none of its own)."""
    own = [sched.last_epoch] if hasattr(sched, "last_epoch") else []
    return own + [e for inner in getattr(sched, "_schedulers", []) for e in epochs(inner)]


def step(model: torch.nn.Module, opt: Any, sched: Any, index: int) -> None:
    optim_step(model, opt, index)
    sched.step()


def has_cpu_scaler() -> bool:
    """Whether this torch has a GradScaler that runs on CPU (``torch.amp.GradScaler``, 2.3+)."""
    return hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler")


def scaler(init_scale: float = 2.0**16) -> Any:
    """A CPU GradScaler (growth every 2 steps, so the saved state has grown once)."""
    return torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=2)


def scaled_steps(grad_scaler: Any, steps: int) -> None:
    """``steps`` scaled backward/step on a one-parameter SGD: moves the scale and its tracker."""
    param = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([param], lr=0.1)
    for _ in range(steps):
        opt.zero_grad()
        grad_scaler.scale((param**2).sum()).backward()
        grad_scaler.step(opt)
        grad_scaler.update()


def write(out: Path) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    for name in SCHEDULERS:
        folder = out / name
        folder.mkdir(parents=True, exist_ok=True)
        model, opt, sched = build(name)
        for index in range(SAVED):
            step(model, opt, sched, index)
        state: dict[str, Any] = {"sched": sched.state_dict()}
        if has_cpu_scaler():
            grad_scaler = scaler()
            scaled_steps(grad_scaler, SAVED)
            state["scaler"] = grad_scaler.state_dict()
        torch.save(
            {"model": model.state_dict(), "optim": opt.state_dict(), **state}, folder / "plain.pt"
        )
        model_sd, optim_sd = get_state_dict(model, opt)
        dcp.save(
            {"model": model_sd, "optim": optim_sd, **state}, **dcp_kwargs(folder / "dcp", save=True)
        )
        at_save = {"epochs": epochs(sched), "lr": sched.get_last_lr()}
        step(model, opt, sched, SAVED)
        torch.save(
            {"params": model.state_dict(), "lr_next": sched.get_last_lr(), **at_save},
            folder / "next.pt",
        )
    (out / "TORCH_VERSION").write_text(torch.__version__.split("+")[0] + "\n")


def write_plateau(out: Path) -> None:
    """A ReduceLROnPlateau (patience 0) on SGD saved before its first step (``dcp``): torch 2.2's
    state then lacks ``_last_lr``, which its ``step()`` set (``test_sched_keys``)."""
    import torch.distributed.checkpoint as dcp

    opt = torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=1.0)
    sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, patience=0)
    dcp.save({"sched": sched.state_dict()}, **dcp_kwargs(out / "dcp", save=True))
    (out / "TORCH_VERSION").write_text(torch.__version__.split("+")[0] + "\n")


if __name__ == "__main__":
    if sys.argv[2:] == ["--plateau"]:
        write_plateau(Path(sys.argv[1]))
    else:
        write(Path(sys.argv[1]))
