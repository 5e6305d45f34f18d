"""A torch.save file read where torch is not installed: what holds no tensor loads, the rest is
refused with the cause (not "damaged or unsupported file").

Made here with torch; read in a child interpreter that has no torch: started with ``-S`` (no
site-packages) and only compatshim and its one dependency on its path, so neither ``import
torch`` nor torch's distribution metadata is found, as in an environment without it.
A config or counters saved with ``torch.save`` are read by tools that do not train (a
launcher, a sweep's summariser); the legacy format already loaded so, the zip format did not.
"""

from __future__ import annotations

import collections
import fractions
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

CHILD = r"""
import json, sys
from compatshim.checkpoint import CheckpointError, UnsafeCheckpointError, inspect, load

found = {}
for path in sys.argv[1:]:
    try:
        found[path] = {"value": load(path)}
    except (CheckpointError, UnsafeCheckpointError) as exc:
        found[path] = {"error": type(exc).__name__, "message": str(exc)}
    found[path]["loadable"] = inspect(path).loadable
try:
    import torch
    found["torch_found"] = True
except ImportError:
    found["torch_found"] = False
print(json.dumps(found))
"""


def _without_torch(folder: Path, code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``code`` in an interpreter whose path holds compatshim and packaging only."""
    import packaging

    import compatshim

    lib = folder / "lib"
    lib.mkdir(exist_ok=True)
    for package in (compatshim, packaging):
        link = lib / package.__name__
        if not link.exists():
            link.symlink_to(Path(package.__file__).parent, target_is_directory=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "COMPATSHIM"))}
    return subprocess.run(
        [sys.executable, "-S", "-c", code, *args],
        capture_output=True,
        text=True,
        env={**env, "PYTHONPATH": str(lib)},
        timeout=120,
        check=False,
    )


def _child(folder: Path, *paths: Path) -> dict[str, dict[str, object]]:
    done = _without_torch(folder, CHILD, *map(str, paths))
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout.splitlines()[-1]))


def test_a_file_without_tensors_loads_in_both_formats(tmp_path: Path) -> None:
    state = {
        "epoch": 3,
        "config": {"lr": 0.1, "layers": [24, 24, 3], "name": "run-7"},
        "order": collections.OrderedDict(a=1, b=(2, 3)),
    }
    zipped, legacy = tmp_path / "zip.pt", tmp_path / "legacy.pt"
    torch.save(state, zipped)
    torch.save(state, legacy, _use_new_zipfile_serialization=False)
    expected = json.loads(json.dumps(torch.load(zipped, weights_only=True)))
    found = _child(tmp_path, zipped, legacy)
    assert found.pop("torch_found") is False
    for path in (zipped, legacy):
        assert found[str(path)] == {"value": expected, "loadable": True}, path


def test_a_file_with_tensors_is_refused_naming_torch(tmp_path: Path) -> None:
    path = tmp_path / "weights.pt"
    torch.save({"w": torch.ones(3), "step": 1}, path)
    found = _child(tmp_path, path)[str(path)]
    assert found["error"] == "UnsafeCheckpointError" and found["loadable"] is False, found
    assert "torch is not installed" in str(found["message"])
    assert "damaged" not in str(found["message"])


def test_a_safetensors_file_is_refused_naming_torch(tmp_path: Path) -> None:
    """A safetensors file read without torch said "damaged or unsupported file
    (ModuleNotFoundError: No module named 'torch')"; the file is fine, torch is missing."""
    from compatshim.checkpoint import load

    header = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    path = tmp_path / "weights.safetensors"
    path.write_bytes(len(header).to_bytes(8, "little") + header + bytes(8))
    assert torch.equal(load(path)["w"], torch.zeros(2))  # a good file
    found = _child(tmp_path, path)[str(path)]
    assert found["error"] == "CheckpointError" and found["loadable"] is False, found
    assert "its tensors need torch, which is not installed" in str(found["message"]), found
    assert "damaged" not in str(found["message"]), found


def test_mmap_without_torch_says_so(tmp_path: Path) -> None:
    path = tmp_path / "config.pt"
    torch.save({"epoch": 1}, path)
    code = (
        "from compatshim.checkpoint import CheckpointError, load\n"
        f"try: load({str(path)!r}, mmap=True)\n"
        "except CheckpointError as exc: print(exc)\n"
    )
    done = _without_torch(tmp_path, code)
    assert "mmap=True needs torch, which is not installed" in done.stdout, done.stderr[-2000:]


SCAN = r"""
import sys
from compatshim.cli import main
sys.exit(main(["scan", *sys.argv[1:]]))
"""


@pytest.mark.parametrize("kind", ["weights", "dcp"])
def test_scan_calls_a_genuine_checkpoint_unreadable_here_not_dangerous(
    tmp_path: Path, kind: str
) -> None:
    """torch's own names where torch is absent: unreadable (exit 2), not an attack (exit 3)
    or an allow to add (exit 1), as docs/inspect.md says; the report says what is missing."""
    path = tmp_path / kind
    if kind == "weights":
        torch.save({"w": torch.ones(3), "step": 1}, path)
    else:  # its .metadata names torch.serialization._get_layout (denied: torch.serialization.*)
        pytest.importorskip("torch.distributed.checkpoint")
        from tests.checkpoint.dcp_kit import save

        save(path, {"w": torch.ones(3), "step": 1})
    done = _without_torch(tmp_path, SCAN, str(path))
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr[-2000:])
    assert done.stdout.startswith("unreadable"), done.stdout
    assert "torch is not installed" in done.stdout, done.stdout
    shown = _without_torch(tmp_path, SCAN.replace('"scan"', '"inspect"'), str(path)).stdout
    assert "COMPATSHIM_ALLOW" not in shown and "dangerous" not in shown.lower(), shown


def test_a_class_of_the_user_beside_tensors_is_unreadable_not_an_allow_of_torch(
    tmp_path: Path,
) -> None:
    """A user's class and a tensor, where torch is absent: scan said needs-allow (exit 1)
    and listed torch.FloatStorage and torch._utils._rebuild_tensor_v2 to allow (no entry
    admits them here); only once the user's class was allowed did it say unreadable."""
    path = tmp_path / "cfg.pt"
    torch.save({"cfg": fractions.Fraction(1, 3), "w": torch.ones(2)}, path)
    done = _without_torch(tmp_path, SCAN, str(path))
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr[-2000:])
    assert done.stdout.startswith("unreadable") and "torch is not installed" in done.stdout
    assert "allow: torch" not in done.stdout, done.stdout
