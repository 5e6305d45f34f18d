"""Hardened mode never hands a file to a weaker reader: compatshim's loader reads first and
alone, torch's unpickler never sees the file (its crashes on hostile files were ours),
torch's ``add_safe_globals`` registrations still count, and torch's inner loaders refuse the
full unpickler (a ``torch.load`` reference taken before ``install()``). Each scenario runs
in a fresh interpreter armed as a user's job is; poisoned files would create a marker file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from tests.checkpoint.test_hardened import TIMEOUT_S, run_child  # noqa: E402

pytestmark = pytest.mark.timeout(2 * TIMEOUT_S + 60)

BOXES = """
import os


class Box:
    def __init__(self, value):
        self.value = value


class Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))
"""

CHILD = r"""
import io, json, pickle, sys

import torch
import torch._weights_only_unpickler as wo

import compatshim
from compatshim.checkpoint import CheckpointError, UnsafeCheckpointError
from boxes import Box, Payload

folder = sys.argv[1]
seen = []  # every time torch's weights-only unpickler is asked to read
_original_init = wo.Unpickler.__init__
def _spy(self, *args, **kwargs):
    import traceback
    seen.append("".join(traceback.format_stack(limit=8)))
    _original_init(self, *args, **kwargs)
wo.Unpickler.__init__ = _spy

if sys.argv[2] == "late":  # a reference taken before install() (COMPATSHIM_AUTO=0 here)
    early = torch.load
    # hardened from here on: set at start-up, COMPATSHIM_SAFE_LOAD alone arms the loading
    # patches before any reference could be taken (so the child starts without it)
    __import__("os").environ["COMPATSHIM_SAFE_LOAD"] = "1"
    compatshim.install(include=["torch-load-safe-globals"])
else:
    early = None

def outcome(call):
    try:
        value = call()
    except (pickle.UnpicklingError, CheckpointError) as exc:
        return {"error": type(exc).__name__, "typed": isinstance(exc, pickle.UnpicklingError),
                "message": str(exc)[:600], "refused": list(getattr(exc, "refused", ()))}
    except Exception as exc:
        return {"error": type(exc).__name__, "typed": False, "message": str(exc)[:600]}
    return {"value": repr(value)[:200]}

def file(name):
    return f"{folder}/{name}"

result = {}
if early is None:
    loaded = torch.load(file("clean.pt"), weights_only=False)
    result["clean"] = sorted(loaded) == ["bias", "weight"] and loaded["weight"].shape == (2, 3)
    result["deep_tuple_key"] = outcome(lambda: torch.load(file("deep.pkl")))
    result["length_claim"] = outcome(lambda: torch.load(file("claim.pkl"), weights_only=False))
    result["box_unregistered"] = outcome(lambda: torch.load(file("box.pt")))
    has = hasattr(torch.serialization, "add_safe_globals")
    result["registrations"] = has
    if hasattr(torch.serialization, "safe_globals"):
        with torch.serialization.safe_globals([Box]):
            result["box_in_context"] = outcome(lambda: torch.load(file("box.pt"))["b"].value)
        result["box_after_context"] = outcome(lambda: torch.load(file("box.pt")))
    if has:
        torch.serialization.add_safe_globals([Box])
        result["box_registered"] = outcome(lambda: torch.load(file("box.pt"))["b"].value)
        torch.serialization.add_safe_globals([__import__("os").system])
        result["payload_registered"] = outcome(lambda: torch.load(file("poisoned.pt")))
    result["weights_only_unpickler_calls"] = len(seen)
    result["weights_only_unpickler_stacks"] = seen[:]
    try:
        import torch.distributed._serialization as streaming
    except ImportError:
        streaming = None
    if streaming is not None and hasattr(streaming, "_streaming_load"):
        buffer = io.BytesIO()
        streaming._streaming_save({"x": Payload(folder + "/marker")}, buffer)
        buffer.seek(0)
        result["streaming"] = outcome(
            lambda: streaming._streaming_load(buffer, weights_only=False)
        )
else:
    result["late_poisoned"] = outcome(lambda: early(file("poisoned.pt"), weights_only=False))
    result["late_poisoned_legacy"] = outcome(
        lambda: early(file("poisoned_legacy.pt"), weights_only=False)
    )
    result["late_clean_weights_only"] = outcome(
        lambda: sorted(early(file("clean.pt"), weights_only=True))
    )
    result["wrapper_poisoned"] = outcome(lambda: torch.load(file("poisoned.pt")))
