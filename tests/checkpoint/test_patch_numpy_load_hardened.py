"""Patch ``numpy-load-hardened``: hardened mode covers ``numpy.load(allow_pickle=True)``.

Every file is read in a fresh interpreter started as a user's job starts
(``COMPATSHIM_AUTO=1 COMPATSHIM_SAFE_LOAD=1``: the start-up hook arms compatshim
before numpy is imported); a hostile file's payload would touch a marker file,
which must never exist. Genuine files must load as plain numpy loads them here.
The armed but not hardened control shows numpy's own behaviour: the payload runs.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import re
from pathlib import Path
from typing import Any

import pytest

np = pytest.importorskip("numpy")

from tests.checkpoint.test_hardened import TIMEOUT_S, Payload, run_child  # noqa: E402

pytestmark = pytest.mark.timeout(2 * TIMEOUT_S)
PATCH = "numpy-load-hardened"

# What a loaded value is, exactly (types, dtypes, shapes, bytes, items), as JSON-able text;
# the same code digests the child's result and plain numpy's here.
DIGEST = r"""
def digest(value):
    import numpy
    if isinstance(value, numpy.ndarray):
        if value.dtype.kind == "O":
            inner = [digest(v) for v in value.ravel(order="K")]
        else:
            inner = value.tobytes(order="A").hex()
        return ["ndarray", type(value).__name__, value.dtype.str, list(value.shape),
                bool(value.flags.f_contiguous and not value.flags.c_contiguous), inner]
    if isinstance(value, dict):
        return ["dict", type(value).__name__, [[digest(k), digest(v)] for k, v in value.items()]]
    if isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(value, key=repr) if isinstance(value, (set, frozenset)) else value
        return [type(value).__name__, [digest(v) for v in items]]
    return [type(value).__module__ + "." + type(value).__qualname__, repr(value)]
"""
_DIGEST: dict[str, Any] = {}
exec(DIGEST, _DIGEST)  # the same digest() here
digest = _DIGEST["digest"]

CHILD = (
    r"""
import io, json, pickle, sys

before = sorted(m for m in ("numpy", "torch") if m in sys.modules)
import numpy as np
import compatshim
"""
    + DIGEST
    + r"""

def outcome(path, **kwargs):
    try:
        loaded = np.load(path, allow_pickle=True, **kwargs)
        if hasattr(loaded, "files"):
            with loaded:
                loaded = {key: loaded[key] for key in loaded.files}
        return {"ok": True, "digest": json.loads(json.dumps(digest(loaded)))}
    except Exception as exc:
        cause = exc.__cause__
        return {
            "ok": False,
            "type": type(exc).__name__,
            "unpickling": isinstance(exc, pickle.UnpicklingError),
            "error": str(exc),
            "cause": None if cause is None else f"{type(cause).__name__}: {cause}",
        }


def readers():
    found = {}
    for name in ("format", "npyio", "_format_impl", "_npyio_impl"):
        module = sys.modules.get("numpy.lib." + name)
        if module is not None and "pickle" in vars(module):
            found[name] = type(vars(module)["pickle"]).__name__
        if module is not None and "_read_array_header" in vars(module):
            found[name + "._read_array_header"] = type(vars(module)["_read_array_header"]).__name__
    return found


def row():
    for status in compatshim.status():
        if status.name == "numpy-load-hardened":
            return {"defect": status.defect, "applied": status.applied, "fixed": status.fixed}
    return None


mode, paths = sys.argv[1], sys.argv[2:]
result = {"before": before, "status": row(), "readers": readers()}
if mode == "revert":
    compatshim.uninstall()
    result["reverted"] = readers()
    result["pickle_restored"] = all(
        vars(sys.modules["numpy.lib." + name])["pickle"] is pickle
        for name in result["readers"] if "." not in name
    )
    compatshim.install()
    compatshim.install()  # idempotent
    result["again"] = readers()
    result["status_again"] = row()
elif mode == "sequence":  # arrays np.save'd one after another into one file, read in turn
    import gzip
    with (gzip.open if paths[0].endswith(".gz") else open)(paths[0], "rb") as file:
        result["digest"] = digest([np.load(file, allow_pickle=True) for _ in range(3)])
