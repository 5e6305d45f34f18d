"""Every ``map_location`` form places storages as ``torch.load(weights_only=True)`` does.

Files saved on the CPU and files whose storages are tagged ``cuda:0`` (what a GPU run
writes; made here by replacing ``torch.serialization.location_tag`` while saving), in the
zip and the legacy format, read with each form torch takes. Where torch places them,
ours are the same (device, dtype, values, strides, storage sharing between views); where
torch cannot (a CUDA location on a machine without CUDA), ours is a CheckpointError. The
CUDA forms run on every machine: with CUDA they compare placements, without it they check
the error, so no test assumes either.
"""

from __future__ import annotations

import gc
import pickle
import resource
import weakref
import zipfile
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

import torch

from compatshim.checkpoint import CheckpointError, load
from tests.checkpoint.helpers import assert_same

CUDA = torch.cuda.is_available()
FORMS: dict[str, Any] = {
    "none": None,
    "cpu": "cpu",
    "device-cpu": torch.device("cpu"),
    "dict-cuda-to-cpu": {"cuda:0": "cpu"},
    "callable-same": lambda storage, location: storage,
    "callable-none": lambda storage, location: None,
    "cuda": "cuda",
    "device-cuda0": torch.device("cuda", 0),
    "dict-cpu-to-cuda": {"cpu": "cuda:0"},
    "callable-cuda": lambda storage, location: storage.cuda(0),
    "meta": "meta",
}


def state() -> dict[str, Any]:
    """A state dict with what placement must keep: views of one storage, dtypes, a Parameter."""
    torch.manual_seed(0)
    base = torch.arange(24, dtype=torch.float32)
    return {
        "weight": torch.randn(4, 3),
        "param": torch.nn.Parameter(torch.ones(3)),
        "frozen": torch.nn.Parameter(torch.ones(2), requires_grad=False),
        "base": base,
        "view": base[2:10],
        "strided": base.view(4, 6)[:, ::2],
        "transposed": base.view(4, 6).t(),
        "half": torch.arange(4, dtype=torch.float16),
        "int64": torch.arange(3),
        "bool": torch.tensor([True, False]),
        "empty": torch.empty(0, 3),
        "scalar": torch.tensor(3.5),
        "step": 7,
        "nested": {"lr": 1e-3, "betas": (0.9, 0.999), "list": [torch.zeros(2)]},
    }


def save(path: Path, saved_on: str, zip_format: bool = True) -> Path:
    """``state()`` as torch.save writes it on ``saved_on`` ("cpu" or "cuda:0")."""
    original = torch.serialization.location_tag
    if saved_on != "cpu":
        torch.serialization.location_tag = lambda storage: saved_on
    try:
        torch.save(state(), path, _use_new_zipfile_serialization=zip_format)
    finally:
        torch.serialization.location_tag = original
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Path]:
    folder = tmp_path_factory.mktemp("map_location")
    return {
        (on, fmt): save(folder / f"{on.replace(':', '')}-{fmt}.pt", on, fmt == "zip")
        for on in ("cpu", "cuda:0")
        for fmt in ("zip", "legacy")
    }


def test_the_cuda_saved_file_names_cuda(files: dict[tuple[str, str], Path]) -> None:
    with zipfile.ZipFile(files["cuda:0", "zip"]) as archive:
        pickle_name = next(n for n in archive.namelist() if n.endswith("/data.pkl"))
        data = archive.read(pickle_name)
    assert b"cuda:0" in data and b"cpu" not in data
    assert b"cuda:0" in files["cuda:0", "legacy"].read_bytes()


def torch_or_error(path: Path, map_location: Any, mmap: bool = False) -> Any:
    """torch.load's result, or what it raised placing a storage (no CUDA here, say; torch
    2.1 wraps that RuntimeError in an UnpicklingError; a CPU-only torch 2.13's
    ``storage.cuda(0)`` raises TypeError)."""
    try:
        return torch.load(str(path), map_location=map_location, weights_only=True, mmap=mmap)
    except (RuntimeError, TypeError, pickle.UnpicklingError) as exc:
        return exc


