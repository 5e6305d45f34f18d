"""safetensors: load and inspect match torch.load's result; hostile headers are refused cheaply.

Files written by the ``safetensors`` package (skipped where it is not installed)
are compared with ``torch.load`` (torch >= 2.13 reads ``.safetensors`` paths
through ``safetensors.torch.load_file``) and with ``load_file`` itself. Files
written by hand here need no package: they pin the format and the refusals.
"""

from __future__ import annotations

import contextlib
import io
import json
import pickle
import struct
import subprocess
import sys
import tracemalloc
from inspect import getsource
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compatshim.checkpoint import CheckpointError, inspect, load
from compatshim.checkpoint._container import sniff
from tests.checkpoint.helpers import bytes_read, peak_rss_mb


def write(path: Path, header: Any, data: bytes = b"") -> Path:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


def entry(dtype: str, shape: list[int], begin: int, end: int) -> dict[str, Any]:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def tensors() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return {
        "layer.weight": torch.randn(4, 3),
        "layer.bias": torch.randn(4, dtype=torch.float64),
        "half": torch.randn(2, 2).half(),
        "brain": torch.randn(3, 1, 2).bfloat16(),
        "mask": torch.tensor([True, False, True]),
        "step": torch.tensor(7),
        "empty": torch.empty(0, 5),
        "bytes": torch.arange(6, dtype=torch.uint8),
        "i8": torch.tensor([-3, 4], dtype=torch.int8),
        "i32": torch.tensor([1 << 30], dtype=torch.int32),
        "c64": torch.randn(2, dtype=torch.complex64),
        "fp8": torch.randn(4).to(torch.float8_e4m3fn),
        **({"u16": torch.tensor([65535], dtype=torch.uint16)} if hasattr(torch, "uint16") else {}),
    }


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert type(a) is dict and list(a) == list(b)
    for name, tensor in a.items():
        other = b[name]
        assert tensor.dtype == other.dtype and tensor.shape == other.shape, name
        assert tensor.device == other.device, name
        if tensor.device.type != "meta":
            assert torch.equal(tensor.view(-1).view(torch.uint8), other.view(-1).view(torch.uint8))


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    safetensors_torch = pytest.importorskip("safetensors.torch")
    path = tmp_path / "model.safetensors"
    safetensors_torch.save_file(tensors(), path, metadata={"format": "pt", "step": "12"})
    return path


# ---------------------------------------------------------------- files the package writes
def test_load_matches_torch_load_and_load_file(saved: Path) -> None:
    from safetensors.torch import load_file

    got = load(saved)
    same(got, load_file(saved))
    if ".safetensors" in getsource(torch.serialization.load):  # torch 2.13 reads them so
        same(got, torch.load(saved))
    for name, tensor in tensors().items():
        assert torch.equal(got[name].view(-1).view(torch.uint8), tensor.view(-1).view(torch.uint8))
        # each tensor has a storage of its own size, as load_file's do
        assert got[name].untyped_storage().nbytes() == tensor.numel() * tensor.element_size()


def test_mmap_file_object_and_map_location(saved: Path) -> None:
    reference = load(saved)
    same(load(saved, mmap=True), reference)
    with open(saved, "rb") as file:
        same(load(file), reference)
    same(load(io.BytesIO(saved.read_bytes())), reference)
    meta = {k: v.to("meta") for k, v in reference.items()}
    same(load(saved, map_location="meta"), meta)
    same(load(saved, map_location=torch.device("meta")), meta)
    same(load(saved, map_location={"cpu": "meta"}), meta)
    seen: list[str] = []
    same(load(saved, map_location=lambda s, loc: seen.append(loc)), reference)
    assert set(seen) == {"cpu"}
    with open(saved, "rb") as file, pytest.raises(CheckpointError, match="mmap=True needs"):
        load(file, mmap=True)


def test_mmap_maps_instead_of_reading(saved: Path, tmp_path: Path) -> None:
    from safetensors.torch import save_file

    big = tmp_path / "big.safetensors"
    save_file({"w": torch.ones(64, 1024, 1024, dtype=torch.uint8)}, big)  # 64 MiB
    code = f"""
        import torch
        from compatshim.checkpoint import load
        def rss():
            return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20
        before = rss()
        w = load({str(big)!r}, mmap=MMAP)["w"]
        assert int(w[0, 0, 0]) == 1
        print(rss() - before)
    """
    grown = {}
    for mmap in (True, False):
        _, out = peak_rss_mb(code.replace("MMAP", str(mmap)))
        grown[mmap] = float(out)
    assert grown[True] < 16 and grown[False] > 60, grown


