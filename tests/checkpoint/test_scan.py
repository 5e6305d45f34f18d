"""``compatshim scan`` and the severities ``inspect`` gives (issue 38 item 6): one verdict per
file or DCP folder, distinct exit codes, JSON whatever the outcome, the project's attack
corpus and real checkpoints judged as ``load`` judges them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from compatshim.checkpoint import UnsafeCheckpointError, inspect, load
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
    """One file of each severity but refused (a denied global, an unknown dataclass, a
    genuine state dict, a damaged zip) and a TorchScript archive (refused)."""
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


def _refused_for_a_denied_global(path: Path) -> bool:
    """Whether ``load`` refuses ``path`` naming a global the deny list holds."""
    try:
        load(path)
    except UnsafeCheckpointError as exc:
        names = [n for n in exc.refused if all(p.isidentifier() for p in n.split("."))]
        return any(judge(*name.rpartition(".")[::2]).dangerous for name in names)
    except Exception:
        return False
    return False


def test_every_corpus_file_refused_for_a_denied_global_is_dangerous(tmp_path: Path) -> None:
    """``tests/checkpoint/corpus.py``: each file ``load`` refuses naming a denied global gets
    ``dangerous`` from scan; no hostile file gets ``loadable`` where load refuses a global."""
    from tests.checkpoint.corpus import CASES

    dangerous, checked = [], 0
    for case in CASES:
        folder = tmp_path / case.name
        folder.mkdir()
        path = case.build(folder / "marker", folder)
        if case.expect == "unsafe" and _refused_for_a_denied_global(path):
            checked += 1
            if scan_one(str(path)).severity != DANGEROUS:
                dangerous.append(case.name)
        assert not (folder / "marker").exists()
    assert checked >= 20 and dangerous == []


def test_real_checkpoints_are_loadable(tmp_path: Path) -> None:
    """The fixtures torch 2.1.2 to 2.15.0 wrote, and the zoo's Lightning checkpoints where
    Lightning is installed (its classes are allow-listed for its own releases)."""
    files = [str(p) for p in FIXTURES]
    zoo = sorted((TESTS / "zoo" / "lightning_fixtures").glob("*.ckpt"))
    if any(__import__("importlib.util").util.find_spec(m) for m in ("pytorch_lightning",)):
        files += [str(p) for p in zoo]
    assert len(files) >= 8
    report = json.loads(_cli("scan", *files, "--json").stdout)
    expected = {f: LOADABLE if _loads(f) else NEEDS_ALLOW for f in files}
    assert {f["path"]: f["severity"] for f in report["files"]} == expected
    # every fixture loads where its torch's classes are known: a newer torch's DCP .metadata
    # needs an entry under an older torch (its rows apply from their release on), as in load
    assert sum(v == LOADABLE for v in expected.values()) >= len(files) - 1
    assert report["exit_code"] == (0 if all(v == LOADABLE for v in expected.values()) else 1)


def _loads(path: str) -> bool:
    """Whether compatshim.checkpoint.load reads ``path`` in this process (the verdict scan
    must agree with)."""
    from compatshim import checkpoint

    try:
        checkpoint.load(path, map_location="cpu")
    except checkpoint.UnsafeCheckpointError:
        return False
    return True


def test_the_exit_codes_are_documented() -> None:
    shown = _cli("scan", "--help").stdout + _cli("inspect", "--help").stdout
    for severity, code in EXIT_CODES.items():
        assert f"{code}  {severity}" in shown or f"   {severity}" in shown, severity
    docs = (TESTS.parent / "docs" / "inspect.md").read_text()
    for severity, code in EXIT_CODES.items():
        assert f"`{severity}`" in docs and f"| {code} |" in docs


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
