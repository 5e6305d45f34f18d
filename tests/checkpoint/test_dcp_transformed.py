"""DCP items written through stream transforms (torch 2.8+'s ``ZStandard`` extension).

torch reads such an item whole (``io.BytesIO(transform_from.read(-1))``): before the bound,
a 34 KB folder whose item was a 33 KB zstd frame of zeros made hardened ``dcp.load`` and
``inspect`` hold 2.3 GB, and the dry run skipped transformed items (it said a folder
loads where hardened ``dcp.load`` refused its item). Folders are written by torch's own
writer (``FileSystemWriter(_extensions=[ZStandard()])``); the bombs replace one item's bytes
as an attacker would, with a real zstd frame. Loads run in a fresh interpreter armed as a
user's job is (``COMPATSHIM_AUTO=1 COMPATSHIM_SAFE_LOAD=1``), which reports how far its
peak memory rose during the load.
"""

from __future__ import annotations

import io
import pickle
import tracemalloc
import warnings
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")
zstandard = pytest.importorskip("zstandard", reason="the zstd DCP extension needs zstandard")
extension = pytest.importorskip("torch.distributed.checkpoint._extension")
if not hasattr(extension, "ZStandard"):  # pragma: no cover - torch < 2.8
    pytest.skip("DCP stream transforms are torch 2.8+", allow_module_level=True)

from compatshim.checkpoint import CheckpointError, inspect, plan_resume  # noqa: E402
from compatshim.checkpoint._expand import transformed  # noqa: E402
from tests.checkpoint.dcp_kit import _NO_DIST  # noqa: E402
from tests.checkpoint.test_hardened import TIMEOUT_S, run_child  # noqa: E402

pytestmark = pytest.mark.timeout(2 * TIMEOUT_S)

ZEROS = 2**21  # float32: 8 MiB declared, a few hundred bytes stored


class Note:
    """Off compatshim's allowlist: hardened mode refuses the item that pickles it."""

    def __init__(self) -> None:
        self.text = "kept"


def _state() -> dict[str, Any]:
    return {
        "w": torch.randn(256, generator=torch.Generator().manual_seed(0)),
        "zeros": torch.zeros(ZEROS),
        "note": {"a": 1, "b": "x"},
        "step": 3,
    }


def _template() -> dict[str, Any]:
    return {"w": torch.zeros(256), "zeros": torch.ones(ZEROS), "note": {"a": 0, "b": ""}, "step": 0}


def _save(folder: Path, state: dict[str, Any]) -> Path:
    writer = dcp.FileSystemWriter(str(folder), _extensions=[extension.ZStandard()])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(state, storage_writer=writer, **_NO_DIST)
    return folder


def _frame(mib: int) -> bytes:
    """A zstd frame of ``mib`` MiB of zeros (about 32 bytes per MiB)."""
    out = io.BytesIO()
    writer = zstandard.ZstdCompressor(level=19).stream_writer(out, closefd=False)
    for _ in range(mib):
        writer.write(bytes(1 << 20))
    writer.flush(zstandard.FLUSH_FRAME)
    return out.getvalue()


def _bomb(folder: Path, fqn: str, mib: int) -> Path:
    """``folder`` with item ``fqn``'s bytes replaced by a frame of ``mib`` MiB of zeros,
    appended to its data file (``.metadata`` rewritten by torch's own pickle, as an
    attacker's tool would)."""
    with open(folder / ".metadata", "rb") as file:
        metadata = pickle.load(file)
    for index, info in metadata.storage_data.items():
        if index.fqn == fqn:
            data = folder / info.relative_path
            frame = _frame(mib)
            at = data.stat().st_size
            with open(data, "ab") as file:
                file.write(frame)
            info.offset, info.length = at, len(frame)
    with open(folder / ".metadata", "wb") as file:
        pickle.dump(metadata, file)
    return folder


CHILD = r"""
import json, resource, sys, warnings

import torch
import torch.distributed.checkpoint as dcp

warnings.simplefilter("ignore")
folder = sys.argv[1]
template = {"w": torch.zeros(256), "zeros": torch.ones(2**21), "note": {"a": 0, "b": ""},
            "step": 0}
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
result = {}
try:
    dcp.load(template, checkpoint_id=folder)
    result["ok"] = True
    result["values"] = {"w": template["w"].tolist(),
                        "zeros": int(template["zeros"].count_nonzero()),
                        "note": template["note"], "step": template["step"]}
except BaseException as exc:
    result["ok"] = False
    result["error"] = [type(exc).__name__, [c.__name__ for c in type(exc).__mro__]]
    result["message"] = str(exc)[-1500:]
result["rose_mib"] = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024
print("RESULT " + json.dumps(result))
"""


