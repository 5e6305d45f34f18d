"""mmengine's own Runner saves and resumes a tiny model; run as a script by test_mmengine.py.

``save FOLDER``: ``Runner.train()`` for 3 epochs; ``CheckpointHook`` writes
``epoch_{1,2,3}.pth``; the state after epoch 2 (when ``epoch_2.pth`` was
written) and after epoch 3 is recorded.
``resume-plain FOLDER`` / ``resume-armed FOLDER``: a new Runner with
``load_from=epoch_2.pth, resume=True`` trains to epoch 3 through mmengine's own
resume path (``Runner.load_or_resume`` -> ``CheckpointLoader`` -> plain
``torch.load``); armed, ``jobs.job_main`` arms compatshim around it. The state
right after the resume and at the end is recorded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jobs


def _tensors(mapping: Any) -> Any:
    import torch

    if isinstance(mapping, torch.Tensor):
        return mapping.detach().double().flatten().tolist()
    if isinstance(mapping, dict):
        return {str(k): _tensors(v) for k, v in mapping.items()}
    if isinstance(mapping, (list, tuple)):
        return [_tensors(v) for v in mapping]
    return mapping


def _state(runner: Any) -> dict[str, Any]:
    hub = runner.message_hub
    return {
        "epoch": runner.epoch,
        "iter": runner.iter,
        "weights": _tensors(runner.model.state_dict()),
        "optimizer": _tensors(runner.optim_wrapper.state_dict()),
        "history": {
            key: [buffer._log_history.tolist(), buffer._count_history.tolist()]
            for key, buffer in hub.log_scalars.items()
        },
        "runtime": {
            key: hub.get_info(key) for key in ("epoch", "iter", "max_epochs", "max_iters", "seed")
        },
    }


def _runner(folder: Path, name: str, states: dict[str, Any], **extra: Any) -> Any:
    import torch
    from mmengine.hooks import Hook
    from mmengine.model import BaseModel
    from mmengine.registry import HOOKS
    from mmengine.runner import Runner
    from torch import nn
    from torch.utils.data import TensorDataset

    class Tiny(BaseModel):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 3)
            self.bn = nn.BatchNorm1d(3)

        def forward(self, x: Any, y: Any, mode: str = "loss") -> Any:
            out = self.bn(self.lin(x))
            return {"loss": nn.functional.cross_entropy(out, y)} if mode == "loss" else out

    @HOOKS.register_module(force=True)
    class Record(Hook):
        priority = "LOWEST"  # after CheckpointHook (VERY_LOW) has saved

        def before_train(self, runner: Any) -> None:
            states["at_start"] = _state(runner)

        def after_train_epoch(self, runner: Any) -> None:
            states[f"after_epoch_{runner.epoch + 1}"] = _state(runner)

    def collate(batch: Any) -> dict[str, Any]:
        xs, ys = zip(*batch)
        return {"x": torch.stack(xs), "y": torch.stack(ys)}

    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(
        torch.randn(16, 4, generator=generator), torch.randint(0, 3, (16,), generator=generator)
    )
    return Runner(
        model=Tiny(),
        work_dir=str(folder),
        experiment_name=name,
        train_dataloader={
            "dataset": data,
            "batch_size": 4,
            "sampler": {"type": "DefaultSampler", "shuffle": True},
            "collate_fn": collate,
        },
        optim_wrapper={"optimizer": {"type": "SGD", "lr": 0.1, "momentum": 0.9}},
        param_scheduler=[{"type": "MultiStepLR", "milestones": [2], "by_epoch": True}],
        train_cfg={"by_epoch": True, "max_epochs": 3},
        default_hooks={"checkpoint": {"type": "CheckpointHook", "interval": 1}},
        custom_hooks=[{"type": "Record"}],
        randomness={"seed": 7},
        **extra,
    )


def save(folder: Path, states: dict[str, Any]) -> None:
    _runner(folder, "save", states).train()


def resume(folder: Path, mode: str, states: dict[str, Any]) -> Any:
    checkpoint = str(folder / "epoch_2.pth")
    return _runner(folder / mode, mode, states, load_from=checkpoint, resume=True).train


if __name__ == "__main__":
    jobs.job_main(save, resume)
