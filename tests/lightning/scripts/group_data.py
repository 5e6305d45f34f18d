"""The dataset of ``group_dataset.py``, in its own module so every worker imports it by name.

It keeps the process group it was built with, as Megatron-Energon's datasets do;
under ``spawn``/``forkserver`` that group crosses into each DataLoader worker by pickle.
Each sample says what the worker saw: its pid, the type of the group it holds,
and whether compatshim's ``torch-processgroup-copy`` patch is applied there.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
from typing import Any

import torch
from torch.utils.data import Dataset

PATCH = "torch-processgroup-copy"
# the test harness asks a process that outlives its run for its stacks before killing it
faulthandler.register(signal.SIGUSR1, all_threads=True)


def armed_here() -> bool:
    """Whether the patch is applied in this process (compatshim's own status row)."""
    if "compatshim" not in sys.modules:
        return False  # never imported: nothing armed it
    import compatshim

    return any(row["name"] == PATCH and row["applied"] for row in compatshim.status())


class GroupDataset(Dataset):  # type: ignore[type-arg]
    def __init__(self, group: Any, length: int = 16) -> None:
        self.group = group
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {
            "index": index,
            # the worker's RNG (seeded from the rank's generator): equal batches mean equal seeds
            "x": torch.full((2,), float(index)) + torch.rand(2),
            "pid": os.getpid(),
            "group_type": type(self.group).__name__,
            "armed": armed_here(),
        }
