"""A healthy Fabric run: launch at the entry point, setup, data, steps, collectives, save/load.

Prints one RESULT line per rank; the test compares it with and without compatshim.
"""

from __future__ import annotations

import os
import sys
import tempfile

import torch
from _common import Net, make_fabric
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    fabric = make_fabric()
    fabric.launch()
    fabric.seed_everything(7)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = fabric.setup(model, optimizer)
    data = TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
    loader = fabric.setup_dataloaders(DataLoader(data, batch_size=4))
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        fabric.backward(loss)
        optimizer.step()
        fabric.all_reduce(loss.detach())
    fabric.barrier()
    gathered = fabric.all_gather(torch.tensor([fabric.global_rank]))
    token = fabric.broadcast(tempfile.mkdtemp() if fabric.global_rank == 0 else None)
    path = os.path.join(token, "ckpt.pt")
    fabric.save(path, {"model": model})
    fabric.load(path, {"model": model})
    total = sum(float(p.sum()) for p in model.parameters())
    # one write: both ranks share the terminal, and print() writes the newline separately
    sys.stdout.write(
        f"RESULT rank={fabric.global_rank} gathered={gathered.tolist()} params={total:.6f}\n"
    )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