print("RESULT " + json.dumps(result))
"""


def _deep_tuple_key(depth: int) -> bytes:
    """``{((((),),),...): 1}``: a tuple key ``depth`` levels deep (1 byte a level)."""
    return b"\x80\x02}" + b")" + b"\x85" * depth + b"K\x01s."


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import importlib.util
    import sys

    where = tmp_path_factory.mktemp("hardened_first")
    (where / "boxes.py").write_text(BOXES)
    (where / "child.py").write_text(CHILD)
    spec = importlib.util.spec_from_file_location("boxes", where / "boxes.py")
    assert spec is not None and spec.loader is not None
    boxes = importlib.util.module_from_spec(spec)
    sys.modules["boxes"] = boxes  # torch.save names the class boxes.Box, as the child imports it
    try:
        spec.loader.exec_module(boxes)
        torch.save(torch.nn.Linear(3, 2).state_dict(), where / "clean.pt")
        torch.save({"b": boxes.Box(7)}, where / "box.pt")
        marker = where / "marker"
        torch.save({"x": boxes.Payload(marker)}, where / "poisoned.pt")
        torch.save(
            {"x": boxes.Payload(marker)},
            where / "poisoned_legacy.pt",
            _use_new_zipfile_serialization=False,
        )
    finally:
        sys.modules.pop("boxes", None)
    (where / "deep.pkl").write_bytes(_deep_tuple_key(200_000))  # 200 KB: SIGSEGV in torch 2.15
    (where / "claim.pkl").write_bytes(b"\x8e" + (1 << 60).to_bytes(8, "little"))  # 9 bytes
    return where


def _refused(outcome: dict[str, Any]) -> bool:
    return outcome.get("typed") is True and outcome["error"] in (
        "UnsafeCheckpointError",
        "UnpicklingError",
    )


@pytest.fixture(scope="module")
def hardened(folder: Path) -> dict[str, Any]:
    return run_child(folder / "child.py", str(folder), "auto")


def test_torch_unpickler_never_reads_a_file(hardened: dict[str, Any], folder: Path) -> None:
    """Counted over every torch.load above (not torch.distributed's private stream reader,
    which reads its own framing with torch's weights-only unpickler: a documented limit)."""
    assert hardened["clean"] is True
    assert hardened["weights_only_unpickler_calls"] == 0, hardened["weights_only_unpickler_stacks"]
    assert not (folder / "marker").exists()


def test_a_deep_tuple_key_is_refused_instead_of_crashing(hardened: dict[str, Any]) -> None:
    """torch's weights-only unpickler hashes the key in C: the process died (SIGSEGV)."""
    assert _refused(hardened["deep_tuple_key"]), hardened["deep_tuple_key"]


def test_a_length_claim_is_a_typed_refusal(hardened: dict[str, Any]) -> None:
    """9 bytes claiming 2**60 bytes: torch's unpickler raised a bare MemoryError."""
    assert _refused(hardened["length_claim"]), hardened["length_claim"]


def test_torch_registrations_are_honoured(hardened: dict[str, Any], folder: Path) -> None:
    assert _refused(hardened["box_unregistered"])
    if not hardened["registrations"]:
        pytest.skip(f"torch {torch.__version__} has no add_safe_globals")
    assert hardened["box_registered"] == {"value": "7"}
    if "box_in_context" in hardened:
        assert hardened["box_in_context"] == {"value": "7"}
        assert _refused(hardened["box_after_context"])
    # a registration cannot open the deny list
    payload = hardened["payload_registered"]
    assert _refused(payload) and "denied (cannot be allowed)" in payload["message"]
    assert not (folder / "marker").exists()


def test_torch_distributed_streaming_load_cannot_run_code(
    hardened: dict[str, Any], folder: Path
) -> None:
    if "streaming" not in hardened:
        pytest.skip(f"torch {torch.__version__} has no torch.distributed._serialization")
    assert _refused(hardened["streaming"]), hardened["streaming"]
    assert "torch.serialization._load" in hardened["streaming"]["message"]
    assert not (folder / "marker").exists()


def test_a_reference_taken_before_install_cannot_run_code(folder: Path) -> None:
    late = run_child(
        folder / "child.py", str(folder), "late", COMPATSHIM_AUTO="0", COMPATSHIM_SAFE_LOAD="0"
    )
    for key in ("late_poisoned", "late_poisoned_legacy", "wrapper_poisoned"):
        assert _refused(late[key]), (key, late[key])
    assert "torch.serialization._" in late["late_poisoned"]["message"]
    assert late["late_clean_weights_only"] == {"value": "['bias', 'weight']"}
    assert not (folder / "marker").exists()


def test_the_doctor_names_what_hardened_mode_does_not_cover(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from compatshim.checkpoint.doctor import safe_load_row

    monkeypatch.setenv("COMPATSHIM_SAFE_LOAD", "1")
    monkeypatch.delenv("COMPATSHIM_DISABLE", raising=False)
    detail = safe_load_row().detail
    assert "NOT covered: plain pickle" in detail
    assert "numpy.load(allow_pickle=True) by numpy-load-hardened" in detail
    assert "torch's own unpickler never sees the file" in detail
