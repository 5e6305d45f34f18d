"""GluonTS (``gluonts.torch``) trains, checkpoints and reloads through its own paths.

Why GluonTS: ``DeepAREstimator.train_model`` itself fails on torch 2.6+ with
"Weights only load failed ... Unsupported global: GLOBAL functools.partial"
(awslabs/gluonts#3269): its ``ModelCheckpoint`` keeps the module's
hyper-parameters, where each ``@validated`` object (the ``StudentTOutput``
distribution head) pickles as ``functools.partial(getattr(object,
'__new__'), StudentTOutput, **init_args)()``, and 0.16 reads the best
checkpoint back with Lightning's ``load_from_checkpoint``. 0.17 saves weights
only and reads them with ``torch.load(weights_only=True)``.

Each mode runs one fresh interpreter (plain ``COMPATSHIM_AUTO=0``, armed,
hardened): ``train_model`` (its checkpoint written and read back by GluonTS),
then ``PyTorchPredictor.serialize`` / ``deserialize`` (``torch.load`` of
``prediction-net-state.pt``): weights exact, the predictor's settings equal
and of the same types. A copy of the serialized predictor whose state file
carries a payload is refused and the payload never runs.

GluonTS 0.16 stays refused armed and hardened, by design for now: allowing
``functools.partial`` lets a file return a callable bound to arguments that no
check saw, run whenever the application calls it (the issue's "live callables
returned as data"), and ``getattr(object, '__new__')`` is a dunder the
``method-of-listed-class`` rule refuses. Loading it safely takes an argument
rule "``partial(object.__new__, <listed class>, **plain data)`` called at once
with no arguments" (it then stands for NEWOBJ of a listed class) and an
``instance`` row for each distribution output; the tests pin today's refusal.
"""

from __future__ import annotations

from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("gluonts.torch")
torch = pytest.importorskip("torch")

from checkpoint.test_hardened import TIMEOUT_S, run_child  # noqa: E402

from .jobs import torch_loads_weights_only_by_default  # noqa: E402

pytestmark = pytest.mark.timeout(3 * TIMEOUT_S + 60)

CHILD = r"""
import hashlib, json, logging, os, shutil, sys, warnings

import numpy as np
import pandas as pd
import torch
import gluonts
from gluonts.dataset.common import ListDataset
from gluonts.torch.model.deepar import DeepAREstimator
from gluonts.torch.model.predictor import PyTorchPredictor

warnings.simplefilter("ignore")
folder = sys.argv[1]
marker = os.path.join(folder, "MARKER")


class Payload:
    def __reduce__(self):
        return (os.system, (f"touch {marker}",))


def digest(tensors):
    out = {}
    for key, value in tensors.items():
        data = value.detach().cpu().contiguous().numpy().tobytes()
        out[key] = [str(value.dtype), list(value.shape), hashlib.sha256(data).hexdigest()]
    return out


def settings(predictor):
    net = predictor.prediction_net.model
    return {k: [type(v).__name__, repr(v)] for k, v in {
        "prediction_length": predictor.prediction_length,
        "batch_size": predictor.batch_size,
        "context_length": net.context_length,
        "distr_output": net.distr_output,
        "num_parallel_samples": net.num_parallel_samples,
    }.items()}


def attempt(step):
    try:
        return {"ok": True, **step()}
    except Exception as exc:
        return {"ok": False, "error_type": f"{type(exc).__module__}.{type(exc).__qualname__}",
                "refused": list(getattr(exc, "refused", ())), "error": str(exc)[:2000]}


result = {"gluonts": gluonts.__version__,
          "hardened": getattr(torch.load, "__compatshim_hardened__", None)}
torch.manual_seed(0)
target = np.sin(np.arange(60) / 3).astype("float32")
data = ListDataset([{"start": pd.Period("2020-01-01", freq="D"), "target": target}], freq="D")
estimator = DeepAREstimator(
    freq="D", prediction_length=4, context_length=8, num_layers=1, hidden_size=4,
    batch_size=4, num_batches_per_epoch=2,
    trainer_kwargs={"max_epochs": 2, "accelerator": "cpu", "logger": False,
                    "enable_progress_bar": False, "enable_model_summary": False,
                    "default_root_dir": folder},
)
trained = {}


def train():
    out = estimator.train_model(data)  # writes the checkpoint and reads the best one back
    trained["predictor"] = out.predictor
    best = out.trainer.checkpoint_callback.best_model_path
    saved = torch.load(best, map_location="cpu", weights_only=False)  # our own file
    return {"best": os.path.basename(best), "global_step": saved["global_step"],
            "has_hparams": "hyper_parameters" in saved,
            "weights_from_checkpoint": digest(out.trained_net.state_dict())
                                       == digest(saved["state_dict"])}


result["train"] = attempt(train)
if result["train"]["ok"]:
    predictor = trained["predictor"]
    where = os.path.join(folder, "predictor")
    os.makedirs(where)
    predictor.serialize(__import__("pathlib").Path(where))
    result["saved"] = {"weights": digest(predictor.prediction_net.state_dict()),
                       "settings": settings(predictor)}

    def deserialize(path=where):
        back = PyTorchPredictor.deserialize(__import__("pathlib").Path(path), device="cpu")
        return {"weights": digest(back.prediction_net.state_dict()), "settings": settings(back)}

    result["deserialize"] = attempt(deserialize)
    poisoned = os.path.join(folder, "poisoned")
    shutil.copytree(where, poisoned)
    state_file = os.path.join(poisoned, "prediction-net-state.pt")
    state = torch.load(state_file, weights_only=True)
    state["payload"] = Payload()
    torch.save(state, state_file)
    result["poisoned"] = attempt(lambda: {"loaded": deserialize(poisoned) is not None})
result["marker"] = os.path.exists(marker)
print("RESULT " + json.dumps(result))
"""