elif mode == "counted":  # read through a file that counts the bytes taken from the disk
    import gzip, resource, time

    class Counting(io.FileIO):
        taken = 0

        def read(self, size=-1):
            data = super().read(size)
            Counting.taken += len(data)
            return data

        def readinto(self, buffer):
            got = super().readinto(buffer)
            Counting.taken += got or 0
            return got

    result["files"] = {}
    for p in paths:
        Counting.taken = 0
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        start = time.perf_counter()
        with Counting(p) as raw:
            found = outcome(gzip.GzipFile(fileobj=raw) if p.endswith(".gz") else raw)
        found["seconds"] = time.perf_counter() - start
        found["peak_kib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base
        found["taken"] = Counting.taken
        result["files"][p] = found
elif mode.startswith("kwargs="):
    result["files"] = {p: outcome(p, **json.loads(mode[len("kwargs=") :])) for p in paths}
elif mode == "header":  # allow_pickle=True, then a file without objects as numpy advises
    import resource
    result["files"] = {}
    for p in paths:
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        found = outcome(p)
        found["peak_kib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base
        try:
            found["explicit"] = digest(np.load(p, allow_pickle=False, max_header_size=10**6))
        except Exception as exc:
            found["explicit"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        result["files"][p] = found
elif mode.startswith("encoding="):
    result["files"] = {p: outcome(p, encoding=mode[len("encoding=") :]) for p in paths}
else:
    result["files"] = {p: outcome(p) for p in paths}
result["torch_imported"] = "torch" in sys.modules  # loading numpy files needs no torch
from compatshim._engine import decisions
result["decisions"] = decisions.recent("numpy-load-hardened")
print("RESULT " + json.dumps(result))
"""
)


def _run(tmp_path: Path, mode: str, *paths: Path, hardened: bool = True) -> dict[str, Any]:
    script = tmp_path / "npload_child.py"
    script.write_text(CHILD)
    env = {} if hardened else {"COMPATSHIM_SAFE_LOAD": "0"}
    return run_child(script, mode, *map(str, paths), **env)


def _plain(path: Path, **kwargs: Any) -> Any:
    loaded = np.load(path, allow_pickle=True, **kwargs)
    if hasattr(loaded, "files"):
        with loaded:
            loaded = {key: loaded[key] for key in loaded.files}
    return digest(loaded)


def _hostile(tmp_path: Path, marker: Path) -> list[Path]:
    """An object .npy, an .npz holding one beside a plain array, and a pickle file."""
    evil = np.array([1, Payload(marker)], dtype=object)
    npy = tmp_path / "evil.npy"
    np.save(npy, evil, allow_pickle=True)
    npz = tmp_path / "evil.npz"
    np.savez(npz, fine=np.arange(3), evil=evil)
    compressed = tmp_path / "evil_compressed.npz"
    np.savez_compressed(compressed, evil=evil)
    pkl = tmp_path / "evil.pkl"
    pkl.write_bytes(pickle.dumps({"weights": [1.0], "hook": Payload(marker)}, protocol=4))
    return [npy, npz, compressed, pkl]


def _assert_patched(result: dict[str, Any]) -> None:
    assert result["before"] == [], "compatshim imported numpy or torch at start-up"
    assert result["status"] == {"defect": "present", "applied": True, "fixed": True}, result
    assert result["readers"] and set(result["readers"].values()) == {
        "SafePickle",
        "BoundedHeader",
    }, result
    assert not result["torch_imported"], result


def test_hardened_refuses_hostile_object_arrays_and_pickles(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    files = _hostile(tmp_path, marker)
    result = _run(tmp_path, "load", *files)
    assert not marker.exists(), "a payload ran"
    _assert_patched(result)
    for path in files:
        got = result["files"][str(path)]
        assert not got["ok"], (path, got)
        assert got["unpickling"], got  # callers' `except pickle.UnpicklingError` still works
        # numpy's load wraps a pickle file's error in its own UnpicklingError: the cause names it
        text = got["error"] if path.suffix != ".pkl" else got["cause"]
        assert "posix.system refused" in text or "os.system refused" in text, got
        assert "COMPATSHIM_SAFE_LOAD=1" in text, got
    assert result["files"][str(files[0])]["type"] == "UnsafeCheckpointError"
    # one refusal a file, none from the probe that status() ran before them
    refused = [line for line in result["decisions"] if ": refused (" in line]
    assert len(refused) == len(files), result["decisions"]


class _SharedItems:
    """Pickles as an object array whose item list is one memoized list, shared by every array."""

    def __init__(self, items: list[int]) -> None:
        self.items = items

    def __reduce__(self) -> Any:
        reconstruct = np.array([1]).__reduce__()[0]
        state = (1, (len(self.items),), np.dtype(object), False, self.items)
        return (reconstruct, (np.ndarray, (0,), b"b"), state)


def test_shared_item_lists_are_charged_at_every_use(tmp_path: Path) -> None:
    """A 460 KB file whose 2 000 object arrays share one 100 000-item list would make numpy
    copy 1.6 GB of pointers; the loader's budget refuses it."""
    shared = list(range(100_000))
    path = tmp_path / "shared.pkl"
    path.write_bytes(pickle.dumps([_SharedItems(shared) for _ in range(2_000)], protocol=2))
    got = _run(tmp_path, "load", path)["files"][str(path)]
    assert not got["ok"] and got["unpickling"], got
    assert "work budget" in (got["cause"] or ""), got


def _genuine(tmp_path: Path) -> list[Path]:
    inner = np.array([None, "q", 2.5], dtype=object)
    mixed = np.empty(7, dtype=object)
    mixed[:] = [
        {"a": 1, "b": [1, 2, (3, "x")]},
        [1, 2, [3, [4]]],
        "text ü",
        np.arange(6, dtype=np.float32).reshape(2, 3),
        inner,
        None,
        (b"raw", 1.5, True, {1, 2}),
    ]
    fortran = np.asfortranarray(np.array([["a", 1], [None, 2.0]], dtype=object))
    paths = []
    for name, value in [
        ("mixed", mixed),
        ("fortran", fortran),
        ("empty", np.empty((0, 3), dtype=object)),
        ("zero_d", np.array({"k": "v"}, dtype=object)),
        ("plain", np.arange(10, dtype=np.int64)),
    ]:
        paths.append(tmp_path / f"{name}.npy")
        np.save(paths[-1], value, allow_pickle=True)
    paths.append(tmp_path / "both.npz")
    np.savez_compressed(paths[-1], objects=mixed, numbers=np.linspace(0, 1, 5))
    paths.append(tmp_path / "state.pkl")
    paths[-1].write_bytes(pickle.dumps({"step": 3, "arr": np.ones((2, 2)), "names": ["a"]}, 2))
    return paths


def test_hardened_loads_genuine_object_arrays_as_plain_numpy(tmp_path: Path) -> None:
    files = _genuine(tmp_path)
    result = _run(tmp_path, "load", *files)
    _assert_patched(result)
    for path in files:
        got = result["files"][str(path)]
        assert got["ok"], (path, got)
        assert got["digest"] == _plain(path), path
    # status() confirmed the fix by the probe, whose own harmless refusals are not the program's
    assert any("confirmed" in line for line in result["decisions"]), result["decisions"]
    assert not [line for line in result["decisions"] if "refused" in line], result["decisions"]


def test_the_stream_stays_after_each_pickle(tmp_path: Path) -> None:
    """``np.load`` called in turn on one open file reads the arrays saved into it in turn."""
    path = tmp_path / "three.npy"
    values = [np.array([{"a": 1}, [2]], dtype=object), np.array(["x", None], dtype=object)]
    with open(path, "wb") as file:
        for value in [*values, np.arange(3)]:
            np.save(file, value, allow_pickle=True)
    with open(path, "rb") as file:
        expected = digest([np.load(file, allow_pickle=True) for _ in range(3)])
    result = _run(tmp_path, "sequence", path)
    _assert_patched(result)
    assert result["digest"] == expected


def test_a_callable_inside_an_object_array_is_never_handed_back(tmp_path: Path) -> None:
    """numpy's ``_reconstruct`` is allow-listed to be called while loading, never returned."""
    from numpy.lib import format as npformat

    reconstruct = np.array([1, 2]).__reduce__()[0]
    path = tmp_path / "callable.npy"
    with open(path, "wb") as file:  # write_array pickles the array; its item is the function
        npformat.write_array(file, np.array([reconstruct], dtype=object), allow_pickle=True)
    got = _run(tmp_path, "load", path)["files"][str(path)]
    assert not got["ok"] and got["unpickling"], got
    assert "_reconstruct" in got["error"] and "as a value" in got["error"], got


def test_python2_text_is_read_as_numpy_reads_it(tmp_path: Path) -> None:
    """numpy decodes a Python 2 str with ``encoding=`` (a text codec, or ``"bytes"``: kept as
    bytes); hardened mode reads it the same way."""
    py2_ascii = tmp_path / "py2_ascii.pkl"  # protocol 2, ['cafe', 1] as Python 2 writes str
    py2_ascii.write_bytes(b"\x80\x02]q\x00(U\x04cafeq\x01K\x01e.")
    py2_latin = tmp_path / "py2_latin.pkl"  # the same with 'caf\xe9'
    py2_latin.write_bytes(b"\x80\x02]q\x00(U\x04caf\xe9q\x01K\x01e.")
    py3 = tmp_path / "py3.npy"
    np.save(py3, np.array(["café", b"\xe9", 1], dtype=object), allow_pickle=True)
    latin1 = _run(tmp_path, "encoding=latin1", py2_ascii, py2_latin, py3)["files"]
    as_bytes = _run(tmp_path, "encoding=bytes", py2_ascii, py2_latin, py3)["files"]
    for path in (py2_ascii, py2_latin, py3):
        assert latin1[str(path)]["digest"] == _plain(path, encoding="latin1"), path
        assert as_bytes[str(path)]["digest"] == _plain(path, encoding="bytes"), path


class _Pipe:
    """An unseekable stream (a socket, a pipe): read in one go, as ``pickle.load`` would."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def read(self, size: int = -1) -> bytes:
        data, self.data = self.data, b""
        return data

    def seekable(self) -> bool:
        return False


@pytest.mark.parametrize("patch", ["numpy_load_hardened", "torch_dcp_safe_metadata"])
def test_the_pickle_stand_in_reads_streams_and_bytes_and_refuses_alike(
    tmp_path: Path, patch: str
) -> None:
    """Both hardened patches hand their reader one ``SafePickle``: ``load`` (seekable or
    not) and ``loads`` read through compatshim's loader; a hostile pickle is refused the
    same way through each, nothing runs; the rest is the real module."""
    import importlib

    module = importlib.import_module(f"compatshim.patches.{patch}")
    stand_in = module.safe_pickle(pickle)
    if patch == "torch_dcp_safe_metadata":
        pytest.importorskip("torch.distributed.checkpoint")
    marker = tmp_path / "ran"
    genuine = pickle.dumps({"a": [1, 2.5, "x"], "b": (None, True)}, protocol=2)
    hostile = pickle.dumps({"hook": Payload(marker)}, protocol=2)
    for load in (
        lambda data: stand_in.load(_Pipe(data)),
        lambda data: stand_in.loads(data),
        lambda data: stand_in.load(__import__("io").BytesIO(data)),
    ):
        assert load(genuine) == {"a": [1, 2.5, "x"], "b": (None, True)}
        with pytest.raises(pickle.UnpicklingError, match="system refused") as refused:
            load(hostile)
        assert "COMPATSHIM_SAFE_LOAD=1" in str(refused.value)
    assert not marker.exists(), "a payload ran"
    assert stand_in.dumps is pickle.dumps and stand_in.UnpicklingError is pickle.UnpicklingError


def test_armed_but_not_hardened_is_numpy_s_own_behaviour(tmp_path: Path) -> None:
    """The control: the same object .npy runs its payload through numpy's pickle.load."""
    marker = tmp_path / "ran"
    npy = _hostile(tmp_path, marker)[0]
    result = _run(tmp_path, "load", npy, hardened=False)
    assert result["status"] == {"defect": "absent", "applied": False, "fixed": None}, result
    assert set(result["readers"].values()) == {"module", "function"}, result
    assert marker.exists()  # numpy ran os.system; numpy.load then returned the array
    assert result["files"][str(npy)]["ok"]


def test_uninstall_restores_numpy_s_pickle_and_install_is_idempotent(tmp_path: Path) -> None:
    result = _run(tmp_path, "revert")
    _assert_patched(result)
    assert set(result["reverted"].values()) == {"module", "function"}, result
    assert result["pickle_restored"]
    assert set(result["again"].values()) == {"SafePickle", "BoundedHeader"}, result
    assert result["status_again"]["applied"], result


def _npy_with_header(path: Path, body: bytes) -> Path:
    """An .npy (format 2.0: a 4-byte header length) whose header is ``body``, padded as numpy
    pads it."""
    size = ((len(body) + 12) // 64 + 1) * 64 - 12
    header = body.ljust(size - 1) + b"\n"
    path.write_bytes(b"\x93NUMPY\x02\x00" + len(header).to_bytes(4, "little") + header)
    return path


def test_hardened_keeps_numpy_s_header_limit(tmp_path: Path) -> None:
    """allow_pickle=True lifts numpy's 10 000-character header limit, and numpy hands the whole
    header to ast.literal_eval: a 2 MB list in it cost numpy about 950 MiB and 2 s here. Hardened,
    the limit stays: refused before parsing, with the way out numpy honours."""
    hostile = _npy_with_header(
        tmp_path / "header.npy",
        b"{'descr': '<f8', 'fortran_order': False, 'shape': (0,), 'x': [" + b"0," * 10**6 + b"]}",
    )
    wide = np.zeros(2, dtype=[(f"field_{i:04d}", "<f8") for i in range(800)])
    np.save(tmp_path / "wide.npy", wide)  # a genuine header over the limit (~21 000 characters)
    narrow = np.zeros(2, dtype=[(f"field_{i:04d}", "<f8") for i in range(300)])
    np.save(tmp_path / "narrow.npy", narrow)  # and one under it
    result = _run(tmp_path, "header", hostile, tmp_path / "wide.npy", tmp_path / "narrow.npy")
    _assert_patched(result)
    files = result["files"]
    for path in (hostile, tmp_path / "wide.npy"):
        found = files[str(path)]
        assert not found["ok"] and found["type"] == "ValueError", found
        assert "hardened mode keeps the 10000-character header limit" in found["error"]
        assert "loads with a larger max_header_size=" in found["error"]
    assert files[str(hostile)]["peak_kib"] < 64 * 1024, files[str(hostile)]  # numpy: ~950 MiB
    assert files[str(tmp_path / "wide.npy")]["explicit"] == digest(wide)  # numpy's way out
    assert files[str(tmp_path / "narrow.npy")]["ok"]
    assert files[str(tmp_path / "narrow.npy")]["digest"] == digest(narrow)


@pytest.mark.parametrize("safe_load", ["1", "0"])
def test_the_doctor_reports_the_patch(safe_load: str) -> None:
    """Hardened: present and fixed; otherwise off, naming what stays unsafe."""
    import json
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPATSHIM_")}
    env["COMPATSHIM_SAFE_LOAD"] = safe_load
    done = subprocess.run(
        [sys.executable, "-m", "compatshim", "doctor", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    checks = {c["name"]: c for c in json.loads(done.stdout)["checks"]}
    row = checks[PATCH]
    if safe_load == "1":
        assert (row["present"], row["fixed"]) == (True, True), row
        assert (
            "numpy.load(allow_pickle=True) by numpy-load-hardened"
            in (checks["checkpoint-safe-load"]["detail"])
        )
    else:
        # present (numpy.load unpickles with pickle.load), fixable, opt-in: not in force
        assert (row["present"], row["fixed"], row["in_force"]) == (True, True, False), row
        assert row["extra"]["arm"] == "COMPATSHIM_SAFE_LOAD=1 (hardened mode, opt-in)", row
        assert "off unless COMPATSHIM_SAFE_LOAD=1 (numpy.load(allow_pickle=True)" in row["detail"]


# ------------------------------------------------------------- compressed streams (issue 37)
def _npy(value: Any) -> bytes:
    import io

    buffer = io.BytesIO()
    np.save(buffer, value, allow_pickle=True)
    return buffer.getvalue()


def _compressed(folder: Path, stem: str, head: bytes, tail: bytes, repeat: int) -> list[Path]:
    """``head`` then ``tail`` ``repeat`` times, as a compressed .npz member and a .npy.gz."""
    import gzip
    import zipfile

    npz, gz = folder / f"{stem}.npz", folder / f"{stem}.npy.gz"
    with zipfile.ZipFile(npz, "w", zipfile.ZIP_DEFLATED) as archive:  # noqa: SIM117 (3.9)
        with archive.open("value.npy", "w", force_zip64=True) as member:
            member.write(head)
            for _ in range(repeat):
                member.write(tail)
    with gzip.open(gz, "wb") as stream:
        stream.write(head)
        for _ in range(repeat):
            stream.write(tail)
    return [npz, gz]


def test_a_compressed_stream_is_inflated_only_as_far_as_its_pickle(tmp_path: Path) -> None:
    """A small object array followed by 8 MiB that do not compress, in an .npz member and a
    .npy.gz: hardened, the loader's seeks to the end inflated the whole member three times
    (~26 MiB taken from the disk; a 1 GiB tail of zeros in a 1 MB file took 36-40 s against
    numpy's 0.07 s). Now only the pickle is read, as numpy reads it."""
    value = np.array([1, "x", {"k": [2.5]}], dtype=object)
    files = _compressed(tmp_path, "tail", _npy(value), os.urandom(1 << 20), 8)
    result = _run(tmp_path, "counted", *files)
    _assert_patched(result)
    for path in files:
        got = result["files"][str(path)]
        assert got["ok"], (path, got)
        assert got["digest"] == digest({"value": value} if path.suffix == ".npz" else value)
        assert got["taken"] < 1 << 20, (path, got["taken"])  # of 8 MiB on disk


def test_the_budget_is_the_bytes_actually_inflated(tmp_path: Path) -> None:
    """The budget is a multiple of the file's size; for a compressed stream it was the size a
    seek to the end found, so 64 MiB of zeros after the pickle (64 KB compressed) raised it
    eightfold and 100 object arrays sharing one 100 000-item list (80 MB of pointers from a
    400 KB pickle, refused alone) loaded. Now the budget counts the pickle's bytes only."""
    shared = list(range(100_000))
    value = np.empty(1, dtype=object)
    value[0] = [_SharedItems(shared) for _ in range(100)]
    files = _compressed(tmp_path, "shared", _npy(value), bytes(1 << 20), 64)
    result = _run(tmp_path, "counted", *files)
    for path in files:
        got = result["files"][str(path)]
        assert not got["ok"] and got["unpickling"], (path, got)
        charged = re.search(r"work budget of \d+ bytes for a file of (\d+) bytes", got["error"])
        assert charged and int(charged.group(1)) < 1 << 20, got  # the pickle's, not 64 MiB
        assert got["peak_kib"] < 64 * 1024, got


def test_arrays_saved_in_turn_into_one_gzip_stream_are_read_in_turn(tmp_path: Path) -> None:
    """The reader reads ahead of a pickle in a compressed stream: it puts the stream back just
    after the pickle, where numpy reads the next array."""
    import gzip

    path = tmp_path / "three.npy.gz"
    values = [np.array([{"a": 1}, [2]], dtype=object), np.array(["x", None], dtype=object)]
    with gzip.open(path, "wb") as file:
        for value in [*values, np.arange(3)]:
            np.save(file, value, allow_pickle=True)
    with gzip.open(path, "rb") as file:
        expected = digest([np.load(file, allow_pickle=True) for _ in range(3)])
    result = _run(tmp_path, "sequence", path)
    _assert_patched(result)
    assert result["digest"] == expected


def test_every_opcode_kind_is_stepped_over_in_a_compressed_pickle(tmp_path: Path) -> None:
    """Pickles of every protocol (text lines, GLOBAL's two lines, lengths of 1, 4 and 8 bytes,
    frames) in a gzip stream, each followed by bytes that are not pickle: read as numpy
    reads them."""
    import gzip

    value = {
        "a": [1, -2, 300, 2**40, 10**30, 2.5, "x", "ü" * 300, b"by", b"b" * 300, None, True],
        "t": (1, (2, 3)),
        "s": {1, 2},
        "f": frozenset({3}),
        "arr": np.arange(3.0),
    }
    files = []
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        files.append(tmp_path / f"p{protocol}.pkl.gz")
        with gzip.open(files[-1], "wb") as stream:
            stream.write(pickle.dumps(value, protocol=protocol) + b"trailing bytes")
    got = _run(tmp_path, "counted", *files)["files"]
    for path in files:
        with gzip.open(path, "rb") as stream:
            expected = digest(np.load(stream, allow_pickle=True))
        assert got[str(path)].get("digest") == expected, (path, got[str(path)])


def test_a_claimed_length_is_read_only_as_far_as_the_data_goes(tmp_path: Path) -> None:
    """A pickle claiming an 8-byte length of 2**62 bytes, then a line with no end: refused,
    typed, with no more memory than the data holds."""
    import gzip

    files = [tmp_path / "claim.pkl.gz", tmp_path / "line.pkl.gz", tmp_path / "cut.pkl.gz"]
    with gzip.open(files[0], "wb") as stream:
        stream.write(b"\x80\x04\x8e" + (2**62).to_bytes(8, "little") + bytes(1 << 20))
    with gzip.open(files[1], "wb") as stream:
        stream.write(b"\x80\x02V" + b"x" * (4 << 20))
    with gzip.open(files[2], "wb") as stream:
        stream.write(pickle.dumps(list(range(1000)), protocol=2)[:-10])
    got = _run(tmp_path, "counted", *files)["files"]
    for path in files:
        found = got[str(path)]
        assert not found["ok"] and found["unpickling"], (path, found)
        assert found["peak_kib"] < 32 * 1024, found


def test_an_explicit_max_header_size_is_honoured_with_allow_pickle(tmp_path: Path) -> None:
    """Do no harm (issue 37 item 10): numpy lifts its header limit with allow_pickle=True and
    hardened mode keeps it, but a caller's own max_header_size is that caller's limit, as numpy
    honours it without allow_pickle: 2**64 reads a genuine wide-header file as numpy does
    (.npy, .npz member, memory-mapped); a smaller one is still refused."""
    wide = np.zeros(2, dtype=[(f"field_{i:04d}", "<f8") for i in range(800)])  # ~21 000 chars
    np.save(tmp_path / "wide.npy", wide)
    np.savez(tmp_path / "wide.npz", wide=wide)
    files = [tmp_path / "wide.npy", tmp_path / "wide.npz"]
    for kwargs in ({"max_header_size": 2**64}, {"max_header_size": 30_000}):
        got = _run(tmp_path, "kwargs=" + json.dumps(kwargs), *files)["files"]
        for path in files:
            assert got[str(path)].get("digest") == _plain(path, **kwargs), (path, got)
    lifted = {"max_header_size": 2**64, "mmap_mode": "r"}
    got = _run(tmp_path, "kwargs=" + json.dumps(lifted), files[0])["files"]
    assert got[str(files[0])].get("digest") == _plain(files[0], **lifted), got
    for kwargs in ({}, {"mmap_mode": "r"}, {"max_header_size": 15_000}):
        got = _run(tmp_path, "kwargs=" + json.dumps(kwargs), *files)["files"]
        for path in files:
            found = got[str(path)]
            assert not found["ok"] and found["type"] == "ValueError", (path, kwargs, found)
            limit = kwargs.get("max_header_size", 10_000)
            assert f"keeps the {limit}-character header limit" in found["error"], found


def test_a_pickle_that_inflates_past_64_bytes_per_stored_byte_is_refused(tmp_path: Path) -> None:
    """An object .npy whose pickle is one 256 MiB bytes item of zeros: a 256 KB .npz member
    or .npy.gz. Hardened numpy.load inflated it whole (the read-ahead keeps the pickle: 300 MB
    of peak memory from a 300 KB file, 1 000 per byte); now it stops at 64 bytes per stored
    byte, typed, as hardened DCP stops a zstd item. Plain numpy reads it."""
    import gzip
    import io
    import zipfile

    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": "|O", "fortran_order": False, "shape": (1,)}
    )
    size = 256 << 20

    def write(stream: Any) -> None:
        stream.write(header.getvalue() + b"\x80\x04\x8e" + size.to_bytes(8, "little"))
        for _ in range(size >> 20):
            stream.write(bytes(1 << 20))
        stream.write(b"\x85.")  # TUPLE1, STOP: numpy hands back (bytes,)

    npz, gz = tmp_path / "bomb.npz", tmp_path / "bomb.npy.gz"
    with (
        zipfile.ZipFile(npz, "w", zipfile.ZIP_DEFLATED) as archive,
        archive.open("a.npy", "w", force_zip64=True) as member,
    ):
        write(member)
    with gzip.open(gz, "wb") as stream:
        write(stream)
    result = _run(tmp_path, "counted", npz, gz)
    _assert_patched(result)
    for path in (npz, gz):
        assert path.stat().st_size < 1 << 20
        got = result["files"][str(path)]
        assert not got["ok"] and got["unpickling"], (path, got)
        assert "it inflates past" in got["error"] and "64 per stored byte" in got["error"], got
        assert got["peak_kib"] < 64 * 1024, got


def _lying_npz(path: Path, size: int) -> None:
    """An .npz whose one member (an object .npy: one ``size``-byte bytes item of zeros) says in
    its zip headers that it is 0xFFFFFFFE bytes compressed: a 1.3 MB file."""
    import struct
    import zlib

    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": "|O", "fortran_order": False, "shape": (1,)}
    )
    head = header.getvalue() + b"\x80\x04\x8e" + size.to_bytes(8, "little")
    deflate = zlib.compressobj(9, zlib.DEFLATED, -15)
    packed, crc = [deflate.compress(head)], zlib.crc32(head)
    for _ in range(size >> 20):
        packed.append(deflate.compress(bytes(1 << 20)))
        crc = zlib.crc32(bytes(1 << 20), crc)
    packed += [deflate.compress(b"\x85."), deflate.flush()]
    crc = zlib.crc32(b"\x85.", crc)
    claimed, name = 0xFFFFFFFE, b"a.npy"
    local = struct.pack("<4s5H3L2H", b"PK\x03\x04", 20, 0, 8, 0, 0, crc, claimed, claimed,
                        len(name), 0) + name  # fmt: skip
    central = struct.pack("<4s6H3L5H2L", b"PK\x01\x02", 20, 20, 0, 8, 0, 0, crc, claimed,
                          claimed, len(name), 0, 0, 0, 0, 0, 0) + name  # fmt: skip
    body = local + b"".join(packed) + bytes(1 << 20)
    end = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, 1, 1, len(central), len(body), 0)
    path.write_bytes(body + central + end)


def _zipfile_refuses(npz: Path) -> bool:
    """Whether this Python's own zipfile refuses the lying member ("Overlapped entries ...
    (possible zip bomb)": its claimed size runs past the central directory), so no bound of
    ours is ever reached: CPython 3.14.10 and 3.15.2 here do, 3.11.7 and 3.12.1 do not."""
    import zipfile

    try:
        with zipfile.ZipFile(npz) as archive, archive.open("a.npy"):
            return False
    except zipfile.BadZipFile as exc:
        assert "Overlapped entries" in str(exc), exc
        return True


def test_an_npz_member_claiming_more_bytes_than_its_file_holds_is_bounded_by_the_file(
    tmp_path: Path,
) -> None:
    """The 64-per-stored-byte bound took the member's compressed size from the zip headers,
    which the file writes: a 1.3 MB file claiming 4 GB inflated a 256 MiB pickle (600 MiB
    from 2.7 MB: 1.26 GB of peak memory), and inspect called it loadable. The bound is now
    held to the archive's own size."""
    from compatshim.checkpoint import CheckpointError, inspect

    npz = tmp_path / "lying.npz"
    _lying_npz(npz, 256 << 20)
    assert npz.stat().st_size < 2 << 20
    result = _run(tmp_path, "counted", npz)
    _assert_patched(result)
    got = result["files"][str(npz)]
    if _zipfile_refuses(npz):  # refused before anything inflates, and said so
        assert not got["ok"] and "Overlapped entries" in got["error"], got
        with pytest.raises(CheckpointError, match="Overlapped entries"):
            inspect(npz)
        return
    assert not got["ok"] and got["unpickling"], got
    assert "it inflates past" in got["error"] and "64 per stored byte" in got["error"], got
    assert got["peak_kib"] < 160 * 1024, got
    with pytest.raises(CheckpointError, match="it inflates past"):
        inspect(npz)


@pytest.mark.parametrize("wrap", ["buffered", "tar"])
def test_a_lying_member_of_an_archive_that_is_no_plain_file_is_bounded_too(
    tmp_path: Path, wrap: str
) -> None:
    """The archive's size was read from fileno() or a BytesIO only: an .npz opened through a
    BufferedReader or from a tar member fell back to the size the member claims."""
    import contextlib
    import tarfile
    import zipfile

    from compatshim.checkpoint import CheckpointError
    from compatshim.patches.numpy_load_hardened import one_pickle

    npz = tmp_path / "lying.npz"
    _lying_npz(npz, 256 << 20)
    if _zipfile_refuses(npz):
        pytest.skip("this Python's zipfile refuses the lying member before numpy reads it")
    with contextlib.ExitStack() as stack:
        if wrap == "buffered":
            stream: Any = io.BufferedReader(io.BytesIO(npz.read_bytes()))  # type: ignore[arg-type]
        else:
            with tarfile.open(tmp_path / "a.tar", "w") as tar:
                tar.add(npz, "lying.npz")
            stream = stack.enter_context(tarfile.open(tmp_path / "a.tar")).extractfile("lying.npz")
        archive = stack.enter_context(zipfile.ZipFile(stream))
        member = stack.enter_context(archive.open("a.npy"))
        member.read(128)  # the .npy header, as numpy reads it
        with pytest.raises(CheckpointError, match=r"inflates past \d{8} bytes"):
            one_pickle(member)
