"""checkpoint.inspect and ``compatshim inspect``: what a file needs, without loading it."""

from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from compatshim.checkpoint import CheckpointError, UnsafeCheckpointError, inspect, load
from compatshim.checkpoint.inspect_cli import render
from tests.checkpoint.corpus import Scripted
from tests.checkpoint.helpers import Box, bytes_read


@pytest.fixture
def state_dict_file(tmp_path: Path) -> Path:
    path = tmp_path / "model.pt"
    model = torch.nn.Linear(4, 3)
    torch.save({"model": model.state_dict(), "args": argparse.Namespace(lr=0.1)}, path)
    return path


def test_zip_record(state_dict_file: Path) -> None:
    info = inspect(state_dict_file)
    assert info.container == "zip" and info.loadable
    assert info.tensors == 2 and info.storages == 2
    assert info.tensor_bytes == (12 + 3) * 4
    assert info.dtypes == {"float32": 2}
    names = {g.name: g for g in info.globals}
    assert names["argparse.Namespace"].covered and names["argparse.Namespace"].kind == "instance"
    assert names["torch._utils._rebuild_tensor_v2"].count == 2
    assert info.writer.byteorder == "little" and info.writer.archive_version == "3"
    assert json.loads(json.dumps(info.as_dict()))["loadable"] is True


def test_unknown_globals_are_listed(tmp_path: Path) -> None:
    path = tmp_path / "c.pt"
    torch.save({"box": Box(1)}, path)
    info = inspect(path)
    assert info.unknown == ("tests.checkpoint.helpers.Box",) and not info.loadable


def test_legacy_and_plain_pickle(tmp_path: Path) -> None:
    legacy = tmp_path / "legacy.pt"
    torch.save(
        {"w": torch.ones(5, dtype=torch.float64)}, legacy, _use_new_zipfile_serialization=False
    )
    info = inspect(legacy)
    assert info.container == "legacy" and info.tensor_bytes == 40 and info.loadable
    plain = tmp_path / "rng.pkl"
    plain.write_bytes(pickle.dumps({"numpy": np.random.get_state()}, protocol=4))
    info = inspect(plain)
    assert info.container == "pickle" and info.loadable and info.writer.pickle_protocol == 4
    assert info.writer.numpy_major == int(np.__version__.split(".")[0])


def test_torchscript_is_reported_and_refused(tmp_path: Path) -> None:
    path = tmp_path / "scripted.pt"
    torch.jit.save(torch.jit.script(Scripted()), str(path))
    info = inspect(path)
    assert info.container == "torchscript" and not info.loadable
    # torch.save's records say nothing of a jit file's writer (it said "torch 2.1 .. 2.5")
    assert info.writer.torch == "torch.jit.save (which torch release is not recorded)"
    text = render(info)
    assert "TorchScript archive holds code, which torch.jit.load runs" in text
    assert "treat it as an attack" not in text
    assert "tensors: not counted" in text and "pickle protocol None" not in text


def test_damaged_file_raises_checkpoint_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.pt"
    path.write_bytes(b"\x80\x02]q\x00(")
    with pytest.raises(CheckpointError):
        inspect(path)


def test_inspect_reads_no_tensor_data(tmp_path: Path) -> None:
    """load's machine gives the verdict with every storage on meta: the file's 16 MB of tensor
    data are never read (before, inspect read the pickle alone, torch-free)."""
    path = tmp_path / "big.pt"
    torch.save({"w": torch.zeros(1 << 22), "args": argparse.Namespace(lr=0.1)}, path)
    inspect(path)  # what it imports is read once
    before = bytes_read()
    info = inspect(path)
    assert info.loadable and info.tensor_bytes == 16 << 20
    assert bytes_read() - before < 1 << 20


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "compatshim", "inspect", *args], capture_output=True, text=True
    )


def test_a_numpy_npz_is_no_checkpoint_not_an_attack(tmp_path: Path) -> None:
    """``np.savez`` writes a zip whose records lie in no folder: not a torch checkpoint
    (unreadable, 2), where inspect and scan called it an attack (3: "outside the archive
    folder"). A record outside the folder of a torch zip stays dangerous (below). Named
    ``.npz``, it is judged as hardened ``numpy.load`` reads it (test_scan_numpy.py)."""
    path = tmp_path / "arrays.npz"
    np.savez(path, x=np.arange(3), y=np.ones(2))
    assert _cli(str(path)).returncode == 0
    path = path.rename(tmp_path / "weights.bin")  # by its contents, whatever its name
    done = _cli(str(path))
    assert done.returncode == 2, done.stderr
    assert "not a torch zip checkpoint: its first record 'x.npy'" in done.stderr