def test_numpy_writer(tmp_path: Path) -> None:
    """Files from safetensors.numpy (another writer of the same format) load as tensors."""
    np = pytest.importorskip("numpy")
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    arrays = {
        "f": np.arange(6, dtype=np.float32).reshape(2, 3),
        "h": np.array([1.5], dtype=np.float16),
        "b": np.array([[True], [False]]),
        "u": np.array(7, dtype=np.uint8),
    }
    path = tmp_path / "np.safetensors"
    safetensors_numpy.save_file(arrays, path)
    got = load(path)
    assert set(got) == set(arrays)
    for name, array in arrays.items():
        assert torch.equal(got[name], torch.from_numpy(array)), name


def test_inspect(saved: Path) -> None:
    info = inspect(saved)
    assert info.container == "safetensors" and info.loadable and info.globals == ()
    assert info.metadata == {"format": "pt", "step": "12"}
    expected = {name: (str(t.dtype).split(".")[1], tuple(t.shape)) for name, t in tensors().items()}
    assert {t.name: (t.dtype, t.shape) for t in info.named_tensors} == expected
    assert info.tensors == len(expected)
    assert info.tensor_bytes == sum(t.numel() * t.element_size() for t in tensors().values())
    found = json.loads(json.dumps(info.as_dict()))
    assert found["container"] == "safetensors" and found["globals"] == []
    assert found["metadata"]["step"] == "12" and len(found["named_tensors"]) == len(expected)


def test_inspect_reads_no_tensor_data(tmp_path: Path) -> None:
    """inspect's verdict is load's, on a mapped file: its 16 MB of data are never read (before,
    inspect read the header alone, torch-free; now load's machine judges it too)."""
    safetensors_torch = pytest.importorskip("safetensors.torch")
    path = tmp_path / "big.safetensors"
    safetensors_torch.save_file({"w": torch.zeros(1 << 22)}, path)
    inspect(path)  # what it imports is read once
    before = bytes_read()
    info = inspect(path)
    assert info.loadable and info.tensor_bytes == 16 << 20
    assert bytes_read() - before < 1 << 20


def test_cli(saved: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "compatshim", "inspect", str(saved)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "safetensors" in done.stdout and "brain: bfloat16 [3x1x2]" in done.stdout
    assert "step: int64 [scalar]" in done.stdout and "metadata step: 12" in done.stdout
    assert done.stdout.rstrip().endswith("-> loadable by compatshim.checkpoint.load")


# ---------------------------------------------------------------- files written by hand
def test_hand_written_file_needs_no_package(tmp_path: Path) -> None:
    """The order of tensors is the order of their data, as in load_file."""
    path = write(
        tmp_path / "w.bin",  # recognised by content, whatever the suffix
        {
            "__metadata__": None,
            "b": entry("F32", [2], 4, 12),
            "a": entry("I16", [2], 0, 4),
            "z": entry("F64", [0, 3], 12, 12),
        },
        struct.pack("<2h2f", -1, 2, 0.5, 1.5),
    )
    got = load(path)
    assert list(got) == ["a", "b", "z"]
    assert got["a"].tolist() == [-1, 2] and got["b"].tolist() == [0.5, 1.5]
    assert got["z"].shape == (0, 3) and got["z"].dtype == torch.float64
    assert inspect(path).metadata is None


def test_upstream_deserialization_vector() -> None:
    """The bytes huggingface/safetensors' own tests (bindings/python/tests/test_simple.py) read."""
    serialized = (
        b'<\x00\x00\x00\x00\x00\x00\x00{"test":{"dtype":"I32","shape":[2,2],"data_offsets":[0,16]}}'
        + b"\x00" * 16
    )
    got = load(io.BytesIO(serialized))
    assert list(got) == ["test"] and torch.equal(got["test"], torch.zeros(2, 2, dtype=torch.int32))


def test_upstream_abuse_attempt_3(tmp_path: Path) -> None:
    """huggingface/safetensors attacks/safetensors_abuse_attempt_3.py: 100 000 tensors claiming
    the same bytes; refused with memory a small multiple of the file (the parsed header)."""
    shape = [200, 200]
    n = shape[0] * shape[1] * 4
    header = {f"weight_{i}": entry("F32", shape, 0, n) for i in range(100_000)}
    raw = json.dumps(header).encode()
    path = tmp_path / "abuse3.safetensors"
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + b"\0" * len(raw))
    size_mb = path.stat().st_size / 2**20
    imports = "import torch\nfrom compatshim.checkpoint import CheckpointError, inspect, load\n"
    code = imports + (
        "for reader in (load, inspect):\n"
        "    try:\n"
        f"        reader({str(path)!r})\n"
        "    except CheckpointError as exc:\n"
        "        print('overlaps' in str(exc))\n"
    )
    peak, out = peak_rss_mb(code)
    base, _ = peak_rss_mb(imports)
    assert out.split() == ["True", "True"]
    assert peak - base < 10 * size_mb, (peak, base, size_mb)