MODES = {
    "plain": {"COMPATSHIM_AUTO": "0", "COMPATSHIM_SAFE_LOAD": "0"},
    "armed": {"COMPATSHIM_SAFE_LOAD": "0"},
    "hardened": {},
}


def partial_in_hparams() -> bool:
    """GluonTS < 0.17 keeps hyper-parameters (``functools.partial``) and reads them back."""
    major, minor = (int(p) for p in version("gluonts").split(".")[:2])
    return (major, minor) < (0, 17)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder: Path = tmp_path_factory.mktemp("gluonts")
    script = folder / "gluonts_child.py"
    script.write_text(CHILD)
    found = {}
    for mode, env in MODES.items():
        (folder / mode).mkdir()
        found[mode] = run_child(script, str(folder / mode), **env)
    return found


@pytest.mark.parametrize("mode", list(MODES))
def test_gluonts_trains_and_reloads_its_own_files(runs: dict[str, Any], mode: str) -> None:
    result = runs[mode]
    assert result["hardened"] is {"plain": None, "armed": False, "hardened": True}[mode]
    train = result["train"]
    if partial_in_hparams() and (mode != "plain" or torch_loads_weights_only_by_default()):
        # the refusal pinned in the module docstring: functools.partial, named
        assert not train["ok"] and "functools.partial" in train["error"], train
        assert train["error_type"].endswith(("UnpicklingError", "UnsafeCheckpointError"))
        return
    assert train["ok"], (train, result["stderr"][-3000:])
    assert train["weights_from_checkpoint"] and train["global_step"] in (2, 4)  # the best epoch
    assert train["has_hparams"] is partial_in_hparams()
    loaded = result["deserialize"]
    assert loaded["ok"], loaded
    assert loaded == {"ok": True, **result["saved"]}  # exact weights; settings, same types


def test_poisoned_predictor_state_is_refused(runs: dict[str, Any]) -> None:
    """GluonTS passes ``weights_only=True`` here: refused in every mode, never run."""
    for mode, result in runs.items():
        if "poisoned" not in result:  # 0.16: train_model refused before a predictor existed
            continue
        poisoned = result["poisoned"]
        assert not poisoned["ok"], mode
        if mode != "hardened":
            assert poisoned["error_type"] == "_pickle.UnpicklingError", (mode, poisoned)
        else:
            assert poisoned["error_type"] == "compatshim.checkpoint.errors.UnsafeCheckpointError"
            assert poisoned["refused"][0] in ("os.system", "posix.system")
        assert not result["marker"], mode