def test_an_allowed_global_that_cannot_be_imported_is_unreadable_here_not_an_attack(
    tmp_path: Path,
) -> None:
    """inspect's own advice followed (``COMPATSHIM_ALLOW=mod.Name``) where the module does not
    import (the ``compatshim`` console script puts no working directory on sys.path): it said
    DANGEROUS, "treat it as an attack" (3). Unreadable here (2), saying why; loadable (0)
    where the module imports."""
    (tmp_path / "user").mkdir()
    (tmp_path / "user" / "inspect_usermod.py").write_text("class Cfg:\n    pass\n")
    path = tmp_path / "custom.pkl"
    done = subprocess.run(
        [sys.executable, "-c", "import pickle, sys, inspect_usermod as m\n"
         "sys.stdout.buffer.write(pickle.dumps({'cfg': m.Cfg()}, protocol=2))"],
        capture_output=True, cwd=tmp_path / "user", check=True,
    )  # fmt: skip
    path.write_bytes(done.stdout)
    env = {**os.environ, "COMPATSHIM_ALLOW": "inspect_usermod.Cfg"}
    command = [sys.executable, "-m", "compatshim", "inspect", str(path)]
    lacking = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert lacking.returncode == 2, lacking.stdout + lacking.stderr
    assert "is allowed but cannot be imported here: No module named 'inspect_usermod'" in (
        lacking.stdout
    )
    assert "DANGEROUS" not in lacking.stdout and "attack" not in lacking.stdout
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "user"), env.get("PYTHONPATH", "")])
    there = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert there.returncode == 0, there.stdout + there.stderr


def test_a_warning_on_the_cli_is_one_line_of_its_text(tmp_path: Path) -> None:
    """A malformed allow entry is warned about as one line, not Python's warning format (a
    frame of heapq, then the console script's ``sys.exit(main())`` as the source line)."""
    unknown = tmp_path / "u.pkl"
    unknown.write_bytes(pickle.dumps({"box": Box(1)}))
    env = {**os.environ, "COMPATSHIM_ALLOW": "nodots,fractions.Fraction"}
    done = subprocess.run([sys.executable, "-m", "compatshim", "inspect", str(unknown)],
                          capture_output=True, text=True, env=env)  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines() == [
        "compatshim: 1 malformed allow entry skipped (the other entries of COMPATSHIM_ALLOW stay "
        "in force): COMPATSHIM_ALLOW: 'nodots' is not a 'module.name' global"
    ], done.stderr


def test_cli_exit_codes(state_dict_file: Path, tmp_path: Path) -> None:
    ok = _cli(str(state_dict_file))
    assert ok.returncode == 0 and "loadable" in ok.stdout
    as_json = _cli(str(state_dict_file), "--json")
    assert as_json.returncode == 0 and json.loads(as_json.stdout)["container"] == "zip"
    unknown = tmp_path / "u.pkl"
    unknown.write_bytes(pickle.dumps({"box": Box(1)}))
    refused = _cli(str(unknown))
    assert refused.returncode == 1 and "tests.checkpoint.helpers.Box" in refused.stdout
    damaged = tmp_path / "d.pt"
    damaged.write_bytes(b"PK\x03\x04 not really a zip")
    broken = _cli(str(damaged))
    assert broken.returncode == 2 and "Traceback" not in broken.stderr
    assert len(broken.stderr.strip().splitlines()) == 1
    missing = _cli(str(tmp_path / "absent.pt"))
    assert missing.returncode == 2 and "Traceback" not in missing.stderr


# ---------------------------------------------------------------- terminal injection
FORGED = "\x1b[2K\r  -> loadable by compatshim.checkpoint.load"
CONTROLS = ("\x1b", "\r", "\x9b", "\x7f", "\u202e", "\u2066", "\x00")


def _stack_global_pickle(*names: tuple[str, str]) -> bytes:
    """A protocol-4 dict {i: module.name}: STACK_GLOBAL takes any string as a name."""
    out = b"\x80\x04}"
    for i, (module, name) in enumerate(names):
        out += b"K" + bytes([i])
        for part in (module, name):
            raw = part.encode("utf-8", "surrogatepass")
            out += b"X" + len(raw).to_bytes(4, "little") + raw
        out += b"\x93s"
    return out + b"."


