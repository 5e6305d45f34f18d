"""Hardened ``torch.load`` against what torch's own serialization tests expect of it.

torch's ``test/test_serialization.py`` run plain, armed and hardened on torch 2.15
(``tests/checkpoint/upstream/run_torch_serialization.sh``, results in the README) found
where hardened mode read a file otherwise than torch: a zip archive that starts after
other data in a file object (torch reads it from where the file stands), ``encoding=``
for Python 2 ``str``, an empty storage named with two dtypes, ``MAP_SHARED``, and the
type of the error where torch reports a failure with its own (no such device, an
unseekable stream). Real
``torch.save`` output, loaded through the patched ``torch.load`` in this process.
"""

from __future__ import annotations

import collections
import io
import pickle
import struct
import sys
import warnings
import zipfile
from pathlib import Path
from typing import Any

import pytest
from packaging.version import Version

torch = pytest.importorskip("torch")

from compatshim.checkpoint import CheckpointError, UnsafeCheckpointError, inspect, load  # noqa: E402
from compatshim.checkpoint._container import read_zip_directory  # noqa: E402
from compatshim.patches.torch_load_safe_globals import CheckpointRefusedWarning  # noqa: E402
from tests.checkpoint.corpus import Scripted  # noqa: E402
from tests.checkpoint.helpers import legacy_bytes  # noqa: E402


def _after_a_pickle(obj: Any) -> io.BytesIO:
    """``pickle.dump(41, f); torch.save(obj, f)``, rewound to the start."""
    f = io.BytesIO()
    pickle.dump(41, f)
    torch.save(obj, f)
    f.seek(0)
    return f


def test_a_zip_archive_after_other_data_is_read_from_where_the_file_stands(
    torch_own: Any,
) -> None:
    state = {"w": torch.arange(6.0).reshape(2, 3), "n": 3}
    f = _after_a_pickle(state)
    pickle.load(f)
    try:
        torch_own(f)
    except RuntimeError:  # torch's reader (both loaders read records with it)
        pytest.skip(f"torch {torch.__version__} reads a zip archive only at the file's start")
    for reader in (torch_own, torch.load, load):  # torch's own, patched, compatshim's loader
        f = _after_a_pickle(state)
        assert pickle.load(f) == 41
        loaded = reader(f)
        assert loaded.keys() == state.keys() and loaded["n"] == 3
        assert torch.equal(loaded["w"], state["w"])


def test_the_zip_directory_counts_offsets_from_the_archive_start(torch_own: Any) -> None:
    f = _after_a_pickle({"w": torch.ones(2)})
    pickle.load(f)
    start = f.tell()
    directory = read_zip_directory(f, "f")
    assert f.tell() == start  # torch's reader takes the archive from here next
    assert {"data.pkl", "data/0"} <= directory.records.keys()
    info = inspect(f)  # reads records through their local headers, in the file
    f.seek(start)
    try:  # inspect's verdict is load's: where torch's reader needs the archive at the
        load(f)  # file's start (torch 2.1), load refuses it, and inspect says so
        refusals: tuple[str, ...] = ()
    except CheckpointError as exc:
        assert "failed finding central directory" in str(exc)
        refusals = info.refusals
        assert len(refusals) == 1 and "central directory" in refusals[0]
    assert (info.container, info.tensors, info.refusals) == ("zip", 1, refusals)
    f.seek(start)
    damaged = io.BytesIO(f.getvalue()[:start] + b"junk" + f.getvalue()[start:])
    damaged.seek(start)  # the recorded offsets no longer match: refused, not misread
    with pytest.raises(UnsafeCheckpointError):
        torch.load(damaged)


def _python2_text_file(text: str) -> bytes:
    """A legacy torch file whose first list item is a Python 2 ``str`` (SHORT_BINSTRING).

    torch.save writes Python 3 text (BINUNICODE); the opcode is rewritten the way
    Python 2 wrote ``str``; the legacy format has no offsets to fix up.
    """
    f = io.BytesIO()
    torch.save([text, torch.zeros(2)], f, _use_new_zipfile_serialization=False)
    raw = text.encode("utf-8")
    python3 = b"X" + struct.pack("<I", len(raw)) + raw
    data = f.getvalue()
    assert data.count(python3) == 1
    return data.replace(python3, b"U" + bytes([len(raw)]) + raw)


