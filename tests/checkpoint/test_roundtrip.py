"""checkpoint.load returns what torch.load(weights_only=False) does, however a file is written."""

from __future__ import annotations

import io
import logging
import pickle
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

import torch

from compatshim.checkpoint import CheckpointError, UnsafeCheckpointError, load
from tests.checkpoint.helpers import Box, assert_same, peak_rss_mb, realistic

PROTOCOLS = [2, 3, 4, 5]


def _save(obj: Any, path: Path, protocol: int = 2, zip_format: bool = True) -> Path:
    torch.save(obj, path, pickle_protocol=protocol, _use_new_zipfile_serialization=zip_format)
    return path


@pytest.fixture(scope="module")
def checkpoint() -> dict[str, Any]:
    return realistic()


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("zip_format", [True, False], ids=["zip", "legacy"])
def test_torch_save_round_trip(
    tmp_path: Path, checkpoint: dict[str, Any], protocol: int, zip_format: bool
) -> None:
    path = _save(checkpoint, tmp_path / "ckpt.pt", protocol, zip_format)
    assert_same(torch.load(path, weights_only=False), load(path))


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_plain_pickle_round_trip(tmp_path: Path, checkpoint: dict[str, Any], protocol: int) -> None:
    plain = {k: v for k, v in checkpoint.items() if k not in ("tensors", "state_dict")}
    plain.pop("optimizer_states")
    plain["rng"] = {k: v for k, v in plain["rng"].items() if k != "torch"}
    path = tmp_path / "state.pkl"
    path.write_bytes(pickle.dumps(plain, protocol=protocol))
    assert_same(pickle.loads(path.read_bytes()), load(path))


def test_tensors_in_a_plain_pickle(tmp_path: Path) -> None:
    """pickle.dumps of a tensor nests a torch.save file per storage: loaded safely too."""
    obj = {"weights": torch.arange(6.0).view(2, 3), "param": torch.nn.Parameter(torch.ones(2))}
    path = tmp_path / "tensors.pkl"
    path.write_bytes(pickle.dumps(obj))
    assert_same(pickle.loads(path.read_bytes()), load(path))


def test_file_objects_and_bytes_io(tmp_path: Path, checkpoint: dict[str, Any]) -> None:
    buffer = io.BytesIO()
    torch.save(checkpoint, buffer)
    buffer.seek(0)
    expected = torch.load(io.BytesIO(buffer.getvalue()), weights_only=False)
    assert_same(expected, load(buffer))
    path = _save(checkpoint, tmp_path / "c.pt")
    with path.open("rb") as handle:
        assert_same(expected, load(handle))


def test_mmap_maps_tensor_data(tmp_path: Path, checkpoint: dict[str, Any]) -> None:
    path = _save(checkpoint, tmp_path / "c.pt")
    got = load(path, mmap=True)
    assert_same(torch.load(str(path), weights_only=False, mmap=True), got)
    assert_same(torch.load(path, weights_only=False), got)


def test_mmap_of_a_legacy_file_says_why_not(tmp_path: Path, checkpoint: dict[str, Any]) -> None:
    path = _save(checkpoint, tmp_path / "c.pt", zip_format=False)
    with pytest.raises(CheckpointError, match="mmap=True needs torch's zip format") as raised:
        load(path, mmap=True)
    assert isinstance(raised.value, RuntimeError)  # as torch.load raises it
    with pytest.raises(RuntimeError, match="mmap"):
        torch.load(path, weights_only=True, mmap=True)


@pytest.mark.parametrize(
    "map_location",
    ["cpu", torch.device("cpu"), {"cpu": "cpu"}, lambda storage, location: storage, None],
    ids=["str", "device", "dict", "callable", "none"],
)
def test_map_location_variants(tmp_path: Path, map_location: Any) -> None:
    path = _save({"t": torch.arange(3.0)}, tmp_path / "c.pt")
    got = load(path, map_location=map_location)
    assert_same(torch.load(path, map_location=map_location, weights_only=False), got)


def test_map_location_meta(tmp_path: Path) -> None:
    path = _save({"t": torch.arange(3.0)}, tmp_path / "c.pt")
    got = load(path, map_location="meta")
    assert got["t"].device.type == "meta" and got["t"].shape == (3,)