def _assert_clean(output: str) -> None:
    for char in CONTROLS:
        assert char not in output, repr(char)
    assert output.rstrip().splitlines()[-1] == "  -> NOT loadable as is"


def test_forged_global_names_are_escaped(tmp_path: Path) -> None:
    path = tmp_path / "forged.pkl"
    path.write_bytes(
        _stack_global_pickle(
            ("mylib", "Net" + FORGED),
            ("x\u202eevil", "y\u2066\x9b\x7f\x00"),
            ("a", "b" * 100_000),
        )
    )
    done = _cli(str(path))
    assert done.returncode == 1
    _assert_clean(done.stdout)
    assert "mylib.Net\\x1b[2K\\x0d  -> loadable" in done.stdout
    assert "x\\u202eevil.y\\u2066\\x9b\\x7f\\x00" in done.stdout
    assert len(done.stdout) < 5000  # the 100 000-character name is cut
    exact = json.loads(_cli(str(path), "--json").stdout)
    assert "mylib.Net" + FORGED in [g["name"] for g in exact["globals"]]


def test_forged_zip_names_and_records_are_escaped(tmp_path: Path) -> None:
    import zipfile

    path = tmp_path / "forged.pt"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/data.pkl", _stack_global_pickle(("mylib", "Net")))
        archive.writestr("archive/version", "3" + FORGED[:40])
        archive.writestr("archive/byteorder", "little\u202e")
    done = _cli(str(path))
    assert done.returncode == 2  # load cannot read the forged byteorder record: unreadable
    _assert_clean(done.stdout)
    assert "archive version 3\\x1b[2K\\x0d" in done.stdout
    outside = tmp_path / "outside.pt"
    with zipfile.ZipFile(outside, "w") as archive:
        archive.writestr("archive/data.pkl", b"\x80\x02}.")
        archive.writestr("evil" + FORGED + "\u202e/x", b"")
    done = _cli(str(outside))
    assert done.returncode == 3  # a record outside the archive folder: dangerous
    _assert_clean(done.stdout)


def test_forged_safetensors_names_and_metadata_are_escaped(tmp_path: Path) -> None:
    header = json.dumps(
        {
            "__metadata__": {"note" + FORGED: "\u202etxt.exe" + FORGED},
            "w" + FORGED: {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},
        }
    ).encode()
    path = tmp_path / "forged.safetensors"
    path.write_bytes(len(header).to_bytes(8, "little") + header + b"x")
    done = _cli(str(path))
    assert done.returncode == 0  # it is loadable: the point is that nothing is forged
    for char in CONTROLS:
        assert char not in done.stdout
    assert "w\\x1b[2K\\x0d  -> loadable" in done.stdout and "\\u202etxt.exe" in done.stdout


def test_error_messages_are_escaped(tmp_path: Path) -> None:
    """A storage key from the pickle reaches the one-line error on stderr."""
    import io
    import zipfile

    class Forging(pickle.Pickler):
        def persistent_id(self, obj: object) -> object:
            return ("storage", torch.FloatStorage, "0" + FORGED, "cpu", 1) if obj == "S" else None

    data = io.BytesIO()
    Forging(data, 2).dump({"a": "S"})
    path = tmp_path / "broken.pt"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/data.pkl", data.getvalue())
    done = _cli(str(path))
    assert done.returncode == 2 and "storage key '0\\\\x1b[2K\\\\r  -> loadable" in done.stderr
    for char in CONTROLS:
        assert char not in done.stderr


def test_a_refusal_message_and_warning_carry_the_name_escaped(tmp_path: Path) -> None:
    """The refusal's text (what a user prints, what a traceback shows, and the warning the
    armed torch.load prints unasked) carried a global's name raw; ``refused`` keeps it exact."""
    path = tmp_path / "forged.pkl"
    path.write_bytes(_stack_global_pickle(("mod" + FORGED, "fn\u202e")))
    with pytest.raises(UnsafeCheckpointError) as caught:
        load(path)
    assert caught.value.refused == ("mod" + FORGED + ".fn\u202e",)
    assert "mod\\x1b[2K\\x0d" in str(caught.value) and "fn\\u202e" in str(caught.value)
    script = (
        "import compatshim.auto, sys, torch\n"
        "try:\n    torch.load(sys.argv[1])\nexcept Exception:\n    pass"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(path)], capture_output=True, text=True, timeout=240,
        env={**os.environ, "COMPATSHIM_SAFE_LOAD": "1"},
    )  # fmt: skip
    assert "CheckpointRefusedWarning" in done.stderr, done.stderr
    for char in CONTROLS:
        assert char not in str(caught.value) and char not in done.stderr, repr(char)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(), max_size=300))
