"""torch.distributed.checkpoint folders in ``compatshim.checkpoint``: ``load`` of a real
``.metadata`` (equal to what torch's pickle.load gives), refusals of hostile ones, and
``inspect``/``compatshim inspect`` of a folder (FQNs, shapes, dtypes, ranks, items)."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed.checkpoint")

from torch.distributed.checkpoint import metadata as dcp_metadata  # noqa: E402

from compatshim.checkpoint import (  # noqa: E402
    CheckpointError,
    UnsafeCheckpointError,
    inspect,
    load,
)
from tests.checkpoint.dcp_kit import poison_metadata, save, save_ranks, state  # noqa: E402
from tests.harness.dist import run_ranks  # noqa: E402

pytestmark = pytest.mark.timeout(300)
SRC = str(Path(__file__).resolve().parents[2] / "src")


@pytest.fixture()
def genuine(tmp_path: Path) -> Path:
    folder = tmp_path / "genuine"
    save(folder, state())
    return folder


def test_load_reads_a_genuine_metadata_as_torch_s_pickle_load(genuine: Path) -> None:
    with open(genuine / ".metadata", "rb") as file:
        expected = pickle.load(file)  # our own file
    loaded = load(genuine / ".metadata")
    assert loaded == expected
    assert type(loaded) is type(expected)
    properties = loaded.state_dict_metadata["model.w"].properties
    assert properties.memory_format is torch.contiguous_format
    assert properties.layout is torch.strided and properties.dtype is torch.float32
    assert hash(next(iter(loaded.storage_data))) == hash(next(iter(expected.storage_data)))


def test_a_poisoned_metadata_is_refused_naming_the_global(genuine: Path, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    poison_metadata(genuine, tmp_path / "bad", marker)
    with pytest.raises(UnsafeCheckpointError) as caught:
        load(tmp_path / "bad" / ".metadata")
    assert not marker.exists()
    assert "posix.system" in caught.value.refused or "os.system" in caught.value.refused


def _newobj_build(cls: Any, state: Any) -> bytes:
    """A protocol-2 pickle body: NEWOBJ of ``cls`` without arguments, then BUILD ``state``
    (what pickle writes for a plain instance; pickle itself refuses to write it for a
    stand-in object)."""
    head = pickle.dumps(cls, protocol=2)[:-1]  # PROTO, GLOBAL, BINPUT
    body = pickle.dumps(state, protocol=2)[2:-1]  # without PROTO and STOP
    return head + b")\x81" + body + b"b"


class _Crafted:
    """Pickles as ``reduce`` says: hand-made hostile structures of DCP's own classes."""

    def __init__(self, reduce: tuple[Any, ...]) -> None:
        self.reduce = reduce

    def __reduce__(self) -> tuple[Any, ...]:
        return self.reduce


def _properties_class() -> Any:
    return (
        dcp_metadata.__dict__.get("TensorProperties")
        or __import__(
            "torch.distributed._shard.sharded_tensor.metadata", fromlist=["TensorProperties"]
        ).TensorProperties
    )


def _encoding(value: int) -> Any:
    module = sys.modules[_properties_class().__module__]
    enum = vars(module).get("_MEM_FORMAT_ENCODING") or vars(module)["MEM_FORMAT_ENCODING"]
    return enum(value)


@pytest.mark.parametrize(
    "bad_state",
    [
        ("float32", torch.strided, False, 0, False),  # a str for the dtype
        (torch.float32, torch.strided, "yes", 0, False),
        (torch.float32, torch.strided, False, 0, False, [1, 2]),  # strides not a tuple
        (torch.float32, torch.strided, False, 0, False, (1,), "extra"),
        {"dtype": torch.float32},  # a dict where torch writes a tuple
    ],
)
def test_tensor_properties_state_is_checked_field_by_field(tmp_path: Path, bad_state: Any) -> None:
    if type(bad_state) is tuple and len(bad_state) > 3:
        bad_state = (*bad_state[:3], _encoding(bad_state[3]), *bad_state[4:])
    path = tmp_path / "m.pkl"
    path.write_bytes(_newobj_build(_properties_class(), bad_state) + b".")
    with pytest.raises(CheckpointError):
        load(path)


@pytest.mark.parametrize("name", ["torch.load", "os.system", "torch.float32", "strided"])
def test_get_layout_gives_only_a_layout(tmp_path: Path, name: str) -> None:
    path = tmp_path / "m.pkl"
    path.write_bytes(pickle.dumps(_Crafted((torch.serialization._get_layout, (name,)))))
    with pytest.raises(CheckpointError):
        load(path)


def test_an_unhashable_metadata_index_key_is_a_checkpoint_error(tmp_path: Path) -> None:
    index = _newobj_build(dcp_metadata.MetadataIndex, {"fqn": "w", "offset": [0]})
    path = tmp_path / "m.pkl"
    path.write_bytes(b"\x80\x02}" + index[2:] + b"K\x01s.")  # {index: 1}
    with pytest.raises(CheckpointError):
        load(path)