@pytest.mark.parametrize("fmt", ["zip", "legacy"])
@pytest.mark.parametrize("saved_on", ["cpu", "cuda:0"])
@pytest.mark.parametrize("form", list(FORMS))
def test_each_form_places_as_torch_does(
    files: dict[tuple[str, str], Path], form: str, saved_on: str, fmt: str
) -> None:
    path, map_location = files[saved_on, fmt], FORMS[form]
    expected = torch_or_error(path, map_location)
    if isinstance(expected, Exception):
        with pytest.raises(CheckpointError) as caught:
            load(path, map_location=map_location)
        assert f"saved on '{saved_on}'" in str(caught.value)
        assert "map_location" in str(caught.value)
        if not isinstance(expected, pickle.UnpicklingError):  # torch's own type, kept
            assert isinstance(caught.value, type(expected))
        return
    got = load(path, map_location=map_location)
    assert_same(expected, got)
    assert {t.device for t in tensors(got)} == {t.device for t in tensors(expected)}


@pytest.mark.parametrize("saved_on", ["cpu", "cuda:0"])
@pytest.mark.parametrize("form", ["none", "cpu", "dict-cuda-to-cpu", "callable-same", "cuda"])
def test_each_form_with_mmap(files: dict[tuple[str, str], Path], form: str, saved_on: str) -> None:
    path, map_location = files[saved_on, "zip"], FORMS[form]
    expected = torch_or_error(path, map_location, mmap=True)
    if isinstance(expected, Exception):
        with pytest.raises(CheckpointError, match=f"saved on '{saved_on}'"):
            load(path, map_location=map_location, mmap=True)
        return
    assert_same(expected, load(path, map_location=map_location, mmap=True))


def tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for item in value.values() for t in tensors(item)]
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in tensors(item)]
    return []


def test_cuda_saved_file_without_map_location_on_a_cpu_machine(
    files: dict[tuple[str, str], Path],
) -> None:
    if CUDA:
        pytest.skip("this machine has CUDA: a cuda-saved file loads to it (compared above)")
    assert "CUDA" in str(torch_or_error(files["cuda:0", "zip"], None))
    with pytest.raises(CheckpointError) as caught:
        load(files["cuda:0", "zip"])
    message = str(caught.value)
    assert "saved on 'cuda:0'" in message and "map_location='cpu'" in message
    assert "damaged" not in message


def test_a_device_index_the_machine_lacks_is_a_checkpoint_error(tmp_path: Path) -> None:
    path = save(tmp_path / "c.pt", "cuda:99")
    assert isinstance(torch_or_error(path, None), Exception)
    with pytest.raises(CheckpointError, match="saved on 'cuda:99'"):
        load(path)
    got = load(path, map_location={"cuda:99": "cpu"})
    assert_same(torch.load(path, map_location={"cuda:99": "cpu"}, weights_only=True), got)


def test_what_torch_cannot_place_fails_with_torchs_type_too(tmp_path: Path) -> None:
    """torch raises RuntimeError for a device the machine lacks; code catches it to retry on
    the CPU. Ours is a CheckpointError and that type as well, and survives pickling."""
    path = save(tmp_path / "c.pt", "cuda:99")
    theirs = torch_or_error(path, None)  # torch < 2.6 weights-only: wrapped in UnpicklingError
    assert type(theirs) in (RuntimeError, pickle.UnpicklingError) and "cuda" in str(theirs)
    try:
        got = load(path)
    except RuntimeError as error:
        assert isinstance(error, CheckpointError) and "saved on 'cuda:99'" in str(error)
        copied = pickle.loads(pickle.dumps(error))
        assert isinstance(copied, RuntimeError) and isinstance(copied, CheckpointError)
        assert copied.args == error.args and type(copied).__name__ == "CheckpointError"
        got = load(path, map_location="cpu")
    assert_same(torch.load(path, map_location="cpu", weights_only=True), got)


@pytest.mark.parametrize("kind", ["out-of-memory", "value-error"])
def test_a_callables_exception_keeps_its_type(
    files: dict[tuple[str, str], Path], kind: str
) -> None:
    """torch lets a map_location callable's exception through (CUDA out of memory is the one
    code catches: a smaller batch, or the CPU); ours is a CheckpointError and that type."""
    raised = torch.cuda.OutOfMemoryError if kind == "out-of-memory" else ValueError

    def fails(storage: Any, location: str) -> Any:
        raise raised("no room on the device")

    with pytest.raises((raised, pickle.UnpicklingError)):  # torch < 2.6 wraps RuntimeErrors
        torch.load(files["cpu", "zip"], map_location=fails, weights_only=True)
    with pytest.raises(raised) as ours:
        load(files["cpu", "zip"], map_location=fails)
    assert isinstance(ours.value, CheckpointError)
    assert f"map_location raised {raised.__name__}" in str(ours.value)


class _BuildsItself(Exception):
    def __init__(self, code: int, detail: str) -> None:
        super().__init__(f"{code}: {detail}")


