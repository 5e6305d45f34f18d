"""One run of a real Lightning Trainer; prints one JSON line.

Usage: ``python lightning_job.py MODE DIR`` with MODE one of

``save``
    for each hyper-parameter kind, an 8-step run whose ``ModelCheckpoint``
    (Lightning's own save path) writes ``DIR/<kind>/step=<n>.ckpt`` at the end
    of every epoch; its final weights are the reference.
``resume``
    for each kind, ``trainer.fit(model, ckpt_path=DIR/<kind>/step=4.ckpt)`` to
    step 8 and ``Model.load_from_checkpoint`` of it; reports per kind
    what loaded (or the error), the step training resumed at, the final
    weights and the hyper-parameters with their types; then both paths on
    ``poisoned.ckpt``: the error (or that it loaded) and whether the payload
    ran (``MARKER``, removed again for the next run).

Training is deterministic (no dropout, no shuffling) and each epoch is one
batch, the same every epoch. That matters: resuming from an epoch-end
checkpoint, every Lightning release 2.3-2.6 re-enters the saved epoch and
trains one step on the first batch of a fresh loader, so with several batches
per epoch the resumed run sees another batch order than an uninterrupted one
(Lightning promises exact data order only for stateful loaders). With one
batch per epoch the order cannot differ, and a resumed run must end with the
reference weights: weights, SGD momentum and step counter all restored. Run by
tests/resume/test_lightning_resume.py.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from typing import Any

import job_log
import torch

try:
    import lightning as L
    from lightning.fabric.utilities.data import AttributeDict as FabricAttributeDict
    from lightning.pytorch.utilities.parsing import AttributeDict as TrainerAttributeDict
except ImportError:  # pragma: no cover - the test skips first
    raise

HALF, STEPS = 4, 8


class Payload:
    """Unpickles as ``os.system("touch MARKER")``: what a poisoned checkpoint does."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> Any:
        return (os.system, (f"touch {self.marker}",))


def hyper_parameters(kind: str) -> Any:
    """The saved hyper-parameter object of each kind (built the same way in every run)."""
    if kind == "namespace":
        return argparse.Namespace(lr=0.1, layers=[4, 1], name="tiny")
    if kind == "fabric-attributedict":  # another module's AttributeDict than the Trainer's own
        return FabricAttributeDict(lr=0.1, layers=[4, 1])
    if kind == "attributedict":
        return TrainerAttributeDict(lr=0.1, layers=[4, 1])
    if kind == "omegaconf":
        from omegaconf import OmegaConf

        return OmegaConf.create({"lr": 0.1, "optim": {"momentum": 0.9}})
    raise ValueError(kind)


def kinds() -> list[str]:
    found = ["namespace", "fabric-attributedict", "attributedict"]
    try:
        import omegaconf  # noqa: F401
    except ImportError:
        return found
    return [*found, "omegaconf"]


