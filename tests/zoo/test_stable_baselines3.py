"""stable-baselines3's own ``model.save`` zip through its own ``PPO.load``: plain, armed, hardened.

Why SB3: its users hit "Weights only load failed" in ``load_from_zip_file``
(DLR-RM/stable-baselines3#1911, SB3 2.3.0 with ``weights_only=True``), and the
hotfix (DLR-RM/stable-baselines3#1913, shipped in 2.3.2) went back to
``th.load(..., weights_only=False)``: from 2.3.2 until SB3 passed
``weights_only=True`` again, every ``PPO.load`` of a file someone shared runs
any code the file holds. The zip's ``policy.pth`` and
``policy.optimizer.pth`` are written by ``th.save`` in ``save_to_zip_file``.

Each mode runs one fresh interpreter (``COMPATSHIM_AUTO=0`` plain,
``COMPATSHIM_AUTO=1`` armed, plus ``COMPATSHIM_SAFE_LOAD=1`` hardened): PPO
trains 64 steps on CartPole and saves; ``PPO.load`` must give the same policy
and Adam state (exact bytes), the step and update counters and the
hyper-parameters (same values, same types); ``learn(reset_num_timesteps=False)``
continues the counters. A copy whose ``policy.pth`` carries a payload must be
refused in hardened mode, with the payload never run; plain and armed, the
release's own ``weights_only`` decides (detected from SB3's source).
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("stable_baselines3")
torch = pytest.importorskip("torch")

from tests.checkpoint.test_hardened import TIMEOUT_S  # noqa: E402

from .child_kit import MODES, run_modes  # noqa: E402
from .jobs import torch_loads_weights_only_by_default  # noqa: E402

pytestmark = pytest.mark.timeout(3 * TIMEOUT_S + 60)

CHILD = r"""
import inspect, io, json, os, sys, zipfile

import torch
import stable_baselines3
from stable_baselines3 import PPO
from stable_baselines3.common import save_util
from stable_baselines3.common.env_util import make_vec_env
from child_kit import Payload, digest

folder = sys.argv[1]
marker = os.path.join(folder, "MARKER")
# learn() makes a log folder; without SB3_LOGDIR, a new one under /tmp every call, never removed
os.environ["SB3_LOGDIR"] = os.path.join(folder, "sb3-log")



HPARAMS = ("learning_rate", "gamma", "gae_lambda", "n_steps", "batch_size", "n_epochs",
           "ent_coef", "seed")


def state(model):
    return {
        "policy": digest(model.policy.state_dict()),
        "optimizer": digest(model.policy.optimizer.state_dict()),
        "num_timesteps": model.num_timesteps,
        "updates": model._n_updates,
        "hparams": {k: [type(getattr(model, k)).__name__, getattr(model, k)] for k in HPARAMS},
        "clip_range": model.clip_range(1.0),
    }


def attempt(step):
    try:
        return {"ok": True, **step()}
    except Exception as exc:
        return {"ok": False, "error_type": f"{type(exc).__module__}.{type(exc).__qualname__}",
                "refused": list(getattr(exc, "refused", ())), "error": str(exc)[:2000]}


source = inspect.getsource(save_util.load_from_zip_file)
result = {
    "sb3": stable_baselines3.__version__,
    "hardened": getattr(torch.load, "__compatshim_hardened__", None),  # None: not armed
    "sb3_weights_only": "weights_only=True" in source and "weights_only=False" not in source,
}
model = PPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=16, n_epochs=2, gamma=0.97,
            learning_rate=1e-3, seed=0, device="cpu")
model.learn(64)
path = os.path.join(folder, "ppo.zip")
model.save(path)
result["saved"] = state(model)


def resume():
    loaded = PPO.load(path, device="cpu")
    at_load = state(loaded)
    loaded.set_env(make_vec_env("CartPole-v1", n_envs=1, seed=1))
    loaded.learn(64, reset_num_timesteps=False)
    return {"at_load": at_load, "num_timesteps": loaded.num_timesteps,
            "updates": loaded._n_updates}


result["clean"] = attempt(resume)

poisoned = os.path.join(folder, "poisoned.zip")
with zipfile.ZipFile(path) as src, zipfile.ZipFile(poisoned, "w") as dst:
    for name in src.namelist():
        data = src.read(name)
        if name == "policy.pth":
            content = torch.load(io.BytesIO(data), weights_only=True)
            content["payload"] = Payload(marker)
            buffer = io.BytesIO()
            torch.save(content, buffer)
            data = buffer.getvalue()
        dst.writestr(name, data)
result["poisoned"] = attempt(lambda: {"loaded": PPO.load(poisoned, device="cpu") is not None})
result["marker"] = os.path.exists(marker)
print("RESULT " + json.dumps(result))
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return run_modes(tmp_path_factory.mktemp("sb3"), "sb3_child.py", CHILD)


def _resumed_as_saved(result: dict[str, Any]) -> None:
    clean = result["clean"]
    assert clean["ok"], (clean, result["stderr"][-3000:])
    assert clean["at_load"] == result["saved"]  # weights, Adam moments, counters, hparams+types
    assert result["saved"]["num_timesteps"] == 64
    assert clean["num_timesteps"] == 128  # learn(reset_num_timesteps=False) continued
    assert clean["updates"] == 2 * result["saved"]["updates"]


@pytest.mark.parametrize("mode", list(MODES))
def test_sb3_load_resumes_its_own_zip(runs: dict[str, Any], mode: str) -> None:
    result = runs[mode]
    assert result["hardened"] is {"plain": None, "armed": False, "hardened": True}[mode]
    _resumed_as_saved(result)


@pytest.mark.parametrize("mode", ["plain", "armed"])
def test_poisoned_zip_plain_and_armed_as_sb3_loads_it(runs: dict[str, Any], mode: str) -> None:
    """SB3 2.3.2+ passing ``weights_only=False`` runs the payload; compatshim armed leaves it."""
    result = runs[mode]
    if result["sb3_weights_only"]:
        assert not result["poisoned"]["ok"] and not result["marker"]
        assert result["poisoned"]["error_type"] == "_pickle.UnpicklingError"
    else:  # documented: only hardened mode intercepts a weights_only=False load
        assert result["marker"]  # the payload ran inside th.load; SB3 failed only afterwards
        assert result["poisoned"]["ok"] or "payload" in result["poisoned"]["error"]


def test_hardened_refuses_the_poisoned_zip(runs: dict[str, Any]) -> None:
    result = runs["hardened"]
    poisoned = result["poisoned"]
    assert not poisoned["ok"], poisoned
    if torch_loads_weights_only_by_default() or not result["sb3_weights_only"]:
        assert poisoned["error_type"] == "compatshim.checkpoint.errors.UnsafeCheckpointError"
        assert poisoned["refused"] and poisoned["refused"][0] in ("os.system", "posix.system")
    assert not result["marker"]
