"""Shared bits of the Fabric scenario scripts: one Fabric set-up and a tiny model.

Each scenario is a plain training script a user could have written; the tests
launch it as ``python <script>`` and Fabric re-executes it for rank 1. Fabric
comes from the ``lightning`` distribution (``lightning.fabric``) when it is
installed, else from the standalone ``lightning-fabric`` one (``lightning_fabric``).
"""

from __future__ import annotations

import faulthandler
import importlib
import signal
from importlib import metadata
from typing import Any

import torch

# the test harness asks a rank that outlives its run for its stacks before killing it
faulthandler.register(signal.SIGUSR1, all_threads=True)


def _installed(distribution: str) -> bool:
    # not find_spec("lightning"): under pytest, tests/lightning/ is a namespace package of that name
    try:
        metadata.distribution(distribution)
    except metadata.PackageNotFoundError:
        return False
    return True


FABRIC_MODULE = "lightning.fabric" if _installed("lightning") else "lightning_fabric"


def fabric_class() -> Any:
    return importlib.import_module(FABRIC_MODULE).Fabric


def make_fabric(devices: int = 2) -> Any:
    return fabric_class()(accelerator="cpu", devices=devices, strategy="ddp")


class Net(torch.nn.Module):
    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.body = torch.nn.Linear(4, width)
        self.head = torch.nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.body(x)))