def test_cuda_location_without_cuda_is_a_clear_error(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    path = _save({"t": torch.arange(3.0)}, tmp_path / "c.pt")
    data = path.read_bytes().replace(b"cpuq", b"cudq")  # rename the location record's text
    if data == path.read_bytes():
        pytest.skip("location text not found in this torch's pickle")
    with pytest.raises(CheckpointError):
        load(io.BytesIO(data))


@pytest.mark.parametrize("protocol", [0, 2, 5])
def test_allow_admits_a_global_for_one_call(tmp_path: Path, protocol: int) -> None:
    path = tmp_path / "c.pkl"
    path.write_bytes(pickle.dumps({"box": Box([1, 2])}, protocol=protocol))
    with pytest.raises(UnsafeCheckpointError, match=r"checkpoint\.helpers\.Box"):
        load(path)
    name = "tests.checkpoint.helpers.Box"
    for allow in ([Box], [name], [(Box, name)]):
        assert load(path, allow=allow) == {"box": Box([1, 2])}
    with pytest.raises(UnsafeCheckpointError):
        load(path)


def test_trusted_is_plain_torch_load_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = _save({"box": Box(1)}, tmp_path / "c.pt")
    with caplog.at_level(logging.WARNING, logger="compatshim.checkpoint"):
        got = load(path, trusted=True)
    assert got == {"box": Box(1)}
    assert "weights_only=False" in caplog.text


def test_no_warning_escapes_a_load(tmp_path: Path, checkpoint: dict[str, Any]) -> None:
    """Run in a fresh interpreter with -W error: numpy 1/2 names, every format, no warning."""
    paths = [
        _save(checkpoint, tmp_path / f"c{p}{z}.pt", p, z) for p in (2, 5) for z in (True, False)
    ]
    code = "from compatshim.checkpoint import load\n"
    code += "".join(f"load({str(p)!r})\n" for p in paths)
    code += "print('LOADED')\n"
    _, out = peak_rss_mb(code, flags=("-W", "error"))
    assert "LOADED" in out


def test_missing_path_stays_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        load(tmp_path / "absent.pt")


def test_nested_tensors_are_refused_unless_their_rebuild_is_allowed(tmp_path: Path) -> None:
    """What docs/checkpoint.md says of nested tensors: refused naming the rebuild function,
    and loaded as torch loads them where a user allows it for a file they trust."""
    rebuild = "torch._utils._rebuild_nested_tensor"
    nested = torch.nested.nested_tensor([torch.zeros(2), torch.arange(3.0)])
    try:
        path = _save({"nt": nested}, tmp_path / "nested.pt")
    except (RuntimeError, NotImplementedError) as exc:  # older releases cannot save one
        pytest.skip(f"torch {torch.__version__} does not save nested tensors: {exc}")
    with pytest.raises(UnsafeCheckpointError, match=rebuild.replace(".", r"\.")):
        load(path)
    got = load(path, allow=[rebuild])["nt"]
    assert got.is_nested
    assert [t.tolist() for t in got.unbind()] == [[0.0, 0.0], [0.0, 1.0, 2.0]]


@pytest.mark.parametrize(
    "value",
    [
        pytest.param(lambda np: np.zeros(2, dtype=[("a", "<i4"), ("b", "<f8")]), id="record-array"),
        pytest.param(lambda np: np.dtype([("a", "u1"), ("b", "<f8")], align=True), id="aligned"),
        pytest.param(lambda np: np.dtype(("<f4", (2,))), id="subarray"),
    ],
)
def test_a_structured_numpy_dtype_is_refused_naming_it(tmp_path: Path, value: Any) -> None:
    """numpy pickles a structured dtype as ``dtype('V12')`` with its fields in BUILD; the
    refusal says that, not that the file's dtype state is damaged."""
    np = pytest.importorskip("numpy")
    path = _save({"records": value(np)}, tmp_path / "s.pt")
    with pytest.raises(CheckpointError, match="structured numpy dtype") as refused:
        load(path)
    assert not isinstance(refused.value, UnsafeCheckpointError)  # plain data, not an attack
    assert "trusted=True" in str(refused.value)