class Model(L.LightningModule):
    def __init__(self, hp: Any = None) -> None:
        super().__init__()
        self.save_hyperparameters()
        torch.manual_seed(0)
        self.linear = torch.nn.Linear(4, 1)

    def training_step(self, batch: Any, index: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.linear(x), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


def data() -> Any:
    """One batch per epoch (see the module docstring), so epoch k ends at step k + 1."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(8, 4, generator=g), torch.randn(8, 1, generator=g)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)


class WeightsAt(L.Callback):
    """The weights once ``step`` optimizer steps are done: what ``step=<step>.ckpt`` holds."""

    def __init__(self, step: int) -> None:
        self.step = step
        self.weights: list[float] = []

    def on_train_batch_end(self, trainer: Any, module: Any, *args: Any) -> None:
        if trainer.global_step == self.step:
            self.weights = weights(module)


class ResumedAt(L.Callback):
    def on_train_start(self, trainer: Any, module: Any) -> None:
        self.step = trainer.global_step


def checkpoint_path(out: str, kind: str) -> str:
    return os.path.join(out, kind, f"step={HALF}.ckpt")


def trainer(out: str, steps: int, *callbacks: Any) -> Any:
    return L.Trainer(
        max_steps=steps,
        default_root_dir=out,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=any(
            isinstance(c, L.pytorch.callbacks.ModelCheckpoint) for c in callbacks
        ),
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=list(callbacks),
    )


def weights(model: Any) -> list[float]:
    return [
        round(float(v), 6) for v in torch.cat([p.detach().flatten() for p in model.parameters()])
    ]


def describe(value: Any) -> dict[str, Any]:
    """Type and plain content of a hyper-parameter object."""
    kind = f"{type(value).__module__}.{type(value).__qualname__}"
    if isinstance(value, argparse.Namespace):
        content: Any = vars(value)
    else:
        try:
            from omegaconf import DictConfig, OmegaConf

            if isinstance(value, DictConfig):
                content = OmegaConf.to_container(value)
            else:
                content = dict(value)
        except ImportError:
            content = dict(value)
    return {"type": kind, "content": content}


def save(out: str) -> dict[str, Any]:
    reference: dict[str, list[float]] = {}
    at_half: dict[str, list[float]] = {}
    hparams_type: dict[str, str] = {}
    for kind in kinds():
        model = Model(hyper_parameters(kind))
        every = L.pytorch.callbacks.ModelCheckpoint(
            dirpath=os.path.join(out, kind),
            filename="{step}",
            every_n_epochs=1,
            save_on_train_epoch_end=True,  # at each epoch's end (there is no validation loop)
            save_top_k=-1,
        )
        half = WeightsAt(HALF)
        trainer(out, STEPS, every, half).fit(model, data())
        reference[kind] = weights(model)
        at_half[kind] = half.weights
        hparams_type[kind] = describe(model.hparams)["type"]
        if not os.path.isfile(checkpoint_path(out, kind)):
            raise FileNotFoundError(
                f"no {checkpoint_path(out, kind)}: {os.listdir(os.path.join(out, kind))}"
            )
    content = torch.load(checkpoint_path(out, "namespace"), weights_only=False)  # our own file
    content["payload"] = Payload(os.path.join(out, "MARKER"))
    torch.save(content, os.path.join(out, "poisoned.ckpt"))
    return {
        "reference": reference,
        "at_half": at_half,
        "hparams_type": hparams_type,
        "saved": {k: describe(hyper_parameters(k)) for k in kinds()},
    }


def _attempt(step: Any) -> dict[str, Any]:
    try:
        return {"ok": True, **step()}
    except Exception as exc:
        return {
            "ok": False,
            "error_type": f"{type(exc).__module__}.{type(exc).__qualname__}",
            "error": str(exc),
            "notes": list(getattr(exc, "__notes__", [])),
            "refused": list(getattr(exc, "refused", ())),  # compatshim's refusals name them
            "traceback": traceback.format_exc()[-2000:],
        }


def resume(out: str) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for kind in kinds():
        path = checkpoint_path(out, kind)

        def fit(path: str = path, kind: str = kind) -> dict[str, Any]:
            at = ResumedAt()
            model = Model(hyper_parameters(kind))
            run = trainer(out, STEPS, at)
            run.fit(model, data(), ckpt_path=path)
            return {
                "resumed_at": at.step,
                "global_step": run.global_step,
                "weights": weights(model),
            }

        def load(path: str = path) -> dict[str, Any]:
            model = Model.load_from_checkpoint(path)
            return {
                "hp": describe(model.hparams["hp"]),
                "hparams_type": describe(model.hparams)["type"],
                "weights": weights(model),
            }

        results[kind] = {"fit": _attempt(fit), "load_from_checkpoint": _attempt(load)}
    poisoned, marker = os.path.join(out, "poisoned.ckpt"), os.path.join(out, "MARKER")

    def fit_poisoned() -> dict[str, Any]:
        trainer(out, STEPS).fit(Model(), data(), ckpt_path=poisoned)
        return {"loaded": True}

    def load_poisoned() -> dict[str, Any]:
        Model.load_from_checkpoint(poisoned)
        return {"loaded": True}

    results["poisoned"] = {}
    for step, call in (("fit", fit_poisoned), ("load_from_checkpoint", load_poisoned)):
        outcome = _attempt(call)
        outcome["payload_ran"] = os.path.exists(marker)
        if outcome["payload_ran"]:
            os.remove(marker)
        results["poisoned"][step] = outcome
    return results


def main() -> None:
    import warnings

    job_log.listen()
    caught: list[str] = []
    mode, out = sys.argv[1], sys.argv[2]
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        result = {"save": save, "resume": resume}[mode](out)
        caught = [
            f"{w.category.__name__}: {w.message}" for w in seen if "compatshim" in str(w.message)
        ]
    result["compatshim_warnings"] = caught
    result["retries"] = job_log.retries()
    result["compatshim_imported"] = job_log.compatshim_imported()
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
