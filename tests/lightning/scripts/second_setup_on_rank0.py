"""Only rank 0 calls setup_module a second time (an evaluator built on rank 0).

Rank 1 goes on to ``barrier()`` (argument ``barrier``) or to a training step
with ``all_reduce`` (argument ``step``). Without compatshim rank 0 blocks in
DDP's parameter verification and rank 1 in its collective, for 30 minutes.
"""

from __future__ import annotations

import sys

import torch
from _common import Net, make_fabric


def main(rank1_goes_to: str) -> None:
    fabric = make_fabric()
    fabric.launch()
    model = fabric.setup_module(Net())
    if fabric.global_rank == 0:
        evaluator = fabric.setup_module(Net())  # <- rank0-second-setup
        del evaluator
    if rank1_goes_to == "barrier":
        fabric.barrier()  # <- barrier-site
    else:
        loss = model(torch.ones(2, 4)).sum()
        fabric.all_reduce(loss.detach())  # <- step-site
    print(f"rank {fabric.global_rank} finished")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "barrier")
