"""``inspect``/``scan`` of numpy's ``.npy`` and ``.npz``: judged as hardened
``numpy.load(allow_pickle=True)`` reads them (patch ``numpy-load-hardened``), by that patch's
own reader. A folder walk skipped them: a payload beside the checkpoint passed the CI scan."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import types
from pathlib import Path

import pytest

from compatshim.checkpoint import CheckpointError, inspect
from compatshim.checkpoint._inspect import DANGEROUS, LOADABLE, NEEDS_ALLOW, targets

np = pytest.importorskip("numpy")

pytestmark = pytest.mark.timeout(300)
SRC = str(Path(__file__).resolve().parents[2] / "src")


class _Payload:
    """Pickles as os.system(touch MARK): a run would leave the marker file."""

    def __init__(self, mark: Path) -> None:
        self.mark = mark

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return os.system, (f"touch {self.mark}",)


def _objects(*items: object) -> object:
    array = np.empty(len(items), dtype=object)
    for i, item in enumerate(items):
        array[i] = item
    return array


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    """Files numpy itself writes, one per case."""
    mark = tmp_path / "RAN"
    made = {
        "plain": tmp_path / "plain.npy",
        "objects": tmp_path / "objects.npy",
        "unknown": tmp_path / "ns.npy",
        "payload": tmp_path / "payload.npy",
        "npz": tmp_path / "ok.npz",
        "npz_payload": tmp_path / "mixed.npz",
        "pickle": tmp_path / "pickled.npy",
    }
    np.save(made["plain"], np.arange(6.0).reshape(2, 3))
    np.save(made["objects"], _objects({"a": 1}, [1, 2], "x"), allow_pickle=True)
    np.save(made["unknown"], _objects(types.SimpleNamespace(a=1)), allow_pickle=True)
    np.save(made["payload"], _objects(_Payload(mark)), allow_pickle=True)
    np.savez_compressed(made["npz"], a=np.ones(3), b=_objects(1, "s"))
    np.savez(made["npz_payload"], a=np.ones(3), b=_objects(_Payload(mark)))
    made["pickle"].write_bytes(pickle.dumps({"x": 1}))  # numpy.load reads a pickle too
    return made


@pytest.mark.parametrize(
    ("case", "severity"),
    [
        ("plain", LOADABLE),
        ("objects", LOADABLE),
        ("unknown", NEEDS_ALLOW),
        ("payload", DANGEROUS),
        ("npz", LOADABLE),
        ("npz_payload", DANGEROUS),
        ("pickle", LOADABLE),
    ],
)
def test_numpy_files_are_judged_as_hardened_numpy_load_reads_them(
    files: dict[str, Path], case: str, severity: str
) -> None:
    info = inspect(files[case])
    assert info.severity == severity, info.refusals
    assert not (files[case].parent / "RAN").exists()
    if case == "unknown":
        assert info.needs_allow == ("types.SimpleNamespace",)
    if case == "npz_payload":
        assert info.container == "npz" and info.dangerous == ("posix.system",)


def test_the_verdict_is_hardened_numpy_load_s(files: dict[str, Path]) -> None:
    """The same files through ``numpy.load(allow_pickle=True)`` with the patch armed."""
    script = (
        "import sys, numpy\n"
        "for path in sys.argv[1:]:\n"
        "    try:\n"
        "        got = numpy.load(path, allow_pickle=True)\n"
        "        [got[k] for k in got.files] if hasattr(got, 'files') else None\n"
        "        print('loads')\n"
        "    except Exception as exc:\n"
        "        print(type(exc).__name__)\n"
    )
    paths = [str(p) for p in files.values()]
    done = subprocess.run(
        [sys.executable, "-c", script, *paths],
        capture_output=True, text=True, timeout=240,
        env={**os.environ, "PYTHONPATH": SRC, "COMPATSHIM_SAFE_LOAD": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    for path, outcome in zip(paths, done.stdout.split()):
        assert (inspect(path).severity == LOADABLE) == (outcome == "loads"), (path, outcome)


def test_inspect_in_a_hardened_process_judges_as_it_does_plain(files: dict[str, Path]) -> None:
    """Under ``COMPATSHIM_SAFE_LOAD=1`` the patch puts its entry in place of numpy's
    ``read_array``; ``inspect`` looked numpy's header parser up in that entry's globals and
    raised a bare ``KeyError: '_read_array_header'`` for every ``.npy`` and ``.npz`` (found
    running picklescan's test samples through ``inspect`` in a hardened process)."""
    script = (
        "import sys, numpy, compatshim.checkpoint as ck\n"
        "for path in sys.argv[1:]:\n"
        "    try:\n"
        "        print(ck.inspect(path).severity)\n"
        "    except Exception as exc:\n"
        "        print(type(exc).__name__)\n"
    )
    paths = [str(p) for p in files.values()]
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPATSHIM_")}
    done = subprocess.run(
        [sys.executable, "-c", script, *paths],
        capture_output=True, text=True, timeout=240,
        env={**env, "PYTHONPATH": SRC, "COMPATSHIM_AUTO": "1", "COMPATSHIM_SAFE_LOAD": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [inspect(p).severity for p in paths], done.stdout


def test_a_folder_walk_scans_npy_and_npz(files: dict[str, Path], tmp_path: Path) -> None:
    found = set(targets([tmp_path]))
    assert {str(p) for p in files.values()} <= found  # before: none of them
    done = subprocess.run(
        [sys.executable, "-m", "compatshim", "scan", str(tmp_path)],
        capture_output=True, text=True, timeout=240, env={**os.environ, "PYTHONPATH": SRC},
    )  # fmt: skip
    assert done.returncode == 3, done.stdout + done.stderr
    assert "dangerous   " in done.stdout and "payload.npy" in done.stdout
    assert not (tmp_path / "RAN").exists()


def test_a_header_past_numpy_s_limit_is_unreadable_and_not_parsed(tmp_path: Path) -> None:
    """allow_pickle=True lifts numpy's header limit; hardened numpy.load keeps it, so does
    the scan: a header of 1 MB of ``[0,0,...`` is refused by its length."""
    header = b"{'descr': '<f8', 'fortran_order': False, 'shape': (" + b"0," * 500_000 + b")}"
    path = tmp_path / "big.npy"
    path.write_bytes(b"\x93NUMPY\x02\x00" + len(header).to_bytes(4, "little") + header)
    with pytest.raises(CheckpointError, match="numpy's limit is 10000"):
        inspect(path)


def test_junk_is_unreadable_with_the_reason(tmp_path: Path) -> None:
    junk = tmp_path / "junk.npy"
    junk.write_bytes(b"hello world")
    with pytest.raises(CheckpointError, match=r"no \.npy or \.npz"):
        inspect(junk)


def test_a_cut_pickle_is_unreadable(tmp_path: Path) -> None:
    cut = tmp_path / "cut.npy"
    np.save(cut, _objects({"a": 1}), allow_pickle=True)
    cut.write_bytes(cut.read_bytes()[:-5])
    with pytest.raises(CheckpointError):
        inspect(cut)


def _damaged(tmp_path: Path) -> dict[str, Path]:
    """.npz files numpy writes, each then damaged in one way zipfile only sees reading the
    member: a CRC, a compression method, the encryption flag, the deflate data."""
    import io
    import struct

    def saved(compress: bool) -> bytearray:
        buffer = io.BytesIO()
        (np.savez_compressed if compress else np.savez)(buffer, a=_objects({"k": 1}))
        return bytearray(buffer.getvalue())

    made: dict[str, bytearray] = {}
    data = saved(False)
    data[data.rfind(b"PK\x01\x02") + 16] ^= 0xFF
    made["crc"] = data
    data = saved(False)
    at = data.rfind(b"PK\x01\x02")
    data[at + 10 : at + 12] = data[8:10] = struct.pack("<H", 99)
    made["method"] = data
    data = saved(False)
    data[data.rfind(b"PK\x01\x02") + 8] |= 1
    data[6] |= 1
    made["encrypted"] = data
    data = saved(True)
    start = 30 + sum(struct.unpack("<HH", data[26:30]))
    data[start : start + 4] = b"\xff\xff\xff\xff"
    made["deflate"] = data
    paths = {}
    for name, data in made.items():
        paths[name] = tmp_path / f"{name}.npz"
        paths[name].write_bytes(bytes(data))
    return paths


def test_a_damaged_npz_member_is_a_typed_error_and_the_scan_goes_on(tmp_path: Path) -> None:
    """zipfile's own errors reading a member (BadZipFile, NotImplementedError, RuntimeError,
    zlib.error) left inspect untyped: `compatshim scan` printed a traceback, exited 1
    ("needs an allow entry") and never reached the os.system pickle beside them."""
    damaged = _damaged(tmp_path)
    for name, path in damaged.items():
        with pytest.raises(CheckpointError, match=rf"{name}\.npz: member 'a\.npy': not readable"):
            inspect(path)
    (tmp_path / "z.pkl").write_bytes(pickle.dumps(_Payload(tmp_path / "RAN")))
    done = subprocess.run(
        [sys.executable, "-m", "compatshim", "scan", "--json", str(tmp_path)],
        capture_output=True, text=True, timeout=240, env={**os.environ, "PYTHONPATH": SRC},
    )  # fmt: skip
    assert done.returncode == 3 and "Traceback" not in done.stderr, done.stdout + done.stderr
    import json

    found = {Path(row["path"]).name: row for row in json.loads(done.stdout)["files"]}
    assert found["z.pkl"]["severity"] == DANGEROUS, found
    assert all("not readable" in found[f"{n}.npz"]["error"] for n in damaged), found
    assert not (tmp_path / "RAN").exists()
