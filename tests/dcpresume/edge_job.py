"""A training state with what torch 2.3+ saves without a trace and torch 2.2's load drops.

``python -m tests.dcpresume.edge_job OUT`` (``fixtures/edge/torch2.15.0`` was written in the
``dcpresume-torch2.15-py3.12`` env) writes a DCP folder (``dcp``) saved before the first
step: a model, its SGD (whose ``state`` is still ``{}``), a OneCycleLR (2.5+ save
``_anneal_func_type`` where 2.2 kept the bound ``anneal_func``), a disabled GradScaler's
state (``{}``), a top-level ``epoch`` int and a ``meta`` dict holding an empty dict; and
what the uninterrupted run does next (``next.pt``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

from tests.dcpresume.optim_job import dcp_kwargs


def build(seed: int = 0) -> tuple[torch.nn.Module, Any, Any]:
    torch.manual_seed(seed)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=20)
    return model, opt, sched


def step(model: torch.nn.Module, opt: Any, sched: Any, index: int) -> None:
    data = torch.Generator().manual_seed(index)
    opt.zero_grad()
    model(torch.randn(4, 3, generator=data)).square().mean().backward()
    opt.step()
    sched.step()


def write(out: Path) -> None:
    import torch.distributed.checkpoint as dcp

    model, opt, sched = build()
    optim_sd = opt.state_dict()  # as saved by hand (get_state_dict makes the state first)
    assert optim_sd["state"] == {}, "an optimizer keeps no state before its first step"
    state = {"model": model.state_dict(), "optim": optim_sd, "sched": sched.state_dict(),
             "scaler": {}, "epoch": 7, "meta": {"a": 1, "e": {}}}  # fmt: skip
    dcp.save(state, **dcp_kwargs(out / "dcp", save=True))
    at_save = {"last_epoch": sched.last_epoch, "lr": sched.get_last_lr()}
    step(model, opt, sched, 0)
    torch.save(
        {"params": model.state_dict(), "lr_next": sched.get_last_lr(), **at_save}, out / "next.pt"
    )
    (out / "TORCH_VERSION").write_text(torch.__version__.split("+")[0] + "\n")


if __name__ == "__main__":
    write(Path(sys.argv[1]))