def test_cut_escapes_once_and_keeps_plain_names(text: str) -> None:
    from compatshim._text import cut, escaped

    shown = cut(text, 10_000)
    import unicodedata

    from compatshim._text import _ESCAPED

    assert shown == escaped(shown)  # nothing left to escape: messages built from messages agree
    assert not any(unicodedata.category(char) in _ESCAPED for char in shown)
    if text.isprintable():
        assert shown == text


def test_printable_is_bounded_and_unambiguous() -> None:
    from compatshim.checkpoint.inspect_cli import printable

    assert printable("plain.name") == "plain.name"
    assert printable("a\\x1b") == "a\\\\x1b"  # a literal backslash cannot pose as an escape
    assert printable("\x1b\r\x85\u202a\u2069\u2028\ud800\U000e0001") == (
        "\\x1b\\x0d\\x85\\u202a\\u2069\\u2028\\ud800\\U000e0001"
    )
    assert printable("\u00e9\u4e2d") == "\u00e9\u4e2d"  # letters stay readable
    shown = printable("\x1b" * 10**6, 100)
    assert len(shown) < 100 * 4 + 40 and shown.endswith("(1000000 characters)")


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(), max_size=300), st.integers(1, 120))
def test_printable_never_lets_a_control_through(text: str, limit: int) -> None:
    import unicodedata

    from compatshim.checkpoint.inspect_cli import printable

    shown = printable(text, limit)
    assert all(
        unicodedata.category(c) not in {"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"} for c in shown
    )
    assert len(shown) <= 10 * limit + 40


# ---------------------------------------------------------------- known gadgets and allow=
@pytest.mark.parametrize(
    "module, name",
    [
        ("os", "system"),
        ("posix", "system"),
        ("nt", "system"),
        ("subprocess", "Popen"),
        ("builtins", "eval"),
        ("builtins", "exec"),
        ("builtins", "getattr"),
        ("builtins", "__import__"),
        ("__builtin__", "open"),
        ("builtins", "compile"),
        ("importlib", "import_module"),
        ("runpy", "run_path"),
        ("pickle", "loads"),
        ("_pickle", "loads"),
        ("dill", "loads"),
        ("torch.serialization", "load"),
        ("torch.jit", "load"),
    ],
)
def test_known_gadgets_are_named_dangerous(tmp_path: Path, module: str, name: str) -> None:
    if (module, name) == ("builtins", "getattr"):
        pytest.skip("getattr is a rule entry now: test_getattr_reach_is_judged_by_the_rule")
    path = tmp_path / "gadget.pkl"
    path.write_bytes(_stack_global_pickle((module, name)))
    (use,) = inspect(path).globals
    assert not use.covered and use.dangerous and use.allow is None
    done = _cli(str(path))
    assert f"{use.name} x1: denied (cannot be allowed): {use.dangerous}" in done.stdout
    assert "UNKNOWN" not in done.stdout  # it said "UNKNOWN: not on compatshim's allowlist"
    assert "allow=" not in done.stdout
    assert json.loads(_cli(str(path), "--json").stdout)["globals"][0]["dangerous"]


def test_unknown_global_gets_the_line_that_allows_it(tmp_path: Path) -> None:
    path = tmp_path / "box.pt"
    torch.save({"box": Box(3)}, path)
    (use,) = [g for g in inspect(path).globals if not g.covered]
    assert use.dangerous is None
    assert use.allow == 'compatshim.checkpoint.load(path, allow=["tests.checkpoint.helpers.Box"])'
    import compatshim

    assert eval(use.allow, {"compatshim": compatshim, "path": path}) == {"box": Box(3)}
    done = _cli(str(path))
    assert f"to allow it for one call: {use.allow}" in done.stdout
    assert json.loads(_cli(str(path), "--json").stdout)["globals"][-1]["allow"] == use.allow


def test_getattr_reach_is_judged_by_the_rule(tmp_path: Path) -> None:
    """``getattr(Path, 'write_text')`` names a method the table does not list: not loadable,
    and no allow= line (allow= cannot open getattr); inspect agrees with load."""
    from pathlib import Path as P

    class Writes:
        def __reduce__(self) -> Any:
            return (P.write_text, (tmp_path / "marker", "ran"))

    path = tmp_path / "evil.pt"
    torch.save({"x": Writes()}, path)
    info = inspect(path)
    assert not info.loadable
    (use,) = [g for g in info.globals if g.name == "pathlib.Path.write_text"]
    assert use.allow is None and use.dangerous and "getattr" in use.dangerous
    with pytest.raises(UnsafeCheckpointError):
        load(path)
    assert not (tmp_path / "marker").exists()