def test_an_exception_that_builds_itself_is_a_plain_checkpoint_error(
    files: dict[tuple[str, str], Path],
) -> None:
    """A type whose ``__init__`` needs more than a message is not combined (it could fail)."""

    def fails(storage: Any, location: str) -> Any:
        raise _BuildsItself(7, "busy")

    with pytest.raises(CheckpointError, match="map_location raised _BuildsItself") as ours:
        load(files["cpu", "zip"], map_location=fails)
    assert not isinstance(ours.value, _BuildsItself)


def test_the_callable_sees_what_torch_passes(files: dict[tuple[str, str], Path]) -> None:
    """One call per storage with a CPU storage and the saved location; its result is kept."""

    def recorder(seen: list[Any]) -> Any:
        return lambda s, loc: seen.append((type(s), s.device.type, s.nbytes(), loc)) or s

    for path in files.values():
        theirs: list[Any] = []
        ours: list[Any] = []
        torch.load(path, map_location=recorder(theirs), weights_only=True)
        load(path, map_location=recorder(ours))
        assert ours == theirs and ours


@pytest.mark.parametrize(
    ("bad_form", "message"),
    [
        (lambda s, loc: torch.zeros(2), "returned Tensor"),
        (lambda s, loc: 1 / 0, "raised ZeroDivisionError"),
        ({"cuda:0": "no such device!"}, "not a device name"),
    ],
    ids=["returns-a-tensor", "raises", "bad-device-name"],
)
def test_a_wrong_map_location_is_a_checkpoint_error(
    files: dict[tuple[str, str], Path], bad_form: Any, message: str
) -> None:
    with pytest.raises(CheckpointError, match=message):
        load(files["cuda:0", "zip"], map_location=bad_form)


def test_map_location_of_another_type_is_a_type_error(files: dict[tuple[str, str], Path]) -> None:
    with pytest.raises(TypeError, match="map_location must be"):
        load(files["cpu", "zip"], map_location=3)


@pytest.mark.parametrize("form", ["none", "cpu", "callable-same", "meta"])
def test_the_result_is_freed_when_dropped(files: dict[tuple[str, str], Path], form: str) -> None:
    """No reference cycle keeps a load's storages: they go with the result, not at the next
    collection (a second load would otherwise page-fault fresh memory: 1.48x torch.load)."""
    path = files["cpu", "zip"]
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        got = load(path, map_location=FORMS[form])
        alive = weakref.ref(got["weight"])
        del got
        assert alive() is None, "the loaded tensors outlive the result until gc runs"
    finally:
        if enabled:
            gc.enable()


BIG = 4 * 8 * 2**20  # bytes of tensor data in each ``big_files`` file


@pytest.fixture(scope="module")
def big_files(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Path]:
    """Four 8 MiB tensors, saved on the CPU and tagged cuda:0, in both formats."""
    folder = tmp_path_factory.mktemp("map_location_big")
    tensors = {f"w{i}": torch.full((BIG // 16,), float(i)) for i in range(4)}
    out = {}
    original = torch.serialization.location_tag
    for on in ("cpu", "cuda:0"):
        for fmt in ("zip", "legacy"):
            if on != "cpu":
                torch.serialization.location_tag = lambda storage, on=on: on
            try:
                out[on, fmt] = path = folder / f"{on.replace(':', '')}-{fmt}.pt"
                torch.save(tensors, path, _use_new_zipfile_serialization=fmt == "zip")
            finally:
                torch.serialization.location_tag = original
    return out


@pytest.mark.parametrize("saved_on", ["cpu", "cuda:0"])
@pytest.mark.parametrize("fmt", ["zip", "legacy"])
@pytest.mark.parametrize("form", ["none", "cpu", "device-cpu", "dict-cuda-to-cpu", "callable-same"])
def test_storages_are_read_once(
    big_files: dict[tuple[str, str], Path], saved_on: str, fmt: str, form: str
) -> None:
    """Each storage is copied once, into its tensor: the load faults in about one page per
    page of tensor data (a second copy, through a buffer or a placement copy to the CPU,
    faults more). Page faults, not time: they do not depend on the machine's load; fewer
    is fine (memory a previous load freed, reused)."""
    if saved_on != "cpu" and form == "none" and not CUDA:
        pytest.skip("a cuda:0 storage without map_location needs CUDA (tested above)")
    pages = BIG // resource.getpagesize()
    gc.collect()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    got = load(big_files[saved_on, fmt], map_location=FORMS[form])
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    assert float(got["w3"][-1]) == 3.0
    assert faults <= pages * 1.1 + 1000, f"{faults} page faults for {pages} pages of tensor data"