@pytest.mark.parametrize("text", ["ascii", "żółw"])
def test_python2_str_is_read_as_asked(torch_own: Any, text: str) -> None:
    """``encoding=`` as torch (pickle) reads it: a text codec, or ``"bytes"`` (kept as bytes;
    the storage ids' fields, Python 2 text too, are read as ASCII, as torch reads them)."""
    data = _python2_text_file(text)
    raw = text.encode("utf-8")
    for encoding in (None, "utf-8", "UTF8", "bytes", "latin-1"):
        kwargs = {} if encoding is None else {"encoding": encoding}
        theirs = torch_own(io.BytesIO(data), **kwargs)
        ours = torch.load(io.BytesIO(data), **kwargs)
        assert type(ours[0]) is type(theirs[0]) and ours[0] == theirs[0], encoding
        assert torch.equal(ours[1], theirs[1])
    assert torch.load(io.BytesIO(data), encoding="bytes")[0] == raw
    assert torch.load(io.BytesIO(data), encoding="latin-1")[0] == raw.decode("latin-1")
    with pytest.raises(UnsafeCheckpointError):  # bytes.decode takes text codecs only
        torch.load(io.BytesIO(data), encoding="zlib_codec")
    assert load(io.BytesIO(data))[0] == text  # checkpoint.load itself: UTF-8, as before


