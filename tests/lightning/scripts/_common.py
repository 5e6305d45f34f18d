"""Shared bits of the Fabric scenario scripts: one Fabric set-up and a tiny model.

Each scenario is a plain training script a user could have written; the tests
launch it as ``python <script>`` and Fabric re-executes it for rank 1.
"""

from __future__ import annotations

import torch


def make_fabric() -> object:
    from lightning.fabric import Fabric

    return Fabric(accelerator="cpu", devices=2, strategy="ddp")


class Net(torch.nn.Module):
    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.body = torch.nn.Linear(4, width)
        self.head = torch.nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.body(x)))
