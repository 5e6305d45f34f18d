"""timm's own train-script checkpoints, saved and resumed as train.py does; run by test_timm.py.

``save FOLDER``: ``timm.create_model('test_resnet')``, an optimizer from
``timm.optim.create_optimizer_v2``, ``timm.utils.ModelEmaV3`` and
``NativeScaler`` (a CPU ``GradScaler``) train 3 epochs of 2 steps; timm's
``CheckpointSaver`` writes ``checkpoint-{0,1,2}.pth.tar`` with an
``argparse.Namespace`` of train-script arguments, the EMA weights and the scaler
state. The state after epoch 1 and at the end is recorded.
``resume-plain FOLDER`` / ``resume-armed FOLDER``: as train.py resumes:
``resume_checkpoint(model, path, optimizer, loss_scaler)`` gives the next
epoch, ``load_checkpoint(model_ema.module, path, use_ema=True)`` the EMA
weights, and (timm 1.0.26+) ``CheckpointSaver.load_state_dict_from_checkpoint``
its history; then epoch 2 is trained. Armed, ``jobs.job_main`` arms
compatshim around the resume.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path
from typing import Any

import jobs
from child_kit import digest

EPOCHS = 3
RESUME_FROM = 1  # checkpoint-1.pth.tar: written after the second epoch


def _model_name() -> str:
    """timm's small test model where the release has it (0.9 has not), else resnet10t."""
    import timm

    return "test_resnet" if timm.list_models("test_resnet") else "resnet10t"


def _args(model: str) -> argparse.Namespace:
    """What timm's train.py passes the saver: its parsed arguments (a subset, same types)."""
    return argparse.Namespace(
        model=model,
        num_classes=3,
        input_size=(3, 32, 32),
        opt="adamw",
        lr=0.01,
        weight_decay=0.05,
        epochs=EPOCHS,
        sched="cosine",
        model_ema=True,
        model_ema_decay=0.9,
        amp=True,
        amp_dtype="float16",
        mean=[0.485, 0.456, 0.406],
        resume="",
        output="",
        seed=42,
    )


def _setup(folder: Path) -> dict[str, Any]:
    import timm
    import torch
    from timm.optim import create_optimizer_v2
    from timm.utils import CheckpointSaver, ModelEmaV3, NativeScaler

    torch.manual_seed(0)
    args = _args(_model_name())
    model = timm.create_model(args.model, num_classes=args.num_classes)
    optimizer = create_optimizer_v2(model, opt=args.opt, lr=args.lr, weight_decay=args.weight_decay)
    ema = ModelEmaV3(model, decay=args.model_ema_decay)
    try:
        scaler = NativeScaler(device="cpu")
    except TypeError:  # timm < 1.0.10: CUDA's GradScaler, disabled on CPU (empty state)
        scaler = NativeScaler()
    folder.mkdir(parents=True, exist_ok=True)
    saver = CheckpointSaver(
        model, optimizer, args=args, model_ema=ema, amp_scaler=scaler, checkpoint_dir=str(folder)
    )
    return {"model": model, "optimizer": optimizer, "ema": ema, "scaler": scaler, "saver": saver}


def _state(run: dict[str, Any], epoch: int) -> dict[str, Any]:
    return {
        "epoch": epoch,
        "weights": digest(run["model"].state_dict()),
        "optimizer": digest(run["optimizer"].state_dict()),
        "ema": digest(run["ema"].module.state_dict()),
        "scaler": digest(run["scaler"].state_dict()),
        "best": [run["saver"].best_epoch, run["saver"].best_metric],
    }


def _train_epoch(run: dict[str, Any], epoch: int) -> float:
    import torch

    model, optimizer = run["model"], run["optimizer"]
    model.train()
    generator = torch.Generator().manual_seed(1000 + epoch)  # the same data however we got here
    total = 0.0
    for _ in range(2):
        x = torch.randn(4, 3, 32, 32, generator=generator)
        y = torch.randint(0, 3, (4,), generator=generator)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        run["scaler"](loss, optimizer)
        run["ema"].update(model, step=None)
        total += float(loss.detach())
    return total


def _train(run: dict[str, Any], start: int, states: dict[str, Any]) -> None:
    for epoch in range(start, EPOCHS):
        loss = _train_epoch(run, epoch)
        run["saver"].save_checkpoint(epoch, metric=-round(loss, 6))
        states[f"after_epoch_{epoch}"] = _state(run, epoch)


def _resume(run: dict[str, Any], path: Path, states: dict[str, Any]) -> int:
    from timm.models import load_checkpoint, resume_checkpoint

    start = resume_checkpoint(run["model"], str(path), run["optimizer"], run["scaler"])
    load_checkpoint(run["ema"].module, str(path), use_ema=True)
    restore = getattr(run["saver"], "load_state_dict_from_checkpoint", None)
    states["saver_restored"] = bool(restore(str(path))) if restore is not None else None
    states["at_start"] = _state(run, start)
    return int(start)


def save(folder: Path, states: dict[str, Any]) -> None:
    _train(_setup(folder), 0, states)


def resume(folder: Path, mode: str, states: dict[str, Any]) -> Any:
    target = folder / mode  # the saver's history lives next to the file it resumes from
    target.mkdir()
    path = target / f"checkpoint-{RESUME_FROM}.pth.tar"
    shutil.copyfile(folder / path.name, path)
    run = _setup(target)
    return lambda: _train(run, _resume(run, path, states), states)


if __name__ == "__main__":
    jobs.job_main(save, resume)