# ---------------------------------------------------------------- inspect and load agree
def _storage_file(folder: Path, kind: bytes, rest: bytes, legacy_file: bool) -> Path:
    from tests.checkpoint.corpus import P2, STOP, legacy, n, t, torch_zip, u

    pid = t(u("storage"), kind, u("0"), u("cpu"), n(1), *((rest,) if legacy_file else ())) + b"Q"
    if legacy_file:
        return legacy(folder / "l.pt", P2 + pid + STOP, ["0"], n_bytes(1) + b"\0" * 4)
    return torch_zip(folder / "z.pt", P2 + pid + STOP, {"data/0": b"\0" * 4})


def n_bytes(count: int) -> bytes:
    return count.to_bytes(8, "little", signed=True)


def _verdicts(path: Path) -> tuple[str, str]:
    try:
        loadable = inspect(path).loadable
        seen = "loadable" if loadable else "refused"
    except CheckpointError:
        seen = "damaged"
    try:
        load(path)
        done = "loadable"
    except UnsafeCheckpointError:
        done = "refused"
    except CheckpointError:
        done = "damaged"
    return seen, done


@pytest.mark.parametrize("legacy_file", [False, True], ids=["zip", "legacy"])
@pytest.mark.parametrize(
    "kind",
    [
        b"X\x0c\x00\x00\x00FloatStorage",  # the storage type as a plain string
        b"ctorch\nfloat32\n",  # an allow-listed global that is no storage type
        b"ctorch\nFloatStorage\n)R",  # a storage type called
        b"cos\nsystem\n",  # a global off the allowlist
        b"ctorch\nFloatStorage\n",  # the real thing
    ],
    ids=["string", "dtype", "called", "foreign", "ok"],
)
def test_inspect_and_load_give_the_same_verdict_on_storage_ids(
    tmp_path: Path, kind: bytes, legacy_file: bool
) -> None:
    """One format reader: a verdict of ``inspect`` is the verdict of ``load``."""
    seen, done = _verdicts(_storage_file(tmp_path, kind, b"N", legacy_file))
    assert seen == done
    assert (seen == "loadable") == kind.endswith(b"FloatStorage\n")


@pytest.mark.parametrize(
    "view",
    [b"N", b"(X\x01\x00\x00\x001K\x00K\x01t", b"(X\x01\x00\x00\x001K\x00K\x09t", b"K\x05"],
    ids=["none", "inside", "past-the-end", "not-a-tuple"],
)
def test_inspect_and_load_agree_on_legacy_views(tmp_path: Path, view: bytes) -> None:
    seen, done = _verdicts(_storage_file(tmp_path, b"ctorch\nFloatStorage\n", view, True))
    assert seen == done
    assert (seen == "loadable") == (view in (b"N", b"(X\x01\x00\x00\x001K\x00K\x01t"))


# ------------------------------------------------- process-wide entries: inspect agrees with load
class Outer:
    class Inner:  # pickled as GLOBAL "tests.checkpoint.test_inspect" "Outer.Inner"
        def __init__(self, n: int = 1) -> None:
            self.n = n

        def __eq__(self, other: object) -> bool:
            return type(other) is type(self) and other.n == self.n


@pytest.fixture
def process_wide(monkeypatch: pytest.MonkeyPatch) -> Any:
    from compatshim.checkpoint import process_allow

    for name in ("COMPATSHIM_ALLOW", "COMPATSHIM_ALLOW_FILE"):
        monkeypatch.delenv(name, raising=False)
    process_allow._reset()
    yield process_allow
    process_allow._reset()


def _entry_point(folder: Path, monkeypatch: pytest.MonkeyPatch, listed: str) -> None:
    """An installed distribution whose ``compatshim.allow`` entry point lists ``listed``."""
    import importlib

    module = "compatshim_test_inspect_entries"
    (folder / f"{module}.py").write_text(f"ENTRIES = [{listed}]\n")
    info = folder / "compatshim_test_inspect-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: compatshim-test-inspect\n")
    (info / "entry_points.txt").write_text(f"[compatshim.allow]\nours = {module}:ENTRIES\n")
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.delitem(sys.modules, module, raising=False)
    importlib.invalidate_caches()


