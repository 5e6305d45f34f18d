"""Code above launch() decides "am I distributed?" from WORLD_SIZE.

Fabric's launcher sets WORLD_SIZE in the re-executed child, not in the parent
process, so rank 1 wraps the model in DDP and rank 0 does not: rank 1 waits in
DDP's set-up, rank 0 in the all_reduce of its first step.
"""

from __future__ import annotations

import os

import torch
from _common import Net, make_fabric

DISTRIBUTED = int(os.environ.get("WORLD_SIZE", "1")) > 1


def main() -> None:
    fabric = make_fabric()
    fabric.launch()
    model = Net()
    if DISTRIBUTED:
        model = fabric.setup_module(model)  # <- ddp-wrap-site
    loss = model(torch.ones(2, 4)).sum()
    fabric.all_reduce(loss.detach())  # <- plain-step-site
    print(f"rank {fabric.global_rank} finished")


if __name__ == "__main__":
    main()
