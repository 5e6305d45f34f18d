"""Lightning 1.0.8 and 1.4.9 checkpoints resumed by today's Lightning: plain, armed, hardened.

Lightning < 1.5 keyed each callback's state by the callback's class, so these files name
``pytorch_lightning.callbacks.model_checkpoint.ModelCheckpoint`` (and, in 1.4.9's,
``...early_stopping.EarlyStopping``). Both are real files of Lightning's own legacy scripts
(``lightning_fixtures/``; ``make_fixture.sh`` says how): ``pl-1.0.8.ckpt`` as Lightning's
fixtures for 1.0-1.3 were made (``legacy/zero_training.py``, torch 1.4: the legacy non-zip
format), ``pl-1.4.9.ckpt`` by 1.4.9's ``simple_classif_training.py`` (zip format). Lightning
2.x still lists 1.0.0 onwards as back-compatible and looks such a state up by
``type(callback)``; its loader reads the file inside ``pl_legacy_patch``, which redirects
``pytorch_lightning`` names to ``lightning.pytorch``.

- plain: torch >= 2.6 loads weights-only by default and refuses the class, so
  ``Trainer.fit(ckpt_path=...)`` fails unless the user sets ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1``
  (Lightning's own test does): the reference run below.
- armed and hardened: compatshim's loader admits the stateful built-in callback classes of
  1.0-1.4 as values (never called) and reads them where Lightning's loader does, so the
  resume restores the callbacks' state (EarlyStopping's counters, ModelCheckpoint's best
  model) and the scheduler's as the unsafe load does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("lightning")
pytest.importorskip("torch")

from tests.checkpoint.test_hardened import TIMEOUT_S, run_child

from .child_kit import run_modes
from .jobs import torch_loads_weights_only_by_default

pytestmark = pytest.mark.timeout(2 * (4 * TIMEOUT_S + 60))

FIXTURES = Path(__file__).resolve().parent / "lightning_fixtures"

CHILD = r"""
import json, sys, warnings

import torch
import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback, EarlyStopping, ModelCheckpoint
from lightning.pytorch.utilities.migration import pl_legacy_patch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from child_kit import digest

folder, fixture, release = sys.argv[1], sys.argv[2], sys.argv[3]
warnings.simplefilter("ignore")


class ClassificationModel(pl.LightningModule):
    # the layers of the 1.4.9 legacy script's model (its metrics hold no state)
    def __init__(self):
        super().__init__()
        for i in range(3):
            setattr(self, f"layer_{i}", nn.Linear(24, 24))
        self.layer_end = nn.Linear(24, 3)

    def forward(self, x):
        for i in range(3):
            x = torch.relu(getattr(self, f"layer_{i}")(x))
        return F.softmax(self.layer_end(x), dim=1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_acc", (self(x).argmax(1) == y).float().mean())

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.01)


class DummyModel(pl.LightningModule):
    # legacy/zero_training.py of Lightning 1.1-1.3 (1.0's fixtures were made with it)
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(32, 2)

    def training_step(self, batch, batch_idx):
        return F.mse_loss(self.layer(batch[0]), torch.ones(len(batch[0]), 2))

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.layer.parameters(), lr=0.1)
        return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)]


def number(value):
    return float(value) if value is not None and hasattr(value, "item") else value


def observe(trainer, module):
    seen = {"epoch": trainer.current_epoch, "global_step": trainer.global_step,
            "weights": digest(module.state_dict()),
            "schedulers": [c.scheduler.state_dict() for c in trainer.lr_scheduler_configs]}
    for c in trainer.callbacks:
        if isinstance(c, EarlyStopping):
            seen["early_stopping"] = {"wait_count": c.wait_count,
                                      "best_score": number(c.best_score), "patience": c.patience}
        if isinstance(c, ModelCheckpoint):
            seen["model_checkpoint"] = {"best_model_path": c.best_model_path,
                                        "best_model_score": number(c.best_model_score)}
    return seen


class AtStart(Callback):
    def on_train_start(self, trainer, module):
        self.seen = observe(trainer, module)


