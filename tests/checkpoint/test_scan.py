"""``compatshim scan`` and the severities ``inspect`` gives (issue 38 item 6): one verdict per
file or DCP folder, distinct exit codes, JSON whatever the outcome, the project's attack
corpus and real checkpoints judged as ``load`` judges them."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from compatshim.checkpoint import CheckpointError, UnsafeCheckpointError, inspect, load
from compatshim.checkpoint._gate import judge
from compatshim.checkpoint._inspect import (
    DANGEROUS,
    EXIT_CODES,
    LOADABLE,
    NEEDS_ALLOW,
    UNREADABLE,
    scan_one,
    targets,
)
from tests.checkpoint.helpers import Box

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.timeout(300)
TESTS = Path(__file__).resolve().parents[1]
SRC = str(TESTS.parent / "src")
FIXTURES = sorted((TESTS / "checkpoint" / "fixtures").glob("torch*/*.p*")) + sorted(
    (TESTS / "checkpoint" / "fixtures").glob("torch*/dcp.metadata")
)


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "compatshim", *args],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "PYTHONPATH": SRC, **(env or {})},
    )


def _os_system() -> bytes:
    return b"\x80\x02cposix\nsystem\nq\x00X\x04\x00\x00\x00trueq\x01\x85q\x02Rq\x03."


@pytest.fixture
def four(tmp_path: Path) -> dict[str, Path]:
    """One file of each severity: a denied global, an unknown class, a genuine state dict,
    a damaged zip."""
    (tmp_path / "d").mkdir()
    files = {
        DANGEROUS: tmp_path / "d" / "evil.pkl",
        NEEDS_ALLOW: tmp_path / "box.pt",
        LOADABLE: tmp_path / "model.pt",
        UNREADABLE: tmp_path / "d" / "broken.pt",
    }
    files[DANGEROUS].write_bytes(_os_system())
    torch.save({"box": Box(1)}, files[NEEDS_ALLOW])
    torch.save(torch.nn.Linear(2, 2).state_dict(), files[LOADABLE])
    files[UNREADABLE].write_bytes(b"PK\x03\x04 not really a zip")
    return files


def test_a_denied_global_is_dangerous_not_merely_unknown(four: dict[str, Path]) -> None:
    """Before: ``posix.system`` got the verdict and exit code of an unknown dataclass (1)."""
    for severity, path in four.items():
        assert scan_one(str(path)).severity == severity
        done = _cli("inspect", str(path))
        assert done.returncode == EXIT_CODES[severity], (severity, done.stdout, done.stderr)
    assert len({EXIT_CODES[s] for s in four}) == 4
    shown = _cli("inspect", str(four[DANGEROUS])).stdout
    assert "DANGEROUS" in shown and shown.rstrip().endswith("-> NOT loadable as is")


def test_inspect_json_on_failure(four: dict[str, Path], tmp_path: Path) -> None:
    """Before: ``inspect --json`` printed nothing on stdout when the file was unreadable."""
    for path in (four[UNREADABLE], tmp_path / "absent.pt"):
        done = _cli("inspect", str(path), "--json")
        assert done.returncode == 2 and "Traceback" not in done.stderr
        record = json.loads(done.stdout)
        assert record["severity"] == UNREADABLE and record["exit_code"] == 2 and record["error"]
    record = json.loads(_cli("inspect", str(four[DANGEROUS]), "--json").stdout)
    assert record["severity"] == DANGEROUS and record["exit_code"] == 3
    assert record["error"] is None and record["dangerous"] == ["posix.system"]


def test_scan_walks_folders_and_exits_with_the_worst(four: dict[str, Path], tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("not a checkpoint")  # not a checkpoint's suffix
    done = _cli("scan", str(tmp_path), "--json")
    assert done.returncode == 3, done.stderr
    report = json.loads(done.stdout)
    seen = {Path(f["path"]).name: f["severity"] for f in report["files"]}
    assert seen == {p.name: s for s, p in four.items()}
    assert report["counts"][DANGEROUS] == 1 and report["exit_code"] == 3
    (record,) = [f for f in report["files"] if f["severity"] == NEEDS_ALLOW]
    assert record["needs_allow"] == ["tests.checkpoint.helpers.Box"]
    four[DANGEROUS].unlink()
    assert _cli("scan", str(tmp_path)).returncode == 2  # the worst left: unreadable
    four[UNREADABLE].unlink()
    text = _cli("scan", str(tmp_path))
    assert text.returncode == 1 and text.stdout.splitlines()[-1].endswith("1 needs-allow")
    assert _cli("scan", str(four[LOADABLE])).returncode == 0


def test_nothing_to_scan_is_no_pass(tmp_path: Path) -> None:
    """A gate pointed at an empty or mistyped folder, or one whose files have no checkpoint's
    name, scanned nothing: exit 2 with a line that says so, never 0 (as pytest's exit 5)."""
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    done = _cli("scan", str(tmp_path))
    assert done.returncode == 2 and not done.stdout, done
    assert done.stderr.startswith(f"compatshim scan: nothing to scan under {tmp_path}: ")
    assert "*.pt" in done.stderr and "name a file" in done.stderr
    report = json.loads(_cli("scan", "--json", str(tmp_path)).stdout)
    assert report["files"] == [] and report["exit_code"] == 2
    assert report["error"].startswith("nothing to scan")
    torch.save({"w": torch.zeros(1)}, tmp_path / "model.pt")
    report = json.loads(_cli("scan", "--json", str(tmp_path)).stdout)
    assert report["exit_code"] == 0 and report["error"] is None


def test_a_dcp_folder_is_judged_as_torch_s_dcp_load_reads_it(tmp_path: Path) -> None:
    """Before: ``inspect FOLDER`` said "loadable by compatshim.checkpoint.load", which raises
    IsADirectoryError on it; a folder of ``.distcp`` files without ``.metadata`` was
    reported only as "Is a directory"."""
    pytest.importorskip("torch.distributed.checkpoint")
    from tests.checkpoint.dcp_kit import poison_metadata, save, state

    genuine = tmp_path / "run" / "step-1"
    save(genuine, state())
    info = inspect(genuine)
    assert info.severity == LOADABLE and info.loaded_by.startswith("torch.distributed")
    with pytest.raises(IsADirectoryError):
        load(genuine)
    assert "loadable by torch.distributed.checkpoint.load" in _cli("inspect", str(genuine)).stdout
    marker = tmp_path / "ran"
    poison_metadata(genuine, tmp_path / "run" / "step-2", marker)
    truncated = tmp_path / "run" / "step-3"
    save(truncated, state())
    (truncated / ".metadata").unlink()
    done = _cli("inspect", str(truncated))
    assert done.returncode == 2 and "a DCP folder without its .metadata" in done.stderr
    plain = _cli("inspect", str(tmp_path / "run"))
    assert plain.returncode == 2 and "compatshim scan" in plain.stderr
    assert list(targets([tmp_path / "run"])) == [
        str(tmp_path / "run" / f"step-{n}") for n in (1, 2, 3)
    ]
    report = json.loads(_cli("scan", str(tmp_path / "run"), "--json").stdout)
    assert [f["severity"] for f in report["files"]] == [LOADABLE, DANGEROUS, UNREADABLE]
    assert not marker.exists()


# Unsafe corpus cases that load refuses only for globals off the allowlist which the deny
# list does not hold: needs-allow, each named (allowed, load calls it, and the file's own
# arguments decide what follows). Every other unsafe case is dangerous.
NEEDS_ALLOW_CASES = {
    "numpy_matrix_subclass",  # numpy.matrix
    "numpy_recarray_subclass",  # numpy.rec.recarray, numpy.record
    "real_tensor_subclass",  # tests.checkpoint.corpus.TensorSubclass (a genuine one too)
    "rebuild_from_type_with_foreign_type",  # torch.nn.Module as a tensor's type
    *(
        f"torch_utils_{name}"  # torch._utils functions off the allowlist, called on a string
        for name in (
            "_rebuild_device_tensor_from_numpy",
            "_rebuild_device_tensor_from_cpu_tensor",
            "_rebuild_nested_tensor",
        )
    ),
}
# refused, and no allow entry could make them load (_gate.NOT_REBUILT): unreadable here
NOT_REBUILT_CASES = {
    "real_quantized_tensor",  # a genuine torch.save file of a quantized tensor
    "torch_utils__rebuild_qtensor",
    "torch_utils__rebuild_wrapper_subclass",
}


def _load(path: Path | str) -> CheckpointError | None:
    """What ``checkpoint.load`` raises on ``path`` (None: it loads): the verdict scan gives."""
    try:
        load(path, map_location="cpu")
    except CheckpointError as exc:
        return exc
    return None


def test_scan_says_what_load_does_on_every_corpus_file(tmp_path: Path) -> None:
    """``tests/checkpoint/corpus.py``: scan calls a file loadable exactly where ``load`` reads
    it; every unsafe case is dangerous but the named needs-allow ones; a damaged one is
    unreadable, or dangerous where load refuses what it builds first. Before: 20
    unsafe cases read loadable (BUILD on a dict, SETITEM into a class, numpy object arrays,
    a bytearray of 2**30...) and 13 refused; 13 damaged ones read loadable."""
    from tests.checkpoint.corpus import CASES

    seen: dict[str, str] = {}
    for case in CASES:
        folder = tmp_path / case.name
        folder.mkdir()
        path = case.build(folder / "marker", folder)
        done = scan_one(str(path))
        error = _load(path)
        seen[case.name] = done.severity
        assert (done.severity == LOADABLE) == (error is None), (case.name, done, error)
        if case.expect == "unsafe":
            expected = NEEDS_ALLOW if case.name in NEEDS_ALLOW_CASES else DANGEROUS
            expected = UNREADABLE if case.name in NOT_REBUILT_CASES else expected
            assert done.severity == expected, (case.name, done, error)
        if done.severity == NEEDS_ALLOW:  # what load refused, named, none of it denied
            assert isinstance(error, UnsafeCheckpointError) and done.info is not None
            assert set(error.refused) <= set(done.info.needs_allow), (case.name, error)
            assert not any(judge(*n.rpartition(".")[::2]).dangerous for n in error.refused)
        if case.expect == "damaged":
            assert done.severity in (UNREADABLE, DANGEROUS), (case.name, done)
        assert not (folder / "marker").exists()
    assert {name for name, s in seen.items() if s == NEEDS_ALLOW} == NEEDS_ALLOW_CASES
    assert sum(s == DANGEROUS for s in seen.values()) >= 58


def test_a_truncated_attack_is_dangerous_not_unreadable(tmp_path: Path) -> None:
    """``load`` refuses ``posix.system`` before it reaches the missing STOP: so does scan
    (before: the format reader's damage won, unreadable)."""
    path = tmp_path / "cut.pkl"
    path.write_bytes(_os_system()[:-1])
    assert isinstance(_load(path), UnsafeCheckpointError)
    done = scan_one(str(path))
    assert done.severity == DANGEROUS and done.info is not None
    assert done.info.dangerous == ("posix.system",)


def test_a_dcp_item_is_read_as_hardened_dcp_reads_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A non-tensor item of a ``.distcp`` file is ``torch.load``-ed by DCP: scan reads each
    with load's machine (tensors on meta), names its key and data file, and gives the folder
    the worst severity. Before: scan read no item, so both folders were loadable."""
    pytest.importorskip("torch.distributed.checkpoint")
    from tests.checkpoint.dcp_kit import Payload, save, state

    marker = tmp_path / "ran"
    save(tmp_path / "poisoned", state(extra=Payload(marker)))
    save(tmp_path / "boxed", state(extra=Box(1)))
    from tests.checkpoint.helpers import storage_reads

    reads = storage_reads(monkeypatch)
    poisoned, boxed = inspect(tmp_path / "poisoned"), inspect(tmp_path / "boxed")
    assert reads == [] and not marker.exists()
    assert poisoned.severity == DANGEROUS and poisoned.dangerous in (
        ("posix.system",),
        ("nt.system",),
    )
    assert boxed.severity == NEEDS_ALLOW and boxed.needs_allow == ("tests.checkpoint.helpers.Box",)
    for info in (poisoned, boxed):
        (refusal,) = info.refusals
        assert refusal.startswith("DCP item 'extra' in '__0_0.distcp': "), refusal
    monkeypatch.undo()
    report = json.loads(_cli("scan", str(tmp_path), "--json").stdout)
    assert [(Path(f["path"]).name, f["severity"]) for f in report["files"]] == [
        ("boxed", NEEDS_ALLOW),
        ("poisoned", DANGEROUS),
    ]
    assert report["exit_code"] == 3 and not marker.exists()
    line = _cli("scan", str(tmp_path / "poisoned")).stdout.splitlines()[0]
    assert line.startswith("dangerous") and "DCP item 'extra' in '__0_0.distcp': denied: " in line
    save(tmp_path / "torn", state())  # an item's bytes overwritten: unreadable, named
    with open(tmp_path / "torn" / ".metadata", "rb") as file:
        metadata = pickle.load(file)  # our own file
    (where,) = [w for index, w in metadata.storage_data.items() if index.fqn == "step"]
    with open(tmp_path / "torn" / where.relative_path, "r+b") as data:
        data.seek(where.offset)
        data.write(b"\xff" * where.length)
    torn = inspect(tmp_path / "torn")
    assert torn.severity == UNREADABLE, torn.refusals
    assert torn.refusals[-1].startswith("DCP item 'step' in '__0_0.distcp': "), torn.refusals


def _written_by_a_newer_torch(path: str) -> bool:
    """A fixture of ``fixtures/torchX.Y.Z_numpy...``, X.Y newer than the running torch."""
    folder = Path(path).parent.name
    if not folder.startswith("torch"):
        return False
    written = tuple(int(p) for p in folder[5:].split("_")[0].split(".")[:2])
    return written > tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])


def test_real_checkpoints_are_loadable() -> None:
    """The fixtures torch 2.1.2 to 2.15.0 wrote, and the zoo's Lightning checkpoints where
    Lightning is installed (its classes are allow-listed for its own releases): scan says
    what load does with each, and each written by this torch or an older one is loadable.
    (A newer torch's DCP .metadata: torch 2.1 lacks its classes, needs-allow; 2.4 to 2.13
    lack TensorProperties.strides, unreadable here.)"""
    files = [str(p) for p in FIXTURES]
    zoo = sorted((TESTS / "zoo" / "lightning_fixtures").glob("*.ckpt"))
    if any(__import__("importlib.util").util.find_spec(m) for m in ("pytorch_lightning",)):
        files += [str(p) for p in zoo]
    assert len(files) >= 8
    report = json.loads(_cli("scan", *files, "--json").stdout)
    expected = {f: _severity_of_load(f) for f in files}
    assert {f["path"]: f["severity"] for f in report["files"]} == expected
    assert all(expected[f] == LOADABLE for f in files if not _written_by_a_newer_torch(f))
    assert report["exit_code"] == max(EXIT_CODES[s] for s in expected.values())


def _severity_of_load(path: str) -> str:
    """What compatshim.checkpoint.load does with ``path`` in this process, as a severity (no
    fixture names a denied global)."""
    error = _load(path)
    if error is None:
        return LOADABLE
    return NEEDS_ALLOW if isinstance(error, UnsafeCheckpointError) else UNREADABLE


def test_the_exit_codes_are_documented() -> None:
    shown = _cli("scan", "--help").stdout + _cli("inspect", "--help").stdout
    for severity, code in EXIT_CODES.items():
        assert f"{code}  {severity}" in shown or f"   {severity}" in shown, severity
    docs = (TESTS.parent / "docs" / "inspect.md").read_text()
    for severity, code in EXIT_CODES.items():
        assert f"`{severity}`" in docs and f"| {code} |" in docs


def test_inspect_help_names_every_kind_of_file_it_reads() -> None:
    """``inspect --help`` named torch.save files, pickles, safetensors and DCP folders, not the
    numpy ``.npy``/``.npz`` files it reads as hardened ``numpy.load`` does (docs/inspect.md)."""
    shown = " ".join(_cli("inspect", "--help").stdout.split())
    for kind in ("torch.save", "pickle", "safetensors", ".npy/.npz", "DCP checkpoint folder"):
        assert kind in shown, kind


def test_progress_goes_to_stderr_only_when_long(four: dict[str, Path]) -> None:
    import io

    from compatshim.checkpoint.inspect_cli import Progress

    quiet = io.StringIO()
    progress = Progress(3, quiet)
    for n in (1, 2, 3):
        progress.step(n)
    progress.close()
    assert quiet.getvalue() == ""  # not a terminal, and under a few seconds
    progress = Progress(3, quiet)
    progress.start -= Progress.AFTER_S + 10
    progress.last -= 10
    progress.step(2)
    assert quiet.getvalue() == "compatshim scan: 2/3 paths\n"


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
@pytest.mark.timeout(120)
def test_a_fifo_is_unreadable_not_a_hang(tmp_path: Path) -> None:
    """A FIFO named like a checkpoint (a tar unpacks one), as a file or inside a DCP folder:
    the open blocked until a writer came, i.e. forever (scan, inspect, load, the dry run)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("torch.distributed.checkpoint")
    from compatshim.checkpoint import plan_resume
    from tests.checkpoint.dcp_kit import save

    os.mkfifo(tmp_path / "weights.pt")
    done = _cli("scan", str(tmp_path))
    assert done.returncode == 2, done
    assert "not a regular file" in done.stdout, done.stdout
    with pytest.raises(CheckpointError, match="not a regular file"):
        load(tmp_path / "weights.pt")
    for swapped in (".metadata", "__0_0.distcp"):
        folder = tmp_path / swapped.strip("._")
        save(folder, {"w": torch.ones(2), "note": {"step": 3}})
        (folder / swapped).unlink()
        os.mkfifo(folder / swapped)
        info = _cli("inspect", str(folder))
        assert info.returncode == 2, info  # a FIFO .metadata: "a DCP folder without its .metadata"
        if swapped != ".metadata":  # the dry run reads the items' bytes
            assert "not a regular file" in info.stdout + info.stderr, info
            plan = plan_resume(folder, {"w": torch.zeros(2), "note": {"step": 0}})
            assert not plan.ok and "not a regular file" in plan.damaged[0], plan


def test_a_path_the_console_cannot_encode_is_printed_escaped(tmp_path: Path) -> None:
    """A Windows CI log (cp1252) or an ASCII console: the traceback and exit 1 read as
    "needs-allow"; the verdict is the file's."""
    folder = tmp_path / "w"
    folder.mkdir()
    (folder / "\u6a21\u578b.pkl").write_bytes(pickle.dumps({"step": 1}, protocol=2))
    done = _cli("scan", str(folder), env={"PYTHONIOENCODING": "ascii"})
    assert done.returncode == 0, done
    assert "\\u6a21\\u578b.pkl" in done.stdout and "Traceback" not in done.stderr, done


def test_the_scan_a_folder_suggests_is_a_command_that_runs(tmp_path: Path) -> None:
    folder = tmp_path / "dir with space"
    folder.mkdir()
    (folder / "a.pkl").write_bytes(pickle.dumps({"step": 1}, protocol=2))
    with pytest.raises(CheckpointError) as raised:
        inspect(folder)
    suggested = str(raised.value).split("`")[1]
    assert suggested == f"compatshim scan '{folder}'", suggested
    done = _cli(*suggested.split(" ", 2)[1:2], str(folder))
    assert done.returncode == 0 and "1 loadable" in done.stdout, done


@pytest.mark.parametrize("zip_format", [True, False], ids=["zip", "legacy"])
@pytest.mark.parametrize("kind", ["dynamic", "static"])
def test_a_quantized_model_s_state_dict_is_unreadable_here_with_the_way_out(
    tmp_path: Path, kind: str, zip_format: bool
) -> None:
    """torch.ao.quantization's own models (per-tensor and per-channel): compatshim does not
    rebuild quantized tensors. scan said needs-allow and load advised allow entries, which
    could not make it load (the storage type is none its reader knows). In the legacy
    format both said "legacy storage key list does not match the storages the pickle
    names": the quantized storages are none the reader declares."""
    torch = pytest.importorskip("torch")
    quantization = pytest.importorskip("torch.ao.quantization")
    if "qnnpack" not in torch.backends.quantized.supported_engines and kind == "static":
        pytest.skip("no quantized engine for static quantization here")
    model = torch.nn.Sequential(torch.nn.Linear(4, 3))
    if kind == "dynamic":
        quantized = quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
    else:
        torch.backends.quantized.engine = "qnnpack" if "fbgemm" not in \
            torch.backends.quantized.supported_engines else "fbgemm"  # fmt: skip
        wrapped = quantization.QuantWrapper(model).eval()
        wrapped.qconfig = quantization.get_default_qconfig(torch.backends.quantized.engine)
        prepared = quantization.prepare(wrapped)
        prepared(torch.randn(8, 4))
        quantized = quantization.convert(prepared)
    path = tmp_path / "q.pt"
    torch.save(quantized.state_dict(), path, _use_new_zipfile_serialization=zip_format)
    done = _cli("scan", str(path))
    assert done.returncode == 2 and done.stdout.startswith("unreadable"), done
    with pytest.raises(UnsafeCheckpointError) as refused:
        load(path)
    message = str(refused.value)
    assert "compatshim does not rebuild quantized tensors" in message, message
    assert "allow=[" not in message and "torch.load(weights_only=True)" in message, message
    try:  # the way out it names: torch's own weights-only load, on releases that admit them
        torch.load(path, weights_only=True)
    except pickle.UnpicklingError as exc:  # torch 2.1: "Unsupported class torch.qint8"
        assert "qint8" in str(exc), exc


def test_a_dcp_folder_missing_or_short_of_a_data_file_is_unreadable(tmp_path: Path) -> None:
    """A folder whose data file was lost or cut short (an interrupted copy): scan said
    loadable (exit 0) and dcp.load failed; with a non-tensor item the failure read "message
    not shown: it holds values from the file" (an OSError's errno is an int)."""
    pytest.importorskip("torch.distributed.checkpoint")
    from tests.checkpoint.dcp_kit import save, state

    lost, short = tmp_path / "lost", tmp_path / "short"
    for folder in (lost, short):
        save(folder, state())
    data = sorted(lost.glob("*.distcp"))
    data[0].unlink()
    for file in short.glob("*.distcp"):
        os.truncate(file, 10)
    done = _cli("scan", str(lost), str(short))
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"data file '{data[0].name}': No such file or directory" in done.stdout
    assert "10 bytes, where .metadata places data up to byte" in done.stdout
    assert "message not shown" not in done.stdout


def test_a_failure_on_one_file_does_not_hide_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """scan is a CI gate over many files: an error compatshim did not foresee on one of them
    (a damaged .npz once raised zipfile's own) ended the scan with a traceback and exit 1,
    "needs an allow entry", before the os.system pickle beside it was reached."""
    from compatshim.checkpoint import inspect_cli

    (tmp_path / "a.pkl").write_bytes(pickle.dumps({"x": 1}))
    (tmp_path / "z.pkl").write_bytes(_os_system())
    real = inspect_cli.scan_one

    def failing(path: str) -> object:
        if path.endswith("a.pkl"):
            raise RuntimeError("unforeseen")
        return real(path)

    monkeypatch.setattr(inspect_cli, "scan_one", failing)
    assert inspect_cli.scan_main([str(tmp_path)], as_json=True) == 3
    found = {Path(row["path"]).name: row for row in json.loads(capsys.readouterr().out)["files"]}
    assert found["z.pkl"]["severity"] == DANGEROUS
    assert found["a.pkl"]["severity"] == "unreadable"
    assert "RuntimeError" in found["a.pkl"]["error"] and "bug" in found["a.pkl"]["error"]