def _agree(path: Path) -> bool:
    seen, done = _verdicts(path)
    assert seen == done, (seen, done)
    return seen == "loadable"


def test_every_line_inspect_prints_allows_the_global(
    tmp_path: Path, process_wide: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each process-wide line ``compatshim inspect`` prints, applied as printed, makes
    inspect and load both accept the file; before, both refuse it."""
    import compatshim

    path = tmp_path / "box.pt"
    torch.save({"box": Box(3)}, path)
    assert not _agree(path)
    (use,) = [g for g in inspect(path).globals if not g.covered]
    code, env, line, entry_point = use.allow_everywhere
    printed = _cli(str(path)).stdout
    assert all(f"        {text}" in printed for text in use.allow_everywhere)

    eval(code.replace('"..."', '"the test"'), {"compatshim": compatshim})
    assert _agree(path) and load(path) == {"box": Box(3)}
    (allowed,) = [g for g in inspect(path).globals if g.name == use.name]
    assert allowed.covered and allowed.allowed_by == "compatshim.checkpoint.allow (the test)"
    from compatshim.checkpoint.inspect_cli import render

    shown = render(inspect(path))  # the CLI's text, in this process (code entries live here)
    assert "Box x1: allowed process-wide by compatshim.checkpoint.allow (the test)" in shown
    assert shown.endswith("-> loadable by compatshim.checkpoint.load")
    process_wide._reset()

    name, _, value = env.partition("=")
    monkeypatch.setenv(name, value)
    assert _agree(path)
    monkeypatch.delenv(name)
    process_wide._reset()

    listing = tmp_path / "allow.txt"
    listing.write_text(line.partition("   (")[0].replace("# reason", "# our boxes") + "\n")
    monkeypatch.setenv("COMPATSHIM_ALLOW_FILE", str(listing))
    assert _agree(path)
    (allowed,) = [g for g in inspect(path).globals if g.name == use.name]
    assert allowed.allowed_by == f"{listing}:1 (our boxes)"
    monkeypatch.delenv("COMPATSHIM_ALLOW_FILE")
    process_wide._reset()

    assert entry_point.startswith("[compatshim.allow] entry point returning ")
    _entry_point(tmp_path, monkeypatch, entry_point.rpartition(" returning ")[2][1:-1])
    assert _agree(path)


def test_the_cli_verdict_follows_process_wide_entries(
    tmp_path: Path, process_wide: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "box.pt"
    torch.save({"box": Box(3)}, path)
    assert _cli(str(path)).returncode == 1
    monkeypatch.setenv("COMPATSHIM_ALLOW", "tests.checkpoint.helpers.Box")
    done = _cli(str(path))
    assert done.returncode == 0 and "loadable by compatshim.checkpoint.load" in done.stdout
    found = json.loads(_cli(str(path), "--json").stdout)
    assert found["loadable"] and found["unknown"] == []
    (box,) = [g for g in found["globals"] if g["name"] == "tests.checkpoint.helpers.Box"]
    assert box["allowed_by"] == "COMPATSHIM_ALLOW (listed in COMPATSHIM_ALLOW)"


def test_a_nested_class_is_judged_by_the_split_the_pickle_writes(
    tmp_path: Path, process_wide: Any
) -> None:
    """Protocol 4 writes ``Outer.Inner`` as module + ``Outer.Inner`` (2 and 3 reach it
    through getattr, refused): the object names it, and so does the dotted string (one
    canonical name whatever the split: ``_names.canonical``); inspect agrees with load."""
    import compatshim

    path = tmp_path / "nested.pt"
    torch.save({"x": Outer.Inner(2)}, path, pickle_protocol=4)
    (use,) = [g for g in inspect(path).globals if not g.covered]
    assert use.name == "tests.checkpoint.test_inspect.Outer.Inner"
    assert use.allow is None and use.allow_everywhere == () and use.dangerous is None
    told = _cli(str(path)).stdout
    assert "a nested name: allow the object itself" in told
    assert "not a string" not in told and "a dotted string names it too" in told  # it does
    compatshim.checkpoint.allow("tests.checkpoint.test_inspect.Outer.Inner", reason="a string")
    assert _agree(path) and load(path) == {"x": Outer.Inner(2)}  # read through vars(Outer)
    compatshim.checkpoint.disallow("tests.checkpoint.test_inspect.Outer.Inner")
    assert not _agree(path)  # both refuse it again
    compatshim.checkpoint.allow(Outer.Inner, reason="the object")
    assert _agree(path) and load(path) == {"x": Outer.Inner(2)}


def test_process_wide_entries_never_open_getattr(tmp_path: Path, process_wide: Any) -> None:
    """A name reached through ``builtins.getattr`` is judged by the allowlist alone (the
    method here is harmless: ``pathlib.Path.write_text``, used before, is denied now)."""
    from fractions import Fraction

    import compatshim

    class Limits:
        def __reduce__(self) -> Any:
            return (Fraction.limit_denominator, (Fraction(1, 3), 2))

    path = tmp_path / "evil.pt"
    torch.save({"x": Limits()}, path)
    name = "fractions.Fraction.limit_denominator"
    compatshim.checkpoint.allow(name, reason="an attacker's hope")
    assert not _agree(path)
    (use,) = [g for g in inspect(path).globals if g.name == name]
    assert use.allowed_by is None and not use.covered


@pytest.mark.parametrize("source", ["code", "environment", "file"])
def test_a_global_allowed_from_each_source_is_judged_alike(
    source: str, tmp_path: Path, process_wide: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A protocol-4 pickle (STACK_GLOBAL): the same verdict before and after each source."""
    import compatshim

    path = tmp_path / "f.pkl"
    path.write_bytes(_stack_global_pickle(("fractions", "Fraction")))
    assert not _agree(path)
    if source == "code":
        compatshim.checkpoint.allow("fractions.Fraction", reason="ratios")
    elif source == "environment":
        monkeypatch.setenv("COMPATSHIM_ALLOW", "fractions.Fraction")
    else:
        (tmp_path / "a.txt").write_text("fractions.Fraction\n")
        monkeypatch.setenv("COMPATSHIM_ALLOW_FILE", str(tmp_path / "a.txt"))
    assert _agree(path)


_FIXTURES = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("saved_by", "path", "hint"),
    [
        (
            "torch 1.13.1",
            "zoo/lightning_fixtures/pl-1.4.9.ckpt",
            "torch < 2.1 (no byteorder record)",
        ),
        (
            "torch 2.1.2",
            "checkpoint/fixtures/torch2.1.2_numpy1.24.4/zip.pt",
            "torch 2.1 .. 2.5 (byteorder record, no .format_version)",
        ),
        (
            "torch 2.15.0",
            "checkpoint/fixtures/torch2.15.0_numpy2.4.6/zip.pt",
            "torch >= 2.6 (has .format_version)",
        ),
    ],
)
def test_the_writer_hint_of_real_files(saved_by: str, path: str, hint: str) -> None:
    """Files written by those releases (torch 2.0.1's ``_save`` writes no byteorder record
    either: read in its wheel; 2.1 is the first that does)."""
    assert inspect(_FIXTURES / path).writer.torch == hint, saved_by


