"""An EMA set-up in ``torch.multiprocessing`` children: deep-copy a model that holds a group.

Run by tests/core/test_patch_torch_processgroup_copy_spawn.py in a fresh interpreter, as a
user's training script runs (``python -c "from tests.core.ema_spawn import main; main(...)"``):
a fresh interpreter also means a fresh forkserver, so whether the children are armed
depends only on the ``COMPATSHIM_AUTO`` this run was started with. Nothing here calls
``compatshim.install()``; each child arms through ``COMPATSHIM_AUTO=1`` (the wheel's
``.pth`` hook) or not at all. Each rank writes one JSON report; the launcher prints them.
"""

from __future__ import annotations

import copy
import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

PATCH = "torch-processgroup-copy"
WORLD = 2


def armed_here() -> bool:
    """Whether the patch is applied in this process (compatshim's own status row)."""
    if "compatshim" not in sys.modules:
        return False  # never imported: nothing armed it
    import compatshim

    return any(row["name"] == PATCH and row["applied"] for row in compatshim.status())


class GroupModel(torch.nn.Module):
    """A model that keeps its data-parallel group, as Megatron/Open-Sora models do."""

    def __init__(self, group: Any) -> None:
        super().__init__()
        self.body = torch.nn.Linear(4, 3)
        self.norm = torch.nn.SyncBatchNorm(3, process_group=group)  # CPU: held, not run
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def _ema_steps(model: GroupModel, ema: GroupModel, steps: int = 3, decay: float = 0.5) -> float:
    """A few optimizer steps with ``compatshim.ema.update_ema``; max error against fp64."""
    import compatshim.ema as cema

    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    ref = {n: p.detach().double().clone() for n, p in ema.named_parameters()}
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        model(torch.randn(8, 4, generator=gen)).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        cema.update_ema(ema, model, optimizer, decay=decay)
        for n, p in model.named_parameters():
            ref[n].mul_(decay).add_(p.detach().double(), alpha=1 - decay)
    return max(float((p.double() - ref[n]).abs().max()) for n, p in ema.named_parameters())


def ema_rank(rank: int, port: int, out_dir: str) -> None:
    """``start_processes`` target: join a gloo group, make a subgroup, deep-copy the model."""
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=WORLD,
        timeout=timedelta(seconds=60),
    )
    report: dict[str, Any] = {"rank": rank, "pid": os.getpid(), "armed": armed_here()}
    try:
        group = dist.new_group(list(range(WORLD)), backend="gloo")
        torch.manual_seed(0)
        model = GroupModel(group)
        try:
            ema = copy.deepcopy(model)
        except Exception as exc:  # the control: both ranks fail here alike, no collective waits
            report["deepcopy"] = f"{type(exc).__name__}: {exc}"
        else:
            report["deepcopy"] = "ok"
            report["shares_group"] = ema.group is group and ema.norm.process_group is group
            report["params_copied"] = all(
                p is not q and torch.equal(p, q)
                for p, q in zip(model.parameters(), ema.parameters())
            )
            report["ema_err"] = _ema_steps(model, ema)
            total = torch.ones(1)
            dist.all_reduce(total, group=ema.group)  # the copy's group talks to the other rank
            report["all_reduce"] = float(total)
    finally:
        dist.destroy_process_group()
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(report))


def main(method: str, port: int, out_dir: str, timeout: float = 150.0) -> None:
    """Start the ranks under ``method`` and print the parent's state and every rank's report."""
    import torch.multiprocessing as torch_mp

    context = torch_mp.start_processes(
        ema_rank, args=(port, out_dir), nprocs=WORLD, join=False, start_method=method
    )
    deadline = time.monotonic() + timeout
    try:
        while not context.join(timeout=1):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{method} ranks still running after {timeout:.0f}s")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
                process.join(5)
    reports = [json.loads(Path(out_dir, f"rank{r}.json").read_text()) for r in range(WORLD)]
    print(json.dumps({"parent_armed": armed_here(), "ranks": reports}))
