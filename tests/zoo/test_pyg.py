"""PyTorch Geometric's ``fs.torch_load`` on a poisoned processed dataset.

``torch_geometric.io.fs.torch_load`` loads weights-only, and when torch's error
mentions ``add_safe_globals`` it warns and loads the same file again with
``weights_only=False``. Armed only, compatshim re-raises torch's own refusal
(its wording included), so PyG's retry runs the payload: this test records it.
Hardened (``COMPATSHIM_SAFE_LOAD=1``), the refusal is compatshim's (no such
wording) and PyG's retry would be weights-only anyway: the payload never runs,
and a clean dataset still loads through PyG's own ``InMemoryDataset`` path.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch_geometric")
torch = pytest.importorskip("torch")

from tests.checkpoint.test_hardened import TIMEOUT_S, run_child  # noqa: E402

pytestmark = pytest.mark.timeout(TIMEOUT_S + 60)

CHILD = r"""
import json, os, pickle, subprocess, sys, warnings

import torch
import torch_geometric
from torch_geometric.data import Data, InMemoryDataset
from torch_geometric.io import fs

root = sys.argv[1]
marker = os.path.join(root, "MARKER")


class Payload:  # subprocess, not os: torch's message for a blocked module (os, posix, sys)
    def __reduce__(self):  # lacks add_safe_globals, and PyG would not retry
        return (subprocess.call, (["touch", marker],))


class Tiny(InMemoryDataset):
    raw_file_names = []
    processed_file_names = ["data.pt"]

    def __init__(self, root):
        super().__init__(root)
        self.load(self.processed_paths[0])

    def download(self):
        pass

    def process(self):
        graph = Data(x=torch.ones(3, 2), edge_index=torch.tensor([[0, 1], [1, 2]]))
        self.save([graph], self.processed_paths[0])


result = {"pyg": torch_geometric.__version__}
Tiny(root)  # processes and saves
again = Tiny(root)  # loads the processed file through fs.torch_load
result["clean"] = again[0].num_nodes == 3 and torch.equal(again[0].x, torch.ones(3, 2))

path = os.path.join(root, "processed", "data.pt")
content = torch.load(path, weights_only=False)
content[0]["payload"] = Payload()
torch.save(content, path)
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    try:
        fs.torch_load(path)
    except pickle.UnpicklingError as exc:
        result["poisoned"] = {"error": type(exc).__name__, "refused": list(exc.refused),
                              "message": str(exc)[:2000]}
    else:
        result["poisoned"] = {"loaded": True}
result["warnings"] = [[w.category.__name__, str(w.message)[:300]] for w in seen]
result["marker"] = os.path.exists(marker)
print("RESULT " + json.dumps(result))
"""


def _run(tmp_path: Path, safe_load: str) -> dict[str, Any]:
    script = tmp_path / "pyg_child.py"
    script.write_text(CHILD)
    root = tmp_path / "dataset"
    root.mkdir()
    return run_child(script, str(root), COMPATSHIM_SAFE_LOAD=safe_load)


def test_hardened_refuses_a_poisoned_processed_file_and_loads_a_clean_one(tmp_path: Path) -> None:
    result = _run(tmp_path, "1")
    assert result["clean"], result["stderr"][-3000:]
    poisoned = result["poisoned"]
    assert poisoned.get("error") == "UnsafeCheckpointError", (poisoned, result["stderr"][-3000:])
    assert poisoned["refused"][0] == "subprocess.call" and "may be malicious" in poisoned["message"]
    assert "add_safe_globals" not in poisoned["message"]
    assert not result["marker"]
    # PyG's fallback never ran: it only retries on torch's add_safe_globals wording
    assert not any("Weights only load failed" in w[1] for w in result["warnings"])


def test_armed_only_pygs_own_retry_runs_the_payload(tmp_path: Path) -> None:
    """Documented gap: torch's refusal keeps its wording armed, and PyG retries unsafely.

    compatshim refused the file too (the CheckpointRefusedWarning says so);
    PyG then called ``torch.load(weights_only=False)``, which only hardened
    mode intercepts. If this starts failing, armed mode changed: update README.
    """
    result = _run(tmp_path, "0")
    assert result["clean"]
    assert result["poisoned"] == {"loaded": True} and result["marker"]
    categories = [w[0] for w in result["warnings"]]
    assert "CheckpointRefusedWarning" in categories
    assert any("Weights only load failed" in w[1] for w in result["warnings"])
