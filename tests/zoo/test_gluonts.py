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

GluonTS 0.16 loads armed and hardened: the shape is read by the allowlist's
``new-of-listed-class`` rule (``_partial.py``) as NEWOBJ of ``StudentTOutput``
(an ``instance`` row for GluonTS 0.16): no partial is made, its function must
be ``object.__new__`` (the ``builtins.object.__new__`` row, read through
``getattr``), the class a plain-instance row, keyword arguments and the
instance's state plain data, and it is never a value of the result. Why no
gadget: the file chooses nothing that runs (the function is fixed, the class
already on the table, ``object.__new__`` ignores the keywords, and no class or
function can land in the state to shadow a method); the attacks are in
tests/checkpoint/test_partial.py. Here the hyper-parameters GluonTS reads back
armed and hardened equal those of a plain ``weights_only=False`` load, and a
copy of the checkpoint carrying a payload stays refused.
"""

from __future__ import annotations

from importlib.metadata import version
from typing import Any

import pytest

pytest.importorskip("gluonts.torch")
torch = pytest.importorskip("torch")

from tests.checkpoint.test_hardened import TIMEOUT_S  # noqa: E402

from .child_kit import MODES, run_modes  # noqa: E402
from .jobs import torch_loads_weights_only_by_default  # noqa: E402

pytestmark = pytest.mark.timeout(3 * TIMEOUT_S + 60)

CHILD = r"""
import json, logging, os, shutil, sys, warnings

import numpy as np
import pandas as pd
import torch
import gluonts
from gluonts.dataset.common import ListDataset
from gluonts.torch.model.deepar import DeepAREstimator
from gluonts.torch.model.predictor import PyTorchPredictor
from child_kit import Payload, digest

warnings.simplefilter("ignore")
folder = sys.argv[1]
marker = os.path.join(folder, "MARKER")



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


def hparams(value):  # hyper-parameters as plain text: types and attributes, every level
    if isinstance(value, dict):
        return [type(value).__name__, {k: hparams(v) for k, v in value.items()}]
    if isinstance(value, (list, tuple)):
        return [type(value).__name__, [hparams(v) for v in value]]
    if hasattr(value, "__dict__") and not isinstance(value, type):
        return [f"{type(value).__module__}.{type(value).__qualname__}", hparams(vars(value))]
    return [type(value).__name__, repr(value)]


def train():
    out = estimator.train_model(data)  # writes the checkpoint and reads the best one back
    trained["predictor"] = out.predictor
    best = out.trainer.checkpoint_callback.best_model_path
    trained["best"] = best
    saved = torch.load(best, map_location="cpu", weights_only=False)  # our own file
    return {"best": os.path.basename(best), "global_step": saved["global_step"],
            "has_hparams": "hyper_parameters" in saved,
            "hparams_unsafe": hparams(saved.get("hyper_parameters")),
            "hparams_read_back": hparams(dict(out.trained_net.hparams)),
            "weights_from_checkpoint": digest(out.trained_net.state_dict())
                                       == digest(saved["state_dict"])}


def load_best():  # the best checkpoint read back by torch.load, as GluonTS 0.16 calls it
    loaded = torch.load(trained["best"], map_location="cpu")
    return {"hparams": hparams(loaded.get("hyper_parameters"))}


result["train"] = attempt(train)
if result["train"]["ok"]:
    result["load_best"] = attempt(load_best)
    poisoned_ckpt = os.path.join(folder, "poisoned.ckpt")
    checkpoint = torch.load(trained["best"], map_location="cpu", weights_only=False)
    checkpoint.setdefault("hyper_parameters", {})["payload"] = Payload(marker)  # 0.17: none
    torch.save(checkpoint, poisoned_ckpt)
    result["poisoned_ckpt"] = attempt(
        lambda: {"loaded": torch.load(poisoned_ckpt, map_location="cpu", weights_only=True)
                 is not None})
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
    state["payload"] = Payload(marker)
    torch.save(state, state_file)
    result["poisoned"] = attempt(lambda: {"loaded": deserialize(poisoned) is not None})
result["marker"] = os.path.exists(marker)
print("RESULT " + json.dumps(result))
"""


def partial_in_hparams() -> bool:
    """GluonTS < 0.17 keeps hyper-parameters (``functools.partial``) and reads them back."""
    major, minor = (int(p) for p in version("gluonts").split(".")[:2])
    return (major, minor) < (0, 17)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return run_modes(tmp_path_factory.mktemp("gluonts"), "gluonts_child.py", CHILD)


@pytest.mark.parametrize("mode", list(MODES))
def test_gluonts_trains_and_reloads_its_own_files(runs: dict[str, Any], mode: str) -> None:
    result = runs[mode]
    assert result["hardened"] is {"plain": None, "armed": False, "hardened": True}[mode]
    train = result["train"]
    if mode == "plain" and partial_in_hparams() and torch_loads_weights_only_by_default():
        # what users see: torch's weights-only default refuses functools.partial
        assert not train["ok"] and "functools.partial" in train["error"], train
        assert train["error_type"].endswith("UnpicklingError")
        return
    assert train["ok"], (train, result["stderr"][-3000:])
    assert train["weights_from_checkpoint"] and train["global_step"] in (2, 4)  # the best epoch
    assert train["has_hparams"] is partial_in_hparams()
    if partial_in_hparams():  # the same hyper-parameters as the plain unsafe load, same types
        assert result["load_best"] == {"ok": True, "hparams": train["hparams_unsafe"]}
        head = train["hparams_unsafe"][1]["model_kwargs"][1]["distr_output"]
        assert head[0] == "gluonts.torch.distributions.studentT.StudentTOutput", head
        assert train["hparams_read_back"] == train["hparams_unsafe"]
    loaded = result["deserialize"]
    assert loaded["ok"], loaded
    assert loaded == {"ok": True, **result["saved"]}  # exact weights; settings, same types


def test_poisoned_checkpoint_is_refused(runs: dict[str, Any]) -> None:
    """The training checkpoint with a payload in its hyper-parameters: refused armed and
    hardened, naming the payload, and never run."""
    for mode in ("armed", "hardened"):
        result = runs[mode]
        if "poisoned_ckpt" not in result:
            continue
        poisoned = result["poisoned_ckpt"]
        assert not poisoned["ok"], mode
        assert set(poisoned["refused"]) & {"os.system", "posix.system"}, (mode, poisoned)
        assert not result["marker"], mode


def test_poisoned_predictor_state_is_refused(runs: dict[str, Any]) -> None:
    """GluonTS passes ``weights_only=True`` here: refused in every mode, never run."""
    for mode, result in runs.items():
        if "poisoned" not in result:  # plain torch 2.6+ with 0.16: train_model refused
            continue
        poisoned = result["poisoned"]
        assert not poisoned["ok"], mode
        if mode != "hardened":
            assert poisoned["error_type"] == "_pickle.UnpicklingError", (mode, poisoned)
        else:
            assert poisoned["error_type"] == "compatshim.checkpoint.errors.UnsafeCheckpointError"
            assert poisoned["refused"][0] in ("os.system", "posix.system")
        assert not result["marker"], mode
