"""Only rank 0 calls setup_module a second time (an evaluator built on rank 0).

Rank 1 goes on to ``barrier()`` (argument ``barrier``) or to a training step
with ``all_reduce`` (argument ``step``). Without compatshim rank 0 blocks in
DDP's parameter verification and rank 1 in its collective, for 30 minutes.
A second argument ``function`` runs the same code as ``fabric.launch(run)``
instead of after ``fabric.launch()``.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from _common import Net, make_fabric


def run(fabric: Any, rank1_goes_to: str) -> None:
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


def main(rank1_goes_to: str, as_function: bool) -> None:
    fabric = make_fabric()
    if as_function:
        fabric.launch(run, rank1_goes_to)
    else:
        fabric.launch()
        run(fabric, rank1_goes_to)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "barrier", sys.argv[2:3] == ["function"])
