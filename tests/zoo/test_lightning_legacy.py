"""A PyTorch Lightning 1.4.9 checkpoint resumed by today's Lightning: plain, armed, hardened.

Lightning < 1.5 keyed each callback's state by the callback's class, so the file names
``pytorch_lightning.callbacks.early_stopping.EarlyStopping`` and ``...ModelCheckpoint``
(``lightning_fixtures/pl-1.4.9.ckpt``, written by Lightning 1.4.9's own legacy script;
``make_fixture.sh`` says how). Lightning 2.x still lists 1.4.x as back-compatible and
looks such a state up by ``type(callback)``; its loader reads the file inside
``pl_legacy_patch``, which redirects ``pytorch_lightning`` names to ``lightning.pytorch``.

- plain: torch >= 2.6 loads weights-only by default and refuses the class, so
  ``Trainer.fit(ckpt_path=...)`` fails unless the user sets ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1``
  (Lightning's own test does): the reference run below.
- armed and hardened: compatshim's loader admits the stateful built-in callback classes of
  1.0-1.4 as values (never called) and reads them where Lightning's loader does, so the
  resume restores EarlyStopping's counters as the unsafe load does.
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

pytestmark = pytest.mark.timeout(4 * TIMEOUT_S + 60)

FIXTURE = Path(__file__).resolve().parent / "lightning_fixtures" / "pl-1.4.9.ckpt"

CHILD = r"""
import json, sys, warnings

import torch
import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback, EarlyStopping
from lightning.pytorch.utilities.migration import pl_legacy_patch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from child_kit import digest

folder, fixture = sys.argv[1], sys.argv[2]
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


class AtStart(Callback):
    def on_train_start(self, trainer, module):
        stop = next(c for c in trainer.callbacks if isinstance(c, EarlyStopping))
        self.seen = {
            "epoch": trainer.current_epoch,
            "global_step": trainer.global_step,
            "weights": digest(module.state_dict()),
            "early_stopping": {"wait_count": stop.wait_count, "best_score": float(stop.best_score),
                               "patience": stop.patience},
        }


def resume():
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 24), torch.randint(0, 3, (64,)))
    start = AtStart()
    trainer = pl.Trainer(
        default_root_dir=folder, accelerator="cpu", devices=1, max_epochs=11,
        callbacks=[EarlyStopping(monitor="val_acc", mode="max", min_delta=0.005), start],
        enable_progress_bar=False, enable_model_summary=False, logger=False,
    )
    trainer.fit(ClassificationModel(), DataLoader(data, batch_size=32),
                DataLoader(data, batch_size=32), ckpt_path=fixture)
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
keys = [f"{k.__module__}.{k.__qualname__}" for k in loaded["callbacks"]]
result["keys"] = keys
stopping = next(v for k, v in loaded["callbacks"].items() if k.__name__ == "EarlyStopping")
result["stored"] = {"weights": digest(loaded["state_dict"]),
                    "early_stopping": {k: float(v) if hasattr(v, "item") else v
                                       for k, v in stopping.items()}}
print("RESULT " + json.dumps(result))
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("legacy")
    found = run_modes(folder, "legacy_child.py", CHILD.replace("sys.argv[2]", repr(str(FIXTURE))))
    (folder / "unsafe").mkdir()
    found["unsafe"] = run_child(  # Lightning's own recipe for < 1.5 files, compatshim off
        folder / "legacy_child.py",
        str(folder / "unsafe"),
        COMPATSHIM_AUTO="0",
        COMPATSHIM_SAFE_LOAD="0",
        TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD="1",
    )
    return found


def test_the_unsafe_load_restores_the_callback_state(runs: dict[str, Any]) -> None:
    """The reference: Lightning's own recipe restores the 1.4.9 counters and weights."""
    unsafe = runs["unsafe"]
    assert unsafe["resume"]["ok"], (unsafe["resume"], unsafe["stderr"][-3000:])
    assert unsafe["keys"] == [
        "lightning.pytorch.callbacks.early_stopping.EarlyStopping",
        "lightning.pytorch.callbacks.model_checkpoint.ModelCheckpoint",
    ]
    stored = unsafe["stored"]
    assert stored["early_stopping"]["wait_count"] == 3  # not a fresh callback's 0
    assert unsafe["resume"]["early_stopping"]["wait_count"] == 3
    assert unsafe["resume"]["weights"] == stored["weights"]


def test_plain_torch_refuses_the_callback_class(runs: dict[str, Any]) -> None:
    plain = runs["plain"]["resume"]
    if not torch_loads_weights_only_by_default():
        pytest.skip("this torch loads with the full unpickler by default")
    assert not plain["ok"] and plain["error_type"] == "_pickle.UnpicklingError", plain
    assert "EarlyStopping" in plain["error"]


@pytest.mark.parametrize("mode", ["armed", "hardened"])
def test_compatshim_resumes_it_as_the_unsafe_load_does(runs: dict[str, Any], mode: str) -> None:
    result, unsafe = runs[mode], runs["unsafe"]
    assert result["hardened"] is (mode == "hardened")
    assert result["resume"]["ok"], (result["resume"], result["stderr"][-3000:])
    for field in ("epoch", "global_step", "weights", "early_stopping", "epochs_run"):
        assert result["resume"][field] == unsafe["resume"][field], field
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