def test_dtype_torch_lacks_is_refused_by_load_not_inspect(tmp_path: Path) -> None:
    path = write(tmp_path / "f6.safetensors", {"x": entry("F6_E2M3", [4], 0, 3)}, b"abc")
    assert inspect(path).named_tensors[0].dtype == "F6_E2M3"
    with pytest.raises(CheckpointError, match="has no torch dtype"):
        load(path)


def test_pickles_are_not_taken_for_safetensors() -> None:
    values: list[Any] = [{"a": 1}, [1, 2], "{" * 20, {"{": b"{" * 9}, 2**70, (1.5, None)]
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        for value in values:
            assert sniff(io.BytesIO(pickle.dumps(value, protocol))) == "pickle"


# ---------------------------------------------------------------- hostile files
def _deep(depth: int) -> bytes:
    return b'{"a":' + b"[" * depth + b"]" * depth + b"}"


OK = entry("U8", [2], 0, 2)
HOSTILE: dict[str, tuple[Any, bytes]] = {
    "header longer than file": (b"{}" + b" " * 6, b""),  # length patched below
    "overlapping offsets": ({"a": entry("U8", [2], 0, 2), "b": entry("U8", [1], 1, 2)}, b"xy"),
    "same offsets twice": ({"a": OK, "b": OK}, b"xy"),
    "offsets past the data": ({"a": entry("U8", [4], 0, 4)}, b"xy"),
    "offsets reversed": ({"a": entry("U8", [0], 2, 0)}, b"xy"),
    "negative offset": ({"a": entry("U8", [2], -1, 1)}, b"xy"),
    "gap between tensors": ({"a": entry("U8", [1], 0, 1), "b": entry("U8", [1], 2, 3)}, b"xyz"),
    "bytes after the tensors": ({"a": OK}, b"xyz"),
    "offsets not two ints": ({"a": {"dtype": "U8", "shape": [2], "data_offsets": [0]}}, b"xy"),
    "float offsets": ({"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2.0]}}, b"xy"),
    "size does not match shape": ({"a": entry("F32", [1], 0, 2)}, b"xy"),
    "shape product overflows": ({"a": entry("U8", [2**32, 2**32, 4], 0, 2)}, b"xy"),
    "shape times itemsize is huge": ({"a": entry("F64", [2**62], 0, 2)}, b"xy"),
    "dimension past int64": ({"a": entry("U8", [0, 2**64], 0, 0)}, b""),
    "negative dimension": ({"a": entry("U8", [-2, -1], 0, 2)}, b"xy"),
    "bool dimension": ({"a": entry("U8", [True, 2], 0, 2)}, b"xy"),
    "too many dimensions": ({"a": entry("U8", [1] * 65, 0, 1)}, b"x"),
    "huge literal": (
        b'{"a":{"dtype":"U8","shape":[' + b"9" * 5000 + b'],"data_offsets":[0,1]}}',
        b"",
    ),
    "dtype lower case": ({"a": entry("f32", [0], 0, 0)}, b""),
    "dtype torch name": ({"a": entry("float32", [0], 0, 0)}, b""),
    "dtype not a string": ({"a": {"dtype": 7, "shape": [0], "data_offsets": [0, 0]}}, b""),
    "dtype missing": ({"a": {"shape": [0], "data_offsets": [0, 0]}}, b""),
    "tensor entry is a list": ({"a": [1, 2]}, b""),
    "metadata not strings": ({"__metadata__": {"a": 1}}, b""),
    "metadata a list": ({"__metadata__": ["a"]}, b""),
    "duplicate tensor name": (
        b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
        b'"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}',
        b"xy",
    ),
    "duplicate field": (
        b'{"a":{"dtype":"U8","dtype":"F32","shape":[0],"data_offsets":[0,0]}}',
        b"",
    ),
    "deeply nested": (_deep(100_000), b""),
    "nested just past the limit": (_deep(9), b""),
    "unbalanced": (b'{"a":[[[}', b""),
    "not JSON": (b"{not json}", b""),
    "NaN": (b'{"a":NaN}', b""),
    "invalid UTF-8": (b'{"\xff":1}', b""),
    "lone surrogate name": (b'{"\\ud800":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}}', b""),
    "trailing garbage": (b"{}\0\0", b""),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_header_is_refused_without_allocating(tmp_path: Path, case: str) -> None:
    header, data = HOSTILE[case]
    path = write(tmp_path / "h.safetensors", header, data)
    if case == "header longer than file":
        raw = path.read_bytes()
        path.write_bytes(struct.pack("<Q", 1000) + raw[8:])
    assert sniff(io.BytesIO(path.read_bytes())) == "safetensors"
    tracemalloc.start()
    try:
        for reader in (load, inspect):
            with pytest.raises(CheckpointError) as raised:
                reader(path)
            assert "safetensors" in str(raised.value)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * path.stat().st_size + 2**20, peak


def test_header_nested_within_the_limit_parses(tmp_path: Path) -> None:
    path = write(tmp_path / "n.safetensors", {"a": {**OK, "extra": [[{}]]}}, b"xy")
    assert load(path)["a"].tolist() == [120, 121]


@pytest.mark.parametrize("claim", [2**31, 150_000_000, 2**47])
def test_huge_header_claim_reads_nothing(tmp_path: Path, claim: int) -> None:
    """The claim is checked before the read, even where the (sparse) file is that large."""
    path = tmp_path / "sparse.safetensors"
    with open(path, "wb") as file:
        file.write(struct.pack("<Q", claim) + b'{"a":')
        file.truncate(min(claim, 2**31) + 16)
    tracemalloc.start()
    try:
        for reader in (load, inspect):
            with pytest.raises(CheckpointError, match="header claims"):
                reader(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2**20, peak


def test_truncated_files(tmp_path: Path) -> None:
    path = write(tmp_path / "t.safetensors", {"a": entry("F32", [4], 0, 16)}, b"\0" * 16)
    whole = path.read_bytes()
    for cut in (0, 5, 9, 40, len(whole) - 1):
        path.write_bytes(whole[:cut])
        for reader in (load, inspect):
            with pytest.raises(CheckpointError):
                reader(path)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_mutated_files_load_or_raise_checkpoint_error(data: st.DataObject) -> None:
    header = json.dumps(
        {
            "__metadata__": {"k": "v"},
            "w": entry("F32", [2, 2], 0, 16),
            "b": entry("BF16", [3], 16, 22),
            "m": entry("BOOL", [], 22, 23),
        }
    ).encode()
    raw = bytearray(struct.pack("<Q", len(header)) + header + bytes(range(23)))
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(raw) - 1))
        raw[at] = data.draw(st.sampled_from(b'{}[]",:0129-. \x00\xffe'))
    if data.draw(st.booleans()):
        del raw[data.draw(st.integers(0, len(raw))) :]
    for reader in (load, inspect):
        with contextlib.suppress(CheckpointError):
            reader(io.BytesIO(bytes(raw)))


def test_the_report_shows_a_bounded_part_of_a_large_metadata(tmp_path: Path) -> None:
    """Every __metadata__ entry was a line: a 95 MB header of 7.4 million keys printed 7.4
    million lines (tensors were already cut at 50); --json keeps them all."""
    import json

    header = json.dumps({"__metadata__": {f"k{i}": "v" for i in range(5000)}}).encode()
    path = tmp_path / "meta.safetensors"
    path.write_bytes(len(header).to_bytes(8, "little") + header)
    done = subprocess.run(
        [sys.executable, "-m", "compatshim", "inspect", str(path)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("  metadata k") == 50 and "and 4950 more metadata" in done.stdout
    full = subprocess.run(
        [sys.executable, "-m", "compatshim", "inspect", "--json", str(path)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert len(json.loads(full.stdout)["metadata"]) == 5000
