"""A malicious pickle in place of an RNG file is refused and executes nothing."""

from __future__ import annotations

import io
import os
import pickle
import zipfile
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

import torch

import compatshim.rng as rng


class Exploit:
    """Unpickling this calls ``os.system`` (touches a sentinel file)."""

    def __init__(self, sentinel: Path) -> None:
        self.sentinel = sentinel

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.sentinel}",))


def malicious_payload(sentinel: Path) -> dict[str, Any]:
    state = rng.capture()
    return {"python": state["python"], "cpu": torch.get_rng_state(), "numpy": Exploit(sentinel)}


def test_plain_malicious_pickle_is_refused(tmp_path: Path) -> None:
    sentinel = tmp_path / "pwned"
    path = tmp_path / "rng_state.pth"
    path.write_bytes(pickle.dumps({"python": Exploit(sentinel)}))
    with pytest.raises(rng.RNGStateError, match=r"global (posix|os)\.system refused"):
        rng.read(path)
    assert not sentinel.exists()


def test_malicious_torch_zip_is_refused(tmp_path: Path) -> None:
    sentinel = tmp_path / "pwned"
    path = tmp_path / "random_states_0.pkl"
    torch.save(malicious_payload(sentinel), path)
    assert zipfile.is_zipfile(path)
    with pytest.raises(rng.RNGStateError, match="refused to load"):
        rng.load(path)
    assert not sentinel.exists()


def test_malicious_legacy_torch_file_is_refused(tmp_path: Path) -> None:
    sentinel = tmp_path / "pwned"
    path = tmp_path / "legacy.pt"
    torch.save(malicious_payload(sentinel), path, _use_new_zipfile_serialization=False)
    with pytest.raises(rng.RNGStateError, match="refused to load"):
        rng.read(path)
    assert not sentinel.exists()


def test_tensor_in_a_plain_pickle_loads_through_the_same_safe_loader(tmp_path: Path) -> None:
    """A plain-pickled tensor's storage is a nested torch file: read by the safe loader too."""
    state = torch.get_rng_state()
    path = tmp_path / "rng.pkl"
    path.write_bytes(pickle.dumps({"torch": state, "python": None}))
    assert torch.equal(rng.read(path)["ranks"][0]["torch_cpu"], state)


def test_refusal_names_the_global_and_the_way_out(tmp_path: Path) -> None:
    path = tmp_path / "x.pkl"
    path.write_bytes(pickle.dumps({"python": io.BytesIO}))
    with pytest.raises(rng.RNGStateError) as caught:
        rng.read(path)
    assert "_io.BytesIO" in str(caught.value) and "trusted=True" in str(caught.value)


def test_trusted_reads_a_file_with_foreign_objects(tmp_path: Path) -> None:
    """trusted=True is the only way to a full unpickle (here: a harmless extra object)."""
    state = rng.capture()
    payload = {"rng": state, "extra": io.BytesIO(b"x")}
    path = tmp_path / "ckpt.pt"
    torch.save(payload, path)
    with pytest.raises(rng.RNGStateError):
        rng.read(path)
    assert rng.read(path, trusted=True)["ranks"][0]["format"] == "compatshim.rng.state"


def test_garbage_file_is_an_rng_state_error(tmp_path: Path) -> None:
    path = tmp_path / "rng.pt"
    path.write_bytes(b"\x00\x01 not a pickle at all")
    with pytest.raises(rng.RNGStateError):
        rng.read(path)
    path.write_bytes(b"PK\x03\x04 truncated zip")
    with pytest.raises(rng.RNGStateError):
        rng.read(path)
