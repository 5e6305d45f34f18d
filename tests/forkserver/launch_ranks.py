"""A user's training script under the launchers users start it with: torchrun and ``mp.spawn``.

Run by tests/forkserver/test_launchers.py in a fresh interpreter, as a user runs it
(``python -m torch.distributed.run --standalone --nproc-per-node 2 -m
tests.forkserver.launch_ranks torchrun``, ``python -m tests.forkserver.launch_ranks
mp-spawn``). Nothing here calls ``compatshim.install()``: the launcher, the ranks and
the DataLoader workers are armed by ``COMPATSHIM_AUTO=1`` (the wheel's start-up hook)
or not at all. Each rank builds a DataLoader with two workers and no start method
named, so the rank's default applies: ``forkserver`` on Linux from Python 3.14 (below
3.14, where it is ``fork``, the rank sets it, which is how 3.14 is emulated there), and
``spawn`` in an ``mp.spawn`` rank on every Python (a child started by ``spawn`` keeps that
method as its default), over
a dataset that keeps a gloo subgroup (``torch-processgroup-copy`` must let it cross into
the workers), then one whose config holds a lambda (``multiprocessing-pickle-paths``
must name it). Each rank prints one ``RESULT {json}`` line.

``mp-spawn-unpicklable``: ``mp.spawn`` is handed an argument holding a lambda; the parent
fails to start the ranks, and the error must name the lambda's path.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as torch_mp
from torch.utils.data import DataLoader

# the Lightning launcher test's dataset: it keeps its group and says what each worker saw
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lightning" / "scripts"))
from group_data import GroupDataset, armed_here

WORLD = 2
TIMEOUT_S = 150.0


class Config:
    """What a user's dataset config holds: here a transform written as a lambda."""

    def __init__(self) -> None:
        self.transform = lambda x: x


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def rank_report(rank: int) -> dict[str, Any]:
    """The DataLoaders of one rank, started by the interpreter's default method."""
    if multiprocessing.get_start_method() == "fork":  # Linux below 3.14: its default emulated
        multiprocessing.set_start_method("forkserver", force=True)
    report: dict[str, Any] = {
        "rank": rank,
        "pid": os.getpid(),
        "armed": armed_here(),
        "start_method": multiprocessing.get_start_method(),
    }
    group = dist.new_group(list(range(WORLD)), backend="gloo")
    try:
        loader = DataLoader(GroupDataset(group, 8), batch_size=2, num_workers=2, timeout=TIMEOUT_S)
        batches = list(loader)
    except Exception as exc:  # the control: the workers cannot be started
        report["loader"] = _error(exc)
    else:
        report["loader"] = "ok"
        report["group_type"] = sorted({t for b in batches for t in b["group_type"]})
        report["worker_armed"] = sorted({bool(a) for b in batches for a in b["armed"].tolist()})
        report["worker_pids"] = sorted({int(p) for b in batches for p in b["pid"].tolist()})
    held = GroupDataset(group, 2)
    held.config = Config()  # type: ignore[attr-defined]
    try:
        list(DataLoader(held, num_workers=1, timeout=TIMEOUT_S))
        report["unpicklable"] = "started"
    except Exception as exc:
        report["unpicklable"] = _error(exc)
    total = torch.ones(1)
    dist.all_reduce(total, group=group)
    report["all_reduce"] = float(total)
    return report


def _print(report: dict[str, Any]) -> None:
    # one write: the ranks share the terminal, and print() writes the newline separately
    sys.stdout.write(f"RESULT {json.dumps(report)}\n")
    sys.stdout.flush()


def torchrun_rank() -> None:
    """A torchrun rank: the group from torchrun's environment (``env://``)."""
    dist.init_process_group("gloo", timeout=timedelta(seconds=TIMEOUT_S))
    try:
        _print(rank_report(dist.get_rank()))
    finally:
        dist.destroy_process_group()


def spawn_rank(rank: int, port: int) -> None:
    """An ``mp.spawn`` rank."""
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=WORLD,
        timeout=timedelta(seconds=TIMEOUT_S),
    )
    try:
        _print(rank_report(rank))
    finally:
        dist.destroy_process_group()


def never_run(rank: int, config: Config) -> None:
    raise AssertionError("a rank started although its argument cannot be pickled")


def main(mode: str) -> None:
    if mode == "torchrun":
        torchrun_rank()
    elif mode == "mp-spawn":
        from tests.harness.dist import free_port

        # no start_method named: as users call it
        torch_mp.spawn(spawn_rank, args=(free_port(),), nprocs=WORLD)
    elif mode == "mp-spawn-unpicklable":
        torch_mp.spawn(never_run, args=(Config(),), nprocs=WORLD)
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1])
