"""One run of a real transformers Trainer / accelerate job; prints one JSON line.

Usage: ``python hf_job.py MODE DIR`` with MODE one of

``trainer-save``
    Trainer, 6 steps with dropout and numpy/python noise in the collator,
    checkpoints every 3 steps (its own ``_save_checkpoint``); reports the
    final weights of this uninterrupted run.
``trainer-resume``
    ``trainer.train(resume_from_checkpoint=DIR/checkpoint-3)``; reports the
    final weights, the step it resumed from and the draws after the run.
``trainer-rng-file``
    a plain ``torch.load`` of the Trainer's ``DIR/checkpoint-3/rng_state.pth``,
    outside transformers' own allowlist: whether torch refuses that file by
    default (and so whether a resume that works did so by allow-listing).
``trainer-fixture``
    ``trainer-save`` into a scratch folder, then copies its ``checkpoint-3``
    as written to ``DIR/numpy-<v>/checkpoint-3`` with ``written_by.json``
    (the versions that wrote it): the Trainer checkpoints of ``hf_fixtures/``,
    one per numpy major, which ``trainer-resume`` reads under the other.
``accelerate-save`` / ``accelerate-resume``
    ``Accelerator.save_state`` after 3 steps of a plain loop, then 3 more;
    ``load_state`` in a fresh process, then the same 3 steps.

Run by tests/resume/test_hf_resume.py with and without compatshim.
"""

from __future__ import annotations

import json
import os
import random
import sys
import traceback
from typing import Any

import job_log
import numpy as np
import torch

STEPS = 6
HALF = 3


def _weights(model: torch.nn.Module) -> list[float]:
    return [
        round(float(v), 6) for v in torch.cat([p.detach().flatten() for p in model.parameters()])
    ]


def _draws() -> dict[str, Any]:
    """What each generator gives next: equal draws mean equal RNG state."""
    return {
        "python": random.random(),
        "numpy": float(np.random.rand()),
        "torch": float(torch.rand(1)),
    }


def _features(index: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 + index)
    return torch.randn(4, generator=g)


class Rows(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __len__(self) -> int:
        return 24

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        x = _features(index)
        return {"x": x, "labels": x.sum(dim=0, keepdim=True)}


def noisy(x: torch.Tensor) -> torch.Tensor:
    """Noise from the numpy and python RNGs inside the step, so a wrong restore changes weights.

    (Not in the collate function: data loaders fetch one batch ahead, so collate-time draws
    straddle the checkpoint and no framework promises to restore them.)
    """
    noise = torch.from_numpy(np.random.normal(0, 0.1, size=tuple(x.shape)).astype(np.float32))
    return (x + noise) * (1.0 + random.random() * 0.1)


def _tiny_model() -> Any:
    from transformers import PretrainedConfig, PreTrainedModel

    class TinyConfig(PretrainedConfig):
        model_type = "compatshim-tiny"

    class Tiny(PreTrainedModel):
        config_class = TinyConfig

        def __init__(self, config: TinyConfig) -> None:
            super().__init__(config)
            self.linear = torch.nn.Linear(4, 1)
            self.dropout = torch.nn.Dropout(0.3)

        def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, Any]:
            out = self.linear(self.dropout(noisy(x)))
            loss = torch.nn.functional.mse_loss(out, labels) if labels is not None else None
            return {"loss": loss, "logits": out}

    torch.manual_seed(0)
    return Tiny(TinyConfig())


