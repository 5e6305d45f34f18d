"""Rank functions for tests/core/test_run_ranks.py (module-level: the ranks import them)."""

from __future__ import annotations

import atexit
import os
import sys
import time
from pathlib import Path
from typing import Any


def describe(rank: int, world_size: int) -> dict[str, Any]:
    """What this rank sees: its group, environment, directory and parent process."""
    import torch
    import torch.distributed as dist

    total = torch.tensor([float(rank)])
    dist.all_reduce(total)
    return {
        "group": (dist.get_rank(), dist.get_world_size()),
        "sum": float(total),
        "env": dict(os.environ),
        "cwd": os.getcwd(),
        "ppid": os.getppid(),
        "path": list(sys.path),
    }


def rank_one_hangs(rank: int, world_size: int, folder: str) -> int:
    """Rank 1 records its pid and never returns."""
    if rank == 1:
        Path(folder, "pid").write_text(str(os.getpid()))
        time.sleep(3600)
    return rank


def speak(rank: int, world_size: int) -> None:
    print(f"rank {rank} says hello", flush=True)
    print(f"rank {rank} complains", file=sys.stderr, flush=True)


def exit_handler_writes(rank: int, world_size: int, folder: str) -> None:
    """An ``atexit`` handler, as scripts and libraries register them, leaves a file."""
    atexit.register(Path(folder, f"exit{rank}").write_text, "ran")


def unpicklable_result(rank: int, world_size: int) -> Any:
    return lambda: rank


def draws(rank: int, world_size: int) -> tuple[int, int]:
    """One draw from numpy's and Python's global generators, never seeded by the test."""
    import random

    import numpy

    return int(numpy.random.randint(2**62)), random.getrandbits(62)
