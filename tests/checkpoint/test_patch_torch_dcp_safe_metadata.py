"""Patch ``torch-dcp-safe-metadata``: hardened mode covers a DCP folder's ``.metadata``.

Every hostile folder is read in a fresh interpreter started as a user's job starts
(``COMPATSHIM_AUTO=1 COMPATSHIM_SAFE_LOAD=1``, the start-up hook arms compatshim);
its payload would touch a marker file, which must never exist. The armed but not
hardened control shows the same folder runs its payload through torch's own reader.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed.checkpoint")

from tests.checkpoint.dcp_kit import Payload, digest, poison_metadata, save, state  # noqa: E402
from tests.checkpoint.test_hardened import TIMEOUT_S, run_child  # noqa: E402

pytestmark = pytest.mark.timeout(2 * TIMEOUT_S)

CHILD = r"""
import json, sys, traceback, warnings
warnings.simplefilter("ignore")
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import filesystem
import compatshim
from tests.checkpoint.dcp_kit import digest, load, template

mode, folder = sys.argv[1], sys.argv[2]
result = {"pickle_is_module": type(filesystem.pickle).__name__ == "module"}
try:
    if mode == "load":
        loaded = template()
        load(folder, loaded)
        result["values"] = digest(loaded)
    elif mode == "reader":
        dcp.FileSystemReader(folder).read_metadata()
    elif mode == "to_torch_save":
        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
        dcp_to_torch_save(folder, sys.argv[3])
        result["values"] = digest(torch.load(sys.argv[3]))
    result["ok"] = True
except BaseException as exc:  # DCP raises CheckpointException, a BaseException
    result.update(ok=False, type=type(exc).__name__, error=str(exc)[-3000:])
row = [s for s in compatshim.status() if s.name == "torch-dcp-safe-metadata"][0]
result.update(defect=row.defect, fixed=row.fixed)
print("RESULT " + json.dumps(result))
"""


@pytest.fixture()
def child(tmp_path: Path) -> Path:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    return script


def _run(child: Path, *args: Any, hardened: bool = True) -> dict[str, Any]:
    root = str(Path(__file__).resolve().parents[2])  # tests.checkpoint.dcp_kit
    env = {"PYTHONPATH": root + ":" + __import__("os").environ.get("PYTHONPATH", "")}
    if not hardened:
        env["COMPATSHIM_SAFE_LOAD"] = "0"
    return run_child(child, *map(str, args), **env)


@pytest.fixture()
def genuine(tmp_path: Path) -> Path:
    folder = tmp_path / "genuine"
    save(folder, state())
    return folder


def _expected() -> dict[str, Any]:
    return json.loads(json.dumps(digest(state())))


def test_hardened_dcp_load_of_a_genuine_folder_equals_the_saved_state(
    child: Path, genuine: Path
) -> None:
    result = _run(child, "load", genuine)
    assert result["ok"], result
    assert result["values"] == _expected()
    assert (result["defect"], result["fixed"], result["pickle_is_module"]) == (
        "present",
        True,
        False,
    )


@pytest.mark.parametrize("mode", ["load", "reader"])
def test_hardened_refuses_a_poisoned_metadata_and_never_runs_it(
    child: Path, genuine: Path, tmp_path: Path, mode: str
) -> None:
    marker = tmp_path / "ran"
    poison_metadata(genuine, tmp_path / "bad", marker)
    result = _run(child, mode, tmp_path / "bad")
    assert not marker.exists()
    assert not result["ok"]
    # torch 2.1 raises compatshim's error; 2.15's dcp.load wraps it in an AssertionError
    assert "posix.system refused" in result["error"] or "os.system refused" in result["error"]
    assert "COMPATSHIM_SAFE_LOAD=1" in result["error"]
    if mode == "reader":
        assert result["type"] == "UnsafeCheckpointError", result


def test_armed_but_not_hardened_dcp_behaves_as_torch_s(
    child: Path, genuine: Path, tmp_path: Path
) -> None:
    """The control: the same poisoned folder runs its payload through torch's reader."""
    marker = tmp_path / "ran"
    poison_metadata(genuine, tmp_path / "bad", marker)
    result = _run(child, "reader", tmp_path / "bad", hardened=False)
    assert result["pickle_is_module"] and result["defect"] == "absent", result
    assert marker.exists()


def test_hardened_refuses_a_poisoned_non_tensor_item(child: Path, tmp_path: Path) -> None:
    """Items are torch.save'd and read by torch.load(weights_only=False): hardened refuses."""
    marker = tmp_path / "ran"
    save(tmp_path / "bad", state(extra=Payload(marker)))
    result = _run(child, "load", tmp_path / "bad")
    assert not marker.exists()
    assert not result["ok"] and "system refused" in result["error"], result


def test_dcp_to_torch_save_refuses_a_poisoned_metadata_and_converts_a_genuine_one(
    child: Path, genuine: Path, tmp_path: Path
) -> None:
    pytest.importorskip("torch.distributed.checkpoint.format_utils")
    result = _run(child, "to_torch_save", genuine, tmp_path / "out.pt")
    assert result["ok"] and result["values"] == _expected(), result
    marker = tmp_path / "ran"
    poison_metadata(genuine, tmp_path / "bad", marker)
    result = _run(child, "to_torch_save", tmp_path / "bad", tmp_path / "bad.pt")
    assert not marker.exists()
    assert not result["ok"] and "system refused" in result["error"], result
