"""DeepSpeed's own checkpoints in hardened mode (``COMPATSHIM_SAFE_LOAD=1``).

DeepSpeed's default checkpoint engine (``TorchCheckpointEngine``) loads with
``torch.load(..., weights_only=False)``: armed only, a poisoned checkpoint runs
its payload. Hardened, the engine resumes its own clean checkpoint and a
poisoned copy is refused. The engine runs for real on DeepSpeed's CPU
accelerator (``DS_ACCELERATOR=cpu``, one rank over gloo), in a fresh interpreter
started the way a user's job starts.

Both engines DeepSpeed 0.19 can run here: the default ``TorchCheckpointEngine``
and ``FastCheckpointEngine`` (its python writer; plain ``torch.load``). Not the
``DecoupledCheckpointEngine``: its checkpoint process initialises
torch.distributed again on ``MASTER_PORT`` (EADDRINUSE) in a one-process run;
it loads with the same plain ``torch.load`` as ``FastCheckpointEngine``.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("deepspeed")
torch = pytest.importorskip("torch")

from tests.checkpoint.test_hardened import TIMEOUT_S, run_child  # noqa: E402

from .child_kit import write_child  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(TIMEOUT_S + 60)]

CHILD = r"""
import json, os, shutil, sys, pickle

folder, engine_kind, port = sys.argv[1], sys.argv[2], sys.argv[3]
os.environ.update(DS_ACCELERATOR="cpu", MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
                  RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", CROSS_RANK="0", CROSS_SIZE="1")
import torch
import deepspeed
from child_kit import Payload

# One rank needs no shared-memory collectives: take the path DeepSpeed takes where its shm op
# cannot be built (no compiler), not a 60 s C++ build into a cache other envs' builds replace.
deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False

marker = os.path.join(folder, "MARKER")


torch.manual_seed(0)
model = torch.nn.Linear(4, 2)
config = {"train_batch_size": 1, "zero_optimization": {"stage": 0}}
if engine_kind != "torch":  # data_parallel unset: AttributeError in DeepSpeed 0.19.8's writer
    writer = {"type": "python", "decoupled": engine_kind == "decoupled", "data_parallel": "replica"}
    config["checkpoint"] = {"writer": writer}
engine, *_ = deepspeed.initialize(
    model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), config=config
)
result = {"engine": type(engine.checkpoint_engine).__name__, "deepspeed": deepspeed.__version__}
engine.backward(engine(torch.ones(1, 4)).sum())
engine.step()
saved = {k: v.clone() for k, v in engine.module.state_dict().items()}
engine.save_checkpoint(folder, tag="clean", client_state={"epoch": 3})
result["files"] = sorted(os.listdir(os.path.join(folder, "clean")))

# A poisoned copy: the same checkpoint with a payload in the model states file.
shutil.copytree(os.path.join(folder, "clean"), os.path.join(folder, "poisoned"))
states = os.path.join(folder, "poisoned", "mp_rank_00_model_states.pt")
content = torch.load(states, weights_only=False)
content["payload"] = Payload(marker)
torch.save(content, states)

with torch.no_grad():
    for p in engine.module.parameters():
        p.zero_()
path, client = engine.load_checkpoint(folder, tag="clean")
result["clean_client_state"] = {"epoch": client.get("epoch")} if client else None
result["clean_restored"] = all(
    torch.equal(engine.module.state_dict()[k], v) for k, v in saved.items()
)
try:
    engine.load_checkpoint(folder, tag="poisoned")
except pickle.UnpicklingError as exc:
    result["poisoned"] = {"error": type(exc).__name__, "refused": list(getattr(exc, "refused", ())),
                          "message": str(exc)[:2000]}
else:
    result["poisoned"] = {"loaded": True}
result["marker"] = os.path.exists(marker)
print("RESULT " + json.dumps(result))
"""


def _free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def _run(tmp_path: Path, engine: str, safe_load: str) -> dict[str, Any]:
    script = write_child(tmp_path, "ds_child.py", CHILD)
    folder = tmp_path / "ckpt"
    folder.mkdir()
    return run_child(script, str(folder), engine, _free_port(), COMPATSHIM_SAFE_LOAD=safe_load)


@pytest.mark.parametrize(
    "engine,name",
    [("torch", "TorchCheckpointEngine"), ("fast", "FastCheckpointEngine")],
)
def test_hardened_resumes_its_own_checkpoint_and_refuses_a_poisoned_copy(
    tmp_path: Path, engine: str, name: str
) -> None:
    result = _run(tmp_path, engine, "1")
    assert result["engine"] == name, result
    assert "mp_rank_00_model_states.pt" in result["files"]
    assert result["clean_restored"] and result["clean_client_state"] == {"epoch": 3}
    poisoned = result["poisoned"]
    assert poisoned.get("error") == "UnsafeCheckpointError", (poisoned, result["stderr"][-3000:])
    assert poisoned["refused"] and not result["marker"]
    assert "add_safe_globals" not in poisoned["message"]


def test_control_armed_only_the_default_engine_runs_the_payload(tmp_path: Path) -> None:
    """What hardened mode is for: armed only, DeepSpeed's weights_only=False load runs it."""
    result = _run(tmp_path, "torch", "0")
    assert result["clean_restored"] and result["poisoned"] == {"loaded": True}
    assert result["marker"]
