"""A Lightning Trainer run (CPU, 2 ranks, ddp over gloo) whose dataset holds a gloo subgroup.

``python group_dataset.py <start method> [no-group]``: the DataLoader has two workers
started by that method (``forkserver`` is Python 3.14's default on Linux; ``default``
names none, as users write it). The dataset is
built in ``train_dataloader()``, after Lightning has set up the process group, and
keeps a ``dist.new_group`` subgroup (``no-group``: every rank still makes it, and the
dataset keeps None). Each rank fits a few steps and prints one
``RESULT {json}`` line with what its workers sent.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import torch
import torch.distributed as dist
from group_data import GroupDataset
from lightning.pytorch import LightningModule, Trainer, seed_everything
from torch.utils.data import DataLoader

STEPS = 3


class Model(LightningModule):
    def __init__(self, method: str, keep_group: bool) -> None:
        super().__init__()
        self.method = method
        self.keep_group = keep_group
        self.body = torch.nn.Linear(2, 1)
        self.seen: list[dict[str, Any]] = []

    def train_dataloader(self) -> DataLoader:  # type: ignore[type-arg]
        group = dist.new_group([0, 1], backend="gloo")  # every rank makes it, as it must
        return DataLoader(
            GroupDataset(group if self.keep_group else None),
            batch_size=2,
            num_workers=2,
            multiprocessing_context=None if self.method == "default" else self.method,
            timeout=300,  # a loaded CI machine: each worker may import torch and Lightning
        )

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        self.seen.append(
            {
                "index": batch["index"].tolist(),
                "x": [round(v, 6) for v in batch["x"].flatten().tolist()],
                "pid": batch["pid"].tolist(),
                "group_type": list(batch["group_type"]),
                "armed": batch["armed"].tolist(),
            }
        )
        return self.body(batch["x"]).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main(method: str, keep_group: bool = True) -> None:
    seed_everything(7, workers=True)
    model = Model(method, keep_group)
    trainer = Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_steps=STEPS,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model)
    report = {
        "rank": trainer.global_rank,
        "pid": os.getpid(),
        "global_step": trainer.global_step,
        "backend": dist.get_backend() if dist.is_initialized() else None,
        "batches": model.seen,
    }
    # one write: both ranks share the terminal, and print() writes the newline separately
    sys.stdout.write(f"RESULT {json.dumps(report)}\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1], keep_group="no-group" not in sys.argv[2:])