def test_a_metadata_index_gets_no_dunder_attributes(tmp_path: Path) -> None:
    index = _newobj_build(dcp_metadata.MetadataIndex, {"__class__": dict, "fqn": "w"})
    path = tmp_path / "m.pkl"
    path.write_bytes(index + b".")
    with pytest.raises(UnsafeCheckpointError):
        load(path)


def test_inspect_lists_a_folder_without_reading_tensor_data(genuine: Path) -> None:
    with open(genuine / ".metadata", "rb") as file:
        metadata = pickle.load(file)  # our own file
    for index, where in metadata.storage_data.items():  # inspect must not need tensor data
        if isinstance(metadata.state_dict_metadata[index.fqn], dcp_metadata.TensorStorageMetadata):
            with open(genuine / where.relative_path, "r+b") as data:
                data.seek(where.offset)
                data.write(b"\xff" * where.length)  # non-tensor items are read: they stay
    info = inspect(genuine)
    assert info.container == "dcp" and info.loadable
    assert info.dcp is not None and info.dcp.world_size == 1
    shapes = {t.name: (t.dtype, t.shape) for t in info.named_tensors}
    assert shapes == {"model.w": ("float32", (3, 4)), "model.b": ("bfloat16", (4,))}
    assert set(info.dcp.items) >= {"step"}  # 2.1: "extra"; later: "extra.name", "extra.lrs"
    assert info.tensor_bytes == 12 * 4 + 4 * 2
    json.dumps(info.as_dict())


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "compatshim", "inspect", *args],
        capture_output=True,
        text=True,
        timeout=240,
        env={"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin"},
    )


def test_cli_inspects_a_folder_and_refuses_a_poisoned_one(genuine: Path, tmp_path: Path) -> None:
    done = _cli(str(genuine), "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["container"] == "dcp" and report["dcp"]["world_size"] == 1
    assert {t["name"] for t in report["named_tensors"]} == {"model.w", "model.b"}
    marker = tmp_path / "ran"
    poison_metadata(genuine, tmp_path / "bad", marker)
    done = _cli(str(tmp_path / "bad"))
    assert done.returncode == 3, done.stderr  # dangerous
    assert "saved by 1 rank(s)" in done.stdout and "NOT loadable" in done.stdout
    assert "denied (cannot be allowed)" in done.stdout
    assert not marker.exists()


def test_inspect_gives_the_world_size_a_folder_was_saved_at(tmp_path: Path) -> None:
    folder = tmp_path / "two"
    run_ranks(save_ranks, 2, args=(str(folder),), timeout=240, init=False)
    info = inspect(folder)
    assert info.loadable and info.dcp is not None
    assert info.dcp.world_size == 2 and len(info.dcp.data_files) == 2
    assert {"rank0.w", "rank1.w"} <= {t.name for t in info.named_tensors}


def test_the_crafted_forms_load_when_their_fields_are_right(tmp_path: Path) -> None:
    """The control for the refusals above: the same hand-made pickles, with good fields."""
    good = (torch.float32, torch.strided, False, _encoding(1), False)
    path = tmp_path / "m.pkl"
    path.write_bytes(_newobj_build(_properties_class(), good) + b".")
    assert load(path).memory_format is torch.channels_last
    index = _newobj_build(dcp_metadata.MetadataIndex, {"fqn": "w", "offset": torch.Size([0])})
    path.write_bytes(b"\x80\x02}" + index[2:] + b"K\x01s.")
    assert load(path) == {dcp_metadata.MetadataIndex("w", [0]): 1}


FIXTURES = sorted((Path(__file__).parent / "fixtures").glob("*/dcp.metadata"))


@pytest.mark.parametrize("fixture", FIXTURES, ids=lambda p: p.parent.name)
def test_a_metadata_written_by_another_torch_loads_as_pickle_load_gives(fixture: Path) -> None:
    """``.metadata`` of ``dcp_kit.save(folder, state())`` under torch 2.1.2 to 2.15.0; where
    torch itself cannot read it (2.4+'s on 2.1/2.2: no ``_MEM_FORMAT_ENCODING``; 2.15's on
    2.4-2.13: ``TensorProperties`` with strides), a clear refusal."""
    try:
        with open(fixture, "rb") as file:
            expected = pickle.load(file)  # our own fixture
    except (AttributeError, ValueError) as torch_refused:
        refused = r"does not exist in this install|allow-listed for torch >=2\.3|no strides field"
        with pytest.raises(CheckpointError, match=refused):
            load(fixture)
        assert "_MEM_FORMAT_ENCODING" in str(torch_refused) or "unpack" in str(torch_refused)
        return
    loaded = load(fixture)
    assert loaded == expected
    assert {"model.w", "model.b", "step"} <= set(loaded.state_dict_metadata)