def _load_hardened(tmp_path: Path, folder: Path) -> dict[str, Any]:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    return run_child(script, str(folder))


def test_hardened_dcp_load_of_a_zstd_folder_equals_the_saved_state(tmp_path: Path) -> None:
    folder = _save(tmp_path / "zstd", _state())
    with open(folder / ".metadata", "rb") as file:
        stored = {i.fqn: s.length for i, s in pickle.load(file).storage_data.items()}
    assert 64 * stored["zeros"] < 4 * ZEROS  # expands more than 64x: its declared size admits it
    result = _load_hardened(tmp_path, folder)
    assert result["ok"], result
    saved = _state()
    assert result["values"] == {"w": saved["w"].tolist(), "zeros": 0, "note": saved["note"],
                                "step": 3}  # fmt: skip


@pytest.mark.parametrize("fqn", ["note.a", "w"])
def test_hardened_dcp_load_stops_an_item_that_expands_without_end(tmp_path: Path, fqn: str) -> None:
    """A non-tensor item (64 bytes per stored byte) and a tensor's (its declared 1 KiB and
    64 per stored byte), each replaced by 512 MiB of zeros in about 17 KB."""
    folder = _bomb(_save(tmp_path / "bomb", _state()), fqn, 512)
    assert sum(f.stat().st_size for f in folder.iterdir()) < 64 * 1024
    result = _load_hardened(tmp_path, folder)
    assert not result["ok"], result
    assert "its stream transforms expand it past" in result["message"], result
    assert f"DCP item {fqn!r}" in result["message"], result
    assert result["rose_mib"] < 64, result  # torch's own read: over 1,024 (the frame, then a copy)


def test_inspect_and_the_dry_run_read_a_transformed_item_bounded(tmp_path: Path) -> None:
    folder = _bomb(_save(tmp_path / "bomb", _state()), "note.a", 64)
    tracemalloc.start()
    try:
        info = inspect(folder)
        plan = plan_resume(folder, _template())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, peak  # the item is 64 MiB expanded
    assert info.severity == "unreadable", info
    assert any("its stream transforms expand it past" in r for r in info.refusals), info
    assert not plan.ok
    assert [r.split(":")[0] for r in plan.refused] == ["note.a"], plan.refused
    assert "its stream transforms expand it past" in plan.refused[0]


def test_the_dry_run_checks_a_transformed_item_as_hardened_dcp_loads_it(tmp_path: Path) -> None:
    """It skipped them: a refused item inside a zstd folder was a plan that loads."""
    folder = _save(tmp_path / "zstd", {**_state(), "extra": Note()})
    template = {**_template(), "extra": Note()}
    plan = plan_resume(folder, template)
    assert not plan.ok
    assert plan.refused == (f"extra: names {__name__}.Note",), plan.refused
    assert plan_resume(_save(tmp_path / "plain", _state()), _template()).ok


def test_a_damaged_frame_is_a_checkpoint_error_naming_the_item(tmp_path: Path) -> None:
    folder = _save(tmp_path / "zstd", _state())
    with open(folder / ".metadata", "rb") as file:
        metadata = pickle.load(file)
    place = next(s for i, s in metadata.storage_data.items() if i.fqn == "note.a")
    data = folder / place.relative_path
    raw = bytearray(data.read_bytes())
    raw[place.offset + 4 : place.offset + place.length] = b"\xff" * (place.length - 4)
    data.write_bytes(bytes(raw))
    plan = plan_resume(folder, _template())
    assert len(plan.refused) == 1, plan.refused
    assert plan.refused[0].startswith("note.a: its transforms (stream.zstd/1) cannot read it (")
    with pytest.raises(CheckpointError, match=r"^item: its transforms \(stream.zstd/1\)"):
        transformed(io.BytesIO(raw[place.offset : place.offset + place.length]),
                    place.transform_descriptors, place.length, "item")  # fmt: skip