# ---------------------------------------------------------------- bounded and typed (issue 37)
def _dag(depth: int) -> list[Any]:
    """A list whose two items are one list, ``depth`` deep: a few bytes pickled (memo
    references), ``2**depth`` items printed."""
    shared: list[Any] = []
    for _ in range(depth):
        shared = [shared, shared]
    return shared


def _hostile_metadata(kind: str) -> Any:
    """A DCP Metadata (torch's own dataclasses, pickled by pickle) with one field forged."""
    pytest.importorskip("torch.distributed.checkpoint")
    from torch.distributed.checkpoint import filesystem
    from torch.distributed.checkpoint import metadata as md

    def tensor(size: Any, properties: Any = None) -> Any:
        properties = properties or md.TensorProperties(dtype=torch.float32)
        return md.TensorStorageMetadata(properties, size, [])

    index = md.MetadataIndex("w", torch.Size([0]))
    forged: dict[str, Any] = {
        "size-str": md.Metadata({"w": tensor(["x"])}),
        "size-list": md.Metadata({"w": tensor([[1]])}),
        "size-huge": md.Metadata({"w": tensor((2**62,) * 64)}),
        "size-bigint": md.Metadata({"w": tensor((10**5000,))}),
        "path-dag": md.Metadata(
            {"w": tensor((2,))}, storage_data={index: filesystem._StorageInfo(_dag(60), 0, 1)}
        ),
        "state-list": md.Metadata([1]),  # type: ignore[arg-type]
        "key-int": md.Metadata({7: tensor((2,))}),  # type: ignore[dict-item]
        "properties-dag": md.Metadata({"w": tensor((2,), _dag(60))}),
        "entry-dag": md.Metadata({"w": _dag(60)}),  # type: ignore[dict-item]
    }
    return forged[kind]


