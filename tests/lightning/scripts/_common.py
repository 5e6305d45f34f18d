"""Shared bits of the Fabric scenario scripts: one Fabric set-up and a tiny model.

Each scenario is a plain training script a user could have written; the tests
launch it as ``python <script>`` and Fabric re-executes it for rank 1. Fabric
comes from the ``lightning`` distribution (``lightning.fabric``) when it is
installed, else from the standalone ``lightning-fabric`` one (``lightning_fabric``).
"""

from __future__ import annotations

import importlib.util
from typing import Any

import torch

FABRIC_MODULE = (
    "lightning.fabric" if importlib.util.find_spec("lightning") is not None else "lightning_fabric"
)


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
