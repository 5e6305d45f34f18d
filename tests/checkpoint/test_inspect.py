"""checkpoint.inspect and ``compatshim inspect``: what a file needs, without loading it."""

from __future__ import annotations

import argparse
import json
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from checkpoint.corpus import Scripted
from checkpoint.helpers import Box
from compatshim.checkpoint import CheckpointError, inspect


@pytest.fixture
def state_dict_file(tmp_path: Path) -> Path:
    path = tmp_path / "model.pt"
    model = torch.nn.Linear(4, 3)
    torch.save({"model": model.state_dict(), "args": argparse.Namespace(lr=0.1)}, path)
    return path


def test_zip_record(state_dict_file: Path) -> None:
    info = inspect(state_dict_file)
    assert info.container == "zip" and info.loadable
    assert info.tensors == 2 and info.storages == 2
    assert info.tensor_bytes == (12 + 3) * 4
    assert info.dtypes == {"float32": 2}
    names = {g.name: g for g in info.globals}
    assert names["argparse.Namespace"].covered and names["argparse.Namespace"].kind == "instance"
    assert names["torch._utils._rebuild_tensor_v2"].count == 2
    assert info.writer.byteorder == "little" and info.writer.archive_version == "3"
    assert json.loads(json.dumps(info.as_dict()))["loadable"] is True


def test_unknown_globals_are_listed(tmp_path: Path) -> None:
    path = tmp_path / "c.pt"
    torch.save({"box": Box(1)}, path)
    info = inspect(path)
    assert info.unknown == ("checkpoint.helpers.Box",) and not info.loadable


def test_legacy_and_plain_pickle(tmp_path: Path) -> None:
    legacy = tmp_path / "legacy.pt"
    torch.save(
        {"w": torch.ones(5, dtype=torch.float64)}, legacy, _use_new_zipfile_serialization=False
    )
    info = inspect(legacy)
    assert info.container == "legacy" and info.tensor_bytes == 40 and info.loadable
    plain = tmp_path / "rng.pkl"
    plain.write_bytes(pickle.dumps({"numpy": np.random.get_state()}, protocol=4))
    info = inspect(plain)
    assert info.container == "pickle" and info.loadable and info.writer.pickle_protocol == 4
    assert info.writer.numpy_major == int(np.__version__.split(".")[0])


def test_torchscript_is_reported_and_refused(tmp_path: Path) -> None:
    path = tmp_path / "scripted.pt"
    torch.jit.save(torch.jit.script(Scripted()), str(path))
    info = inspect(path)
    assert info.container == "torchscript" and not info.loadable


def test_damaged_file_raises_checkpoint_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.pt"
    path.write_bytes(b"\x80\x02]q\x00(")
    with pytest.raises(CheckpointError):
        inspect(path)


def test_inspect_reads_no_tensor_data_and_imports_no_torch(state_dict_file: Path) -> None:
    code = (
        "import sys\nfrom compatshim.checkpoint import inspect\n"
        f"info = inspect({str(state_dict_file)!r})\n"
        "assert 'torch' not in sys.modules and 'numpy' not in sys.modules\n"
        "print(info.tensors)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "2"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "compatshim", "inspect", *args], capture_output=True, text=True
    )


def test_cli_exit_codes(state_dict_file: Path, tmp_path: Path) -> None:
    ok = _cli(str(state_dict_file))
    assert ok.returncode == 0 and "loadable" in ok.stdout
    as_json = _cli(str(state_dict_file), "--json")
    assert as_json.returncode == 0 and json.loads(as_json.stdout)["container"] == "zip"
    unknown = tmp_path / "u.pkl"
    unknown.write_bytes(pickle.dumps({"box": Box(1)}))
    refused = _cli(str(unknown))
    assert refused.returncode == 1 and "checkpoint.helpers.Box" in refused.stdout
    damaged = tmp_path / "d.pt"
    damaged.write_bytes(b"PK\x03\x04 not really a zip")
    broken = _cli(str(damaged))
    assert broken.returncode == 2 and "Traceback" not in broken.stderr
    assert len(broken.stderr.strip().splitlines()) == 1
    missing = _cli(str(tmp_path / "absent.pt"))
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