HOSTILE_DCP = (
    "size-str",
    "size-list",
    "size-huge",
    "size-bigint",
    "path-dag",
    "state-list",
    "key-int",
    "properties-dag",
    "entry-dag",
)


def _dcp_folder(tmp_path: Path, kind: str) -> Path:
    folder = tmp_path / kind
    folder.mkdir()
    (folder / ".metadata").write_bytes(pickle.dumps(_hostile_metadata(kind)))
    assert (folder / ".metadata").stat().st_size < 3000  # 10**5000 is the biggest: 2.1 KB
    return folder


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", HOSTILE_DCP)
def test_a_forged_dcp_metadata_is_a_checkpoint_error(tmp_path: Path, kind: str) -> None:
    """Each field torch writes, forged: before, ``TypeError``/``ValueError`` escaped, a huge
    shape gave an ``OverflowError`` in the report (or a 2**4000-item tensor, "loadable") and
    a shared nested list as a data file's path printed for ever (a 0.8 KB file, > 70 s)."""
    with pytest.raises(CheckpointError) as caught:
        inspect(_dcp_folder(tmp_path, kind))
    assert type(caught.value) is CheckpointError and ".metadata" in str(caught.value)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["path-dag", "size-huge", "size-str"])
def test_the_cli_exits_2_on_a_forged_dcp_metadata(tmp_path: Path, kind: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "compatshim", "inspect", str(_dcp_folder(tmp_path, kind))],
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert done.stderr.startswith("compatshim inspect: ") and not done.stdout


def _many_globals(count: int, *extra: tuple[str, str]) -> bytes:
    """A protocol-4 dict {i: module.name} naming ``count`` distinct unknown globals (about
    20 bytes each: module names memoized by nothing, short) and then ``extra``."""
    out = bytearray(b"\x80\x04}")
    names = [(f"m{i % 97}", f"C{i}") for i in range(count)] + list(extra)
    for i, (module, name) in enumerate(names):
        out += b"J" + i.to_bytes(4, "little")
        for part in (module, name):
            raw = part.encode()
            out += b"\x8c" + bytes([len(raw)]) + raw
        out += b"\x93s"
    return bytes(out + b".")


_MEASURED = """
import json, sys, time
from compatshim.checkpoint import inspect
from compatshim.checkpoint.inspect_cli import render
start = time.perf_counter()
info = inspect(sys.argv[1])
out = json.dumps(info.as_dict(), indent=1) if sys.argv[2] == "json" else render(info)
seconds = time.perf_counter() - start
with open("/proc/self/status") as status:  # VmHWM: this image's peak (ru_maxrss keeps the
    peak = [l.split()[1] for l in status if l.startswith("VmHWM:")]  # parent's across exec)
print(json.dumps({"chars": len(out), "seconds": seconds, "peak_mib": int(peak[0]) / 1024}))
"""


@pytest.mark.timeout(300)
@pytest.mark.parametrize("form", ["text", "json"])
def test_a_file_naming_many_globals_gets_a_bounded_report(tmp_path: Path, form: str) -> None:
    """60 000 unknown globals and one denied (1.2 MB): before, 27 MB of text or 32 MB of
    JSON, 250 MB peak, 15 s; now the first 200 (the denied one first), then a count."""
    from compatshim.checkpoint._inspect import MAX_GLOBALS

    path = tmp_path / "many.pkl"
    path.write_bytes(_many_globals(60_000, ("posix", "system")))
    info = inspect(path)
    assert len(info.globals) == MAX_GLOBALS and not info.loadable
    assert info.globals_omitted == info.unknown_omitted == 60_001 - MAX_GLOBALS
    assert "posix.system" in [g.name for g in info.globals if g.dangerous]  # ranked first
    done = subprocess.run(
        [sys.executable, "-c", _MEASURED, str(path), form],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    measured = json.loads(done.stdout)
    assert measured["chars"] < 300_000, measured
    if sys.platform == "linux":
        assert measured["peak_mib"] < 100, measured
    shown = _cli(str(path), *(["--json"] if form == "json" else []))
    assert shown.returncode == 3 and len(shown.stdout) < 300_000  # dangerous: posix.system
    if form == "text":
        assert "globals (60001):" in shown.stdout
        assert f"... and {60_001 - MAX_GLOBALS} more, not listed" in shown.stdout
    else:
        assert json.loads(shown.stdout)["globals_omitted"] == 60_001 - MAX_GLOBALS