def resume():
    torch.manual_seed(0)
    start = AtStart()
    if release == "1.4.9":
        model, features, epochs = ClassificationModel(), 24, 11
        callbacks = [EarlyStopping(monitor="val_acc", mode="max", min_delta=0.005), start]
    else:
        model, features, epochs = DummyModel(), 32, 6
        callbacks = [start]
    data = TensorDataset(torch.randn(64, features), torch.randint(0, 3, (64,)))
    trainer = pl.Trainer(
        default_root_dir=folder, accelerator="cpu", devices=1, max_epochs=epochs,
        callbacks=callbacks, enable_progress_bar=False, enable_model_summary=False, logger=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(model, DataLoader(data, batch_size=32),
                DataLoader(data, batch_size=32) if release == "1.4.9" else None,
                ckpt_path=fixture)
    return {"ok": True, **start.seen, "epochs_run": trainer.current_epoch}


result = {"hardened": getattr(torch.load, "__compatshim_hardened__", None)}
try:
    result["resume"] = resume()
except Exception as exc:
    kind = type(exc)
    result["resume"] = {"ok": False, "error_type": f"{kind.__module__}.{kind.__qualname__}",
                        "error": str(exc)[:2000]}
with pl_legacy_patch():  # as Lightning's loader reads it: the classes of lightning.pytorch
    loaded = torch.load(fixture, weights_only=False)
result["keys"] = [f"{k.__module__}.{k.__qualname__}" for k in loaded["callbacks"]]
result["stored"] = {
    "weights": digest(loaded["state_dict"]),
    "callbacks": {k.__name__: {n: number(v) for n, v in state.items()}
                  for k, state in loaded["callbacks"].items()},
    "schedulers": loaded["lr_schedulers"],
}
print("RESULT " + json.dumps(result))
"""

CASES = {
    "1.0.8": {  # torch 1.4's legacy format; the oldest release Lightning 2.x calls back-compatible
        "keys": ["lightning.pytorch.callbacks.model_checkpoint.ModelCheckpoint"],
        "refused": "ModelCheckpoint",
    },
    "1.4.9": {
        "keys": [
            "lightning.pytorch.callbacks.early_stopping.EarlyStopping",
            "lightning.pytorch.callbacks.model_checkpoint.ModelCheckpoint",
        ],
        "refused": "EarlyStopping",
    },
}


@pytest.fixture(scope="module", params=sorted(CASES))
def runs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    release = request.param
    folder = tmp_path_factory.mktemp(f"legacy-{release}")
    fixture = FIXTURES / f"pl-{release}.ckpt"
    source = CHILD.replace("sys.argv[2], sys.argv[3]", f"{str(fixture)!r}, {release!r}")
    found = run_modes(folder, "legacy_child.py", source)
    (folder / "unsafe").mkdir()
    found["unsafe"] = run_child(  # Lightning's own recipe for < 1.5 files, compatshim off
        folder / "legacy_child.py",
        str(folder / "unsafe"),
        COMPATSHIM_AUTO="0",
        COMPATSHIM_SAFE_LOAD="0",
        TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD="1",
    )
    found["release"] = release
    return found


def test_the_unsafe_load_restores_the_callback_state(runs: dict[str, Any]) -> None:
    """The reference: Lightning's own recipe restores the stored callback state and weights."""
    unsafe, case = runs["unsafe"], CASES[runs["release"]]
    resumed, stored = unsafe["resume"], unsafe["stored"]
    assert resumed["ok"], (resumed, unsafe["stderr"][-3000:])
    assert unsafe["keys"] == case["keys"]
    assert resumed["weights"] == stored["weights"]
    assert len(resumed["schedulers"]) == len(stored["schedulers"])
    for now, then in zip(resumed["schedulers"], stored["schedulers"]):
        assert {k: now[k] for k in then} == then  # newer torch adds fields ("_is_initial")
    best = stored["callbacks"]["ModelCheckpoint"]["best_model_path"]
    assert best.endswith(".ckpt")  # not a fresh callback's ""
    assert resumed["model_checkpoint"]["best_model_path"] == best
    if "EarlyStopping" in stored["callbacks"]:
        assert stored["callbacks"]["EarlyStopping"]["wait_count"] == 3  # not a fresh one's 0
        assert resumed["early_stopping"]["wait_count"] == 3


def test_plain_torch_refuses_the_callback_class(runs: dict[str, Any]) -> None:
    plain = runs["plain"]["resume"]
    if not torch_loads_weights_only_by_default():
        pytest.skip("this torch loads with the full unpickler by default")
    assert not plain["ok"] and plain["error_type"] == "_pickle.UnpicklingError", plain
    assert CASES[runs["release"]]["refused"] in plain["error"]


@pytest.mark.parametrize("mode", ["armed", "hardened"])
def test_compatshim_resumes_it_as_the_unsafe_load_does(runs: dict[str, Any], mode: str) -> None:
    result, unsafe = runs[mode], runs["unsafe"]
    assert result["hardened"] is (mode == "hardened")
    assert result["resume"]["ok"], (result["resume"], result["stderr"][-3000:])
    assert result["resume"] == unsafe["resume"]
    assert "refused" not in result["stderr"]


@pytest.mark.parametrize(
    "call",
    [
        b"X\x03\x00\x00\x00accq\x00\x85R.",  # EarlyStopping("acc"): REDUCE on the class
        b")\x81.",  # NEWOBJ: an instance made without the file's arguments checked
    ],
)
def test_a_file_cannot_call_the_callback_class(call: bytes) -> None:
    """The rows admit the classes as values only: a file that calls one is refused."""
    import io

    from compatshim.checkpoint import UnsafeCheckpointError, load

    pickled = b"\x80\x02cpytorch_lightning.callbacks.early_stopping\nEarlyStopping\n" + call
    with pytest.raises(UnsafeCheckpointError, match="EarlyStopping"):
        load(io.BytesIO(pickled))