def _trainer(out: str) -> Any:
    from transformers import Trainer, TrainingArguments

    args = TrainingArguments(
        output_dir=out,
        max_steps=STEPS,
        per_device_train_batch_size=4,
        learning_rate=0.05,
        save_strategy="steps",
        save_steps=HALF,
        report_to=[],
        logging_strategy="no",
        use_cpu=True,
        seed=7,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    return Trainer(model=_tiny_model(), args=args, train_dataset=Rows())


def trainer_save(out: str) -> dict[str, Any]:
    trainer = _trainer(out)
    trainer.train()
    return {
        "weights": _weights(trainer.model),
        "global_step": trainer.state.global_step,
        "draws": _draws(),
        "checkpoints": sorted(os.listdir(out)),
    }


def trainer_resume(out: str) -> dict[str, Any]:
    from transformers import TrainerCallback

    seen: dict[str, int] = {}

    class FirstStep(TrainerCallback):  # type: ignore[misc]
        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            seen["resumed_at"] = state.global_step

        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            seen.setdefault("first_step", state.global_step)

    trainer = _trainer(out)
    trainer.add_callback(FirstStep())
    trainer.train(resume_from_checkpoint=os.path.join(out, f"checkpoint-{HALF}"))
    return {
        "weights": _weights(trainer.model),
        "global_step": trainer.state.global_step,
        "draws": _draws(),
        **seen,
    }


def trainer_fixture(out: str) -> dict[str, Any]:
    import shutil
    import tempfile
    from importlib.metadata import version

    target = os.path.join(out, f"numpy-{np.__version__}")
    with tempfile.TemporaryDirectory() as scratch:
        saved = trainer_save(scratch)
        checkpoint = f"checkpoint-{HALF}"
        shutil.copytree(os.path.join(scratch, checkpoint), os.path.join(target, checkpoint))
    written_by = {name: version(name) for name in ("transformers", "torch", "numpy")}
    with open(os.path.join(target, "written_by.json"), "w") as handle:
        json.dump(written_by, handle, indent=1)
    return {"written": target, **written_by, "weights": saved["weights"]}


def trainer_rng_file(out: str) -> dict[str, Any]:
    loaded = torch.load(os.path.join(out, f"checkpoint-{HALF}", "rng_state.pth"))
    return {"keys": sorted(loaded)}


class StepCounter:
    """Registered with ``accelerator.register_for_checkpointing``: the resumed step count."""

    def __init__(self) -> None:
        self.step = 0

    def state_dict(self) -> dict[str, int]:
        return {"step": self.step}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.step = int(state["step"])


def _accelerate_parts() -> Any:
    from accelerate import Accelerator
    from accelerate.utils import set_seed

    accelerator = Accelerator(cpu=True)
    set_seed(11)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Dropout(0.3), torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loader = torch.utils.data.DataLoader(Rows(), batch_size=4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    counter = StepCounter()
    accelerator.register_for_checkpointing(counter)
    return accelerator, model, optimizer, loader, counter


def _accelerate_steps(parts: Any, n: int) -> None:
    accelerator, model, optimizer, loader, counter = parts
    batches = iter(loader)
    for _ in range(n):
        counter.step += 1
        batch = next(batches)
        loss = torch.nn.functional.mse_loss(model(noisy(batch["x"])), batch["labels"])
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()


def accelerate_save(out: str) -> dict[str, Any]:
    parts = _accelerate_parts()
    _accelerate_steps(parts, HALF)
    parts[0].save_state(os.path.join(out, "state"))
    _accelerate_steps(parts, HALF)
    return {"weights": _weights(parts[1]), "draws": _draws(), "step": parts[4].step}


def accelerate_resume(out: str) -> dict[str, Any]:
    parts = _accelerate_parts()
    parts[0].load_state(os.path.join(out, "state"))
    step_after_load = parts[4].step
    _accelerate_steps(parts, HALF)
    return {
        "weights": _weights(parts[1]),
        "draws": _draws(),
        "step_after_load": step_after_load,
        "step": parts[4].step,
    }


MODES = {
    "trainer-save": trainer_save,
    "trainer-resume": trainer_resume,
    "trainer-rng-file": trainer_rng_file,
    "trainer-fixture": trainer_fixture,
    "accelerate-save": accelerate_save,
    "accelerate-resume": accelerate_resume,
}


def main() -> None:
    job_log.listen()
    mode, out = sys.argv[1], sys.argv[2]
    try:
        result: dict[str, Any] = {"ok": True, **MODES[mode](out)}
    except Exception as exc:
        result = {
            "ok": False,
            "error_type": type(exc).__name__,
            "error": str(exc),
            "notes": list(getattr(exc, "__notes__", [])),
            "traceback": traceback.format_exc()[-3000:],
        }
    result["retries"] = job_log.retries()
    result["compatshim_imported"] = job_log.compatshim_imported()
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
