"""Module-level code that spawned processes import: a Dataset holding a real ``DetectionConfig``.

Spawned children (DataLoader workers, ``torch.multiprocessing.spawn`` ranks)
unpickle what the parent sends, so everything here lives at module level.
The children never call ``compatshim.install()``: they get the patch only
from ``COMPATSHIM_AUTO=1`` through the start-up hook the wheel installs.
They send the config back to the parent (worker results) or to the other
rank (``all_gather_object`` over gloo), which pickles it again in the child,
so a child without the patch fails loudly.
"""

from __future__ import annotations

import json
import os
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import Dataset

PATCH_NAME = "nuscenes-dict-views"


def patch_applied_here() -> bool:
    """Whether this process has the patch applied (read from compatshim's registry)."""
    import compatshim

    return any(row["name"] == PATCH_NAME and row["applied"] for row in compatshim.status())


class EvalConfigDataset(Dataset):  # type: ignore[type-arg]
    """What UniAD-style code does: a training dataset that carries the eval config."""

    def __init__(self, eval_cfg: Any, length: int = 4) -> None:
        self.eval_cfg = eval_cfg
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict[str, Any]:
        names = list(self.eval_cfg.class_names)
        return {
            "index": index,
            "pid": os.getpid(),
            "class_name": names[index % len(names)],
            "car_in_class_names": "car" in self.eval_cfg.class_names,
            "class_names_type": type(self.eval_cfg.class_names).__name__,
            "patched": patch_applied_here(),
            "eval_cfg": self.eval_cfg,  # pickled again in the worker on the way back
        }


def keep_samples(batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """DataLoader collate_fn: hand the samples back as they are."""
    return batch


def gather_config_rank(rank: int, dataset: EvalConfigDataset, out_dir: str, world: int) -> None:
    """``mp.spawn`` target: exchange the config with the other rank over gloo, write a report."""
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{os.environ['CS_TEST_PORT']}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=60),
    )
    try:
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, dataset.eval_cfg)
        mine = dataset.eval_cfg.serialize()
        report = {
            "rank": rank,
            "patched": patch_applied_here(),
            "serialized_equal": [cfg.serialize() == mine for cfg in gathered],
            "class_names": [list(cfg.class_names) for cfg in gathered],
            "class_names_type": [type(cfg.class_names).__name__ for cfg in gathered],
            "torch": torch.__version__,
        }
    finally:
        dist.destroy_process_group()
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(report))