def test_python2_text_in_storage_ids_under_encoding_bytes(torch_own: Any) -> None:
    """torch's own fixture (``_test_serialization``): a Python 2 legacy file, every storage id
    field a Python 2 str, read with ``encoding="bytes"`` and ``"utf-8"``."""
    serialized = (
        b"\x80\x02\x8a\nl\xfc\x9cF\xf9 j\xa8P\x19.\x80\x02M\xe9\x03."
        b"\x80\x02}q\x01(U\x10protocol_versionq\x02M\xe9\x03U\n"
        b"type_sizesq\x03}q\x04(U\x03intq\x05K\x04U\x05shortq\x06K\x02U"
        b"\x04longq\x07K\x04uU\rlittle_endianq\x08\x88u.\x80\x02]q"
        b"\x01(U\x0e\xc5\xbc\xc4\x85\xc4\x85\xc3\xb3\xc5\xbc\xc4\x85"
        b"\xc5\xbcq\x02ctorch._utils\n_rebuild_tensor_v2\nq\x03((U"
        b"\x07storageq\x04ctorch\nFloatStorage\nq\x05U\x0845640624q"
        b"\x06U\x03cpuq\x07\x8a\x01\x01NtQK\x00K\x01\x85K\x01\x85"
        b"\x89NtRq\x08K\x02e.\x80\x02]q\x01U\x0845640624q\x02a.\x01\x00"
        b"\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    )
    utf8 = b"\xc5\xbc\xc4\x85\xc4\x85\xc3\xb3\xc5\xbc\xc4\x85\xc5\xbc"
    for encoding, first in (("utf-8", utf8.decode("utf-8")), ("bytes", utf8)):
        ours = torch.load(io.BytesIO(serialized), encoding=encoding)
        assert ours[0] == first and type(ours[0]) is type(first)
        assert torch.equal(ours[1], torch.zeros(1)) and ours[2] == 2
        assert str(torch_own(io.BytesIO(serialized), encoding=encoding)) == str(ours)


@pytest.mark.parametrize("zip_format", [True, False])
def test_an_empty_storage_named_with_two_types_loads_as_each(
    torch_own: Any, zip_format: bool
) -> None:
    """torch.save writes one key for an empty tensor and a TypedStorage of another dtype
    over its storage; torch loads it (test_save_different_dtype_unallocated). A storage
    with bytes named with two types stays refused (torch.save refuses to write one)."""
    warnings.simplefilter("ignore", UserWarning)  # TypedStorage is deprecated
    empty = torch.tensor([], dtype=torch.float16)
    other = torch.TypedStorage(wrap_storage=empty.untyped_storage(), dtype=torch.int64)
    f = io.BytesIO()
    torch.save([empty, other], f, _use_new_zipfile_serialization=zip_format)
    for reader in (torch_own, torch.load):
        loaded = reader(io.BytesIO(f.getvalue()))
        assert loaded[0].dtype == torch.float16 and loaded[0].numel() == 0
        assert loaded[1].size() == 0
    loaded = torch.load(io.BytesIO(f.getvalue()))
    assert loaded[1].dtype == torch.int64  # as saved (torch's own gives the first type)


def test_a_storage_with_bytes_named_with_two_types_is_still_refused() -> None:
    """A legacy file whose second storage id is rewritten to the first one's key."""
    import re

    f = io.BytesIO()
    saved = [torch.arange(4, dtype=torch.float32), torch.arange(2, dtype=torch.int64)]
    torch.save(saved, f, _use_new_zipfile_serialization=False)
    raw = f.getvalue()
    keys = list(dict.fromkeys(re.findall(rb"X[\x01-\x40]\x00\x00\x00(\d+)", raw)))
    assert len(keys) == 2
    if len(keys[0]) != len(keys[1]):
        pytest.skip("the two storage keys differ in length on this run")
    with pytest.raises(CheckpointError, match="declared twice"):
        load(io.BytesIO(raw.replace(keys[1], keys[0])))


@pytest.mark.skipif(
    not hasattr(torch.serialization, "set_default_mmap_options") or sys.platform == "win32",
    reason="torch maps files MAP_PRIVATE only here",
)
def test_mmap_follows_torchs_default_mmap_options(torch_own: Any, tmp_path: Path) -> None:
    """MAP_SHARED: writes to a tensor loaded with mmap=True reach the file, as with torch's
    own load (test_serialization_mmap_loading_options); MAP_PRIVATE: they do not."""
    import mmap

    path = tmp_path / "sd.pt"
    torch.save({"w": torch.ones(3)}, path)
    loaded = torch.load(path, mmap=True)
    loaded["w"][0] = 0
    assert torch.load(path, mmap=True)["w"][0] == 1
    torch.serialization.set_default_mmap_options(mmap.MAP_SHARED)
    try:
        for reader in (torch_own, torch.load):
            loaded = reader(path, mmap=True)
            loaded["w"][0] = 5
            assert torch.load(path, mmap=False)["w"][0] == 5
            loaded["w"][0] = 1
    finally:
        torch.serialization.set_default_mmap_options(mmap.MAP_PRIVATE)


def _cuda_tagged(path: Path, location: str) -> Path:
    """A real ``torch.save`` file whose storages are tagged ``location`` (as a GPU run's are)."""
    tag = torch.serialization.location_tag
    torch.serialization.location_tag = lambda storage: location
    try:
        torch.save({"w": torch.arange(3.0)}, path)
    finally:
        torch.serialization.location_tag = tag
    return path


def test_a_device_this_machine_lacks_fails_with_torchs_type_too(
    torch_own: Any, tmp_path: Path
) -> None:
    """torch's ``test_load_nonexistent_device``: a RuntimeError (torch < 2.6 weights-only:
    wrapped in UnpicklingError), which code catches to retry on the CPU. Hardened, the
    refusal is an UnpicklingError and a RuntimeError, whatever the release."""
    path = _cuda_tagged(tmp_path / "gpu.pt", "cuda:99")  # no machine here has 100 GPUs
    with pytest.raises(Exception) as theirs:
        torch_own(path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(UnsafeCheckpointError) as ours:
            torch.load(path)
    # torch fails the same way: no "refused by compatshim" warning, nothing was refused
    assert not [w for w in caught if issubclass(w.category, CheckpointRefusedWarning)]
    assert isinstance(ours.value, type(theirs.value)) and isinstance(ours.value, RuntimeError)
    assert isinstance(ours.value, pickle.UnpicklingError)
    assert "cuda:99" in str(ours.value)
    try:  # the pattern in user code: retry on the CPU
        loaded = torch.load(path)
    except RuntimeError:
        loaded = torch.load(path, map_location="cpu")
    assert torch.equal(loaded["w"], torch.arange(3.0))
    copied = pickle.loads(pickle.dumps(ours.value))  # a rank's error crosses processes
    assert isinstance(copied, RuntimeError) and isinstance(copied, UnsafeCheckpointError)
    assert copied.args == ours.value.args and copied.refused == ours.value.refused


class _NoSeek:
    """torch's ``test_load_error_msg`` stream: read and readline, no seek or tell."""

    def __init__(self, data: bytes) -> None:
        self._data = io.BytesIO(data)

    def read(self, size: int = -1) -> bytes:
        return self._data.read(size)

    def readline(self) -> bytes:
        return self._data.readline()


def test_an_unseekable_stream_fails_with_torchs_type_too(torch_own: Any) -> None:
    buffer = io.BytesIO()
    torch.save({"w": torch.ones(2)}, buffer)
    with pytest.raises(Exception) as theirs:
        torch_own(_NoSeek(buffer.getvalue()))
    assert "seekable" in str(theirs.value)
    with pytest.raises(UnsafeCheckpointError) as ours:
        torch.load(_NoSeek(buffer.getvalue()))
    assert isinstance(ours.value, type(theirs.value)) and type(theirs.value) is AttributeError
    assert "You can only torch.load from a file that is seekable" in str(ours.value)


def test_a_torchscript_archive_fails_with_torchs_type_too(torch_own: Any, tmp_path: Path) -> None:
    """torch's ``test_serialization_zipfile_actually_jit``: ``torch.load`` of a
    ``torch.jit.save`` archive, weights-only, is a RuntimeError ("Cannot use
    ``weights_only=True`` with TorchScript archives"), which code catches to fall back to
    ``torch.jit.load`` (its own choice; torch 2.1-2.4 ran it). Hardened, the refusal was an
    UnpicklingError only, so that fallback never ran (found by the suite run of 2026-12-06);
    it is a RuntimeError too now, and still names the refusal."""
    path = tmp_path / "model.pt"
    torch.jit.save(torch.jit.script(Scripted()), str(path))  # x + 1
    try:
        torch_own(path)
    except RuntimeError as theirs:
        assert "TorchScript" in str(theirs)
    else:  # torch 2.1-2.4 (at least) passed it to torch.jit.load, weights-only or not
        assert Version(torch.__version__).release < (2, 6), torch.__version__
    for reader in (torch.load, load):  # the patched torch.load and compatshim's loader
        with pytest.raises(UnsafeCheckpointError) as ours:
            reader(path)
        assert isinstance(ours.value, RuntimeError) and isinstance(
            ours.value, pickle.UnpicklingError
        )
        assert "TorchScript archive" in str(ours.value)
        assert ours.value.refused == ("TorchScript archive",)
    try:  # the pattern in user code: torch.load, else torch.jit.load
        model = torch.load(path)
    except RuntimeError:
        model = torch.jit.load(str(path))
    assert torch.equal(model(torch.zeros(2)), torch.ones(2))
    copied = pickle.loads(pickle.dumps(ours.value))
    assert isinstance(copied, RuntimeError) and copied.refused == ours.value.refused


DAMAGED = ("cut 30 bytes short", "cut after 200 bytes", "no data.pkl")


def _damaged_archive(name: str) -> bytes:
    if name == "no data.pkl":
        no_pickle = io.BytesIO()
        with zipfile.ZipFile(no_pickle, "w") as archive:
            archive.writestr("archive/version", "3\n")
        return no_pickle.getvalue()
    buffer = io.BytesIO()
    torch.save({"w": torch.ones(2)}, buffer)
    whole = buffer.getvalue()
    return whole[:200] if name == "cut after 200 bytes" else whole[:-30]


@pytest.mark.parametrize("name", DAMAGED)
def test_a_damaged_archive_fails_with_torchs_type_too(torch_own: Any, name: str) -> None:
    """A checkpoint cut short by a killed save: torch's zip reader raises a RuntimeError,
    which resume code catches to fall back to an older checkpoint. Hardened, it was an
    UnpicklingError only (and warned as a refusal); it is a RuntimeError too now, with
    compatshim's words, and no refusal is warned: torch fails the same way."""
    data = _damaged_archive(name)
    with pytest.raises(Exception) as theirs:
        torch_own(io.BytesIO(data))
    # torch < 2.6 wraps some in its weights-only UnpicklingError; ours is both types
    assert type(theirs.value) in (RuntimeError, pickle.UnpicklingError), theirs.value
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(UnsafeCheckpointError) as ours:
            torch.load(io.BytesIO(data))
    assert isinstance(ours.value, RuntimeError) and isinstance(ours.value, pickle.UnpicklingError)
    assert isinstance(ours.value, type(theirs.value))
    assert not [w for w in caught if issubclass(w.category, CheckpointRefusedWarning)]
    with pytest.raises(CheckpointError) as direct:
        load(io.BytesIO(data))
    assert isinstance(direct.value, RuntimeError)
    assert not isinstance(direct.value, UnsafeCheckpointError)  # damage, not a refusal
    assert "zip" in str(direct.value) or "data.pkl" in str(direct.value)


def test_an_empty_file_fails_with_torchs_type_too(torch_own: Any, tmp_path: Path) -> None:
    """A save that never wrote leaves an empty file: torch raises pickle's EOFError ("Ran
    out of input"), which code that skips such a file catches. Hardened, it was an
    UnpicklingError only; it is an EOFError too now."""
    path = tmp_path / "last.pt"
    path.write_bytes(b"")
    with pytest.raises(Exception) as theirs:
        torch_own(path)
    assert type(theirs.value) is EOFError
    with pytest.raises(UnsafeCheckpointError) as ours:
        torch.load(path)
    assert isinstance(ours.value, EOFError) and isinstance(ours.value, pickle.UnpicklingError)
    with pytest.raises(CheckpointError) as direct:
        load(path)
    assert isinstance(direct.value, EOFError) and "empty" in str(direct.value)


def test_a_legacy_file_cut_short_fails_with_torchs_type_too(torch_own: Any) -> None:
    """A legacy (``_use_new_zipfile_serialization=False``) file cut at every byte: where
    torch's weights-only load raises EOFError or UnpicklingError (the pickle ends early:
    "Ran out of input", "pickle data was truncated") or RuntimeError (storage data cut:
    "unexpected EOF"), hardened ``torch.load`` and ``checkpoint.load`` raise that type too,
    and no refusal is warned. Before, every cut but the empty file was a CheckpointError
    only (hardened: an UnpicklingError). Where torch's C unpickler fails on a length it
    cannot read (``struct.error``, ``IndexError``), ours stays a CheckpointError."""
    data = legacy_bytes()
    matched: collections.Counter[str] = collections.Counter()
    for cut in range(len(data)):
        try:
            torch_own(io.BytesIO(data[:cut]))
        except Exception as exc:  # torch's type is what is compared
            theirs = exc
        else:
            raise AssertionError(f"torch loaded the file cut at {cut}")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with pytest.raises(UnsafeCheckpointError) as ours:
                torch.load(io.BytesIO(data[:cut]))
        assert not [w for w in caught if issubclass(w.category, CheckpointRefusedWarning)], cut
        with pytest.raises(CheckpointError) as direct:
            load(io.BytesIO(data[:cut]))
        assert not isinstance(direct.value, UnsafeCheckpointError), (cut, direct.value)
        kind = type(theirs)
        if kind in (EOFError, pickle.UnpicklingError, RuntimeError):
            assert isinstance(ours.value, kind), (cut, theirs, ours.value)
            # torch < 2.6 wraps what its weights-only unpickler raised (storage data cut
            # short: a RuntimeError) in an UnpicklingError; compatshim's own load does not
            if "Weights only load failed" not in str(theirs):
                assert isinstance(direct.value, kind), (cut, theirs, direct.value)
            matched[kind.__name__] += 1
        matched["storage data"] += isinstance(direct.value, RuntimeError)
    # the file is cut inside the pickles and inside the storage data
    assert matched["EOFError"] and matched["UnpicklingError"] and matched["storage data"], matched
