"""``compatshim matrix`` runs a user's own tests on a pin set, in an environment it makes.

The real run uses one cheap pin set written here: the torch and numpy releases of the
interpreter running this test (the wheels its installer already has, no download) on its own
Python, for a tiny project made in tmp_path whose tests import compatshim and torch.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

from compatshim import cli, matrix_cli

ROOT = Path(__file__).resolve().parents[2]
PYTHON = f"{sys.version_info[0]}.{sys.version_info[1]}"
ENV = f"mine-py{PYTHON}"  # the py3.X factor: the set runs on this test's own Python


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The runs below install from a package index (the pins, hatchling to build); a machine
    without one (the GPU machines) skips them, saying so, instead of failing them."""
    if shutil.which("uv"):
        argv = ["uv", "pip", "compile", "-", "--quiet", "--no-cache", "--python", sys.executable]
    else:
        folder = tmp_path_factory.mktemp("index-probe")
        argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--retries", "0"]
        argv += ["--timeout", "20", "--dest", str(folder), "-r", "/dev/stdin"]
    try:
        done = subprocess.run(
            argv, input="hatchling>=1.21\n", capture_output=True, text=True, timeout=120
        )
    except subprocess.TimeoutExpired:
        pytest.skip("no package index answered within 120 s (these runs install from one)")
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        pytest.skip(f"no package index reachable (these runs install from one): {last}")


def _pins(folder: Path, torch_version: str, numpy_version: str) -> Path:
    folder.mkdir()
    (folder / f"{ENV}.txt").write_text(
        f"# my pins: the releases this test runs on. A second sentence.\n"
        f"torch=={torch_version}\nnumpy=={numpy_version}\n",
        encoding="utf-8",
    )
    (folder / "other-torch9.txt").write_text("torch==9.0.0\n", encoding="utf-8")
    (folder / "bench-x.txt").write_text("torch==9.0.0\n", encoding="utf-8")  # not a set
    return folder


def _project(folder: Path, torch_version: str, numpy_version: str) -> Path:
    import compatshim

    (folder / "userproj").mkdir(parents=True)
    (folder / "tests").mkdir()
    (folder / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["hatchling"]\nbuild-backend = "hatchling.build"\n'
        '[project]\nname = "userproj"\nversion = "0.1"\ndependencies = ["torch"]\n',
        encoding="utf-8",
    )
    (folder / "userproj" / "__init__.py").write_text(
        "def double(x):\n    return 2 * x\n", encoding="utf-8"
    )
    source = Path(compatshim.__file__).resolve().parent
    # the compatshim that ran the command: the same source (editable) or a copy of it (a
    # wheel install, as in tox), so its files' content is compared, not their place
    digest = hashlib.sha256((source / "matrix_cli.py").read_bytes()).hexdigest()
    (folder / "tests" / "test_user.py").write_text(
        f"""\
import hashlib
import pathlib
from importlib import metadata

import compatshim
import numpy
import pytest
import torch
import userproj


def test_pins_hold():
    torch_version = metadata.version("torch")  # the wheel's (torch.__version__ may add +cu128)
    assert (torch_version, numpy.__version__) == ({torch_version!r}, {numpy_version!r})
    mine = pathlib.Path(compatshim.__file__).parent / "matrix_cli.py"
    assert hashlib.sha256(mine.read_bytes()).hexdigest() == {digest!r}  # the command's compatshim


def test_double():
    assert userproj.double(torch.ones(2)).tolist() == [2.0, 2.0]


def test_skipped():
    pytest.skip("a skip is counted")


def test_broken():
    assert userproj.double(1) == 3
""",
        encoding="utf-8",
    )
    return folder


def _row(output: str, env: str) -> list[str]:
    """The summary table's row for ``env``, split into cells."""
    header = output.rindex("\nenv ")
    rows = [line.split() for line in output[header:].splitlines() if line.startswith(env + " ")]
    assert len(rows) == 1, output[-3000:]
    return rows[0]


def test_list_shows_each_set_with_its_family_python_and_description(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pins = _pins(tmp_path / "pins", "2.13.0", "2.4.6")
    assert cli.main(["matrix", "--pins", str(pins), "--list"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["env", "family", "python", "description"]
    assert out[1].split(None, 3) == [ENV, "mine", PYTHON, "my pins: the releases this test runs on"]
    no_comment = "the pins in matrix/other-torch9.txt"
    assert out[2].split(None, 3) == ["other-torch9", "other", "3.11", no_comment]
    assert len(out) == 3  # bench-x.txt is not a set
    assert cli.main(["matrix", "--pins", str(pins), "--list", "--python", "3.13"]) == 0
    chosen = capsys.readouterr().out.splitlines()  # the Python a run would use
    assert [row.split()[2] for row in chosen[1:]] == ["3.13", "3.13"], chosen


def test_the_shipped_sets_are_the_tox_matrix() -> None:
    """One reader: toxfile.py's envs are the command's sets (bench*.txt out of both)."""
    sets = matrix_cli.pin_sets(ROOT / "matrix")
    assert sets == sorted(p.stem for p in (ROOT / "matrix").glob("*.txt") if p.stem[:5] != "bench")
    assert (
        "core-torch2.15-py3.12" in sets and matrix_cli.python_of("core-torch2.15-py3.12") == "3.12"
    )
    assert matrix_cli.python_of("core-torch2.1") == "3.11"
    assert matrix_cli.family("lightning-fabric-2.6.6") == "lightning"


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--env", "nope"], "--env nope: no such pin set"),
        (["--family", "nope"], "--family nope: no such family"),
        ([], "no set chosen"),
        (["--pins", "{empty}", "--env", "x"], "no <name>.txt pin file there"),
        (["--pins", "{missing}", "--list"], "--pins {missing}: no <name>.txt pin file there"),
        (["--env", ENV, "--python", "py3.12"], "--python py3.12: expected a Python version"),
        (["--list", "--python", "banana"], "--python banana: expected a Python version"),
    ],
)
def test_a_bad_request_names_its_argument_and_exits_2(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    named: str,
) -> None:
    pins = _pins(tmp_path / "pins", "2.13.0", "2.4.6")
    (tmp_path / "empty").mkdir()
    (tmp_path / "pyproject.toml").write_text("", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    where = {"empty": tmp_path / "empty", "missing": tmp_path / "missing"}
    argv = [arg.format(**where) for arg in argv]
    if "--pins" not in argv:
        argv += ["--pins", str(pins)]
    assert cli.main(["matrix", *argv]) == 2
    captured = capsys.readouterr()
    assert named.format(**where) in captured.err
    assert not captured.out  # --list too: no table of nothing
    assert not (tmp_path / ".compatshim-matrix").exists()


def test_no_project_here_is_a_bad_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pins = _pins(tmp_path / "pins", "2.13.0", "2.4.6")
    monkeypatch.chdir(tmp_path)
    assert cli.main(["matrix", "--pins", str(pins), "--env", ENV]) == 2
    assert "no project in" in capsys.readouterr().err


def test_a_folder_in_the_way_is_never_deleted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An unlucky --workdir (the project itself) holding a folder named like the set."""
    pins = _pins(tmp_path / "pins", "2.13.0", "2.4.6")
    (tmp_path / "pyproject.toml").write_text("", encoding="utf-8")
    mine = tmp_path / ENV / "notes.txt"
    mine.parent.mkdir()
    mine.write_text("keep me", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    argv = ["matrix", "--pins", str(pins), "--env", ENV, "--workdir", "."]
    assert cli.main([*argv, "--recreate"]) == 2
    assert "in the way and not an environment" in capsys.readouterr().err
    assert mine.read_text(encoding="utf-8") == "keep me"


@pytest.mark.parametrize("under", ["", "envs"])
def test_a_file_as_workdir_is_a_bad_request(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    under: str,
) -> None:
    """A --workdir that is a file, or lies under one: exit 2 naming it, not a traceback."""
    pins = _pins(tmp_path / "pins", "2.13.0", "2.4.6")
    (tmp_path / "pyproject.toml").write_text("", encoding="utf-8")
    (tmp_path / "a-file").write_text("mine", encoding="utf-8")
    workdir = tmp_path / "a-file" / under
    monkeypatch.chdir(tmp_path)
    argv = ["matrix", "--pins", str(pins), "--env", ENV, "--workdir", str(workdir)]
    assert cli.main(argv) == 2
    captured = capsys.readouterr()
    assert f"--workdir {workdir}: " in captured.err and "Traceback" not in captured.err
    assert captured.err.count("\n") == 1 and not captured.out
    assert (tmp_path / "a-file").read_text(encoding="utf-8") == "mine"


def test_a_folder_in_the_way_stops_the_run_before_any_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every chosen set's folder is checked first: a later set's does not cost an earlier
    set's install (and its outcome, with no table printed)."""
    pins = _pins(tmp_path / "pins", "2.13.0", "2.4.6")
    (tmp_path / "pyproject.toml").write_text("", encoding="utf-8")
    (tmp_path / "envs" / "other-torch9").mkdir(parents=True)  # the second set's, not an env
    made: list[Path] = []

    def make(env_dir: Path, python: str, installer: str, reqs: list[str], log: Path) -> bool:
        made.append(env_dir)
        log.write_text("not installed: a test\n", encoding="utf-8")
        return False

    monkeypatch.setattr(matrix_cli, "_make", make)
    monkeypatch.chdir(tmp_path)
    argv = ["matrix", "--pins", str(pins), "--env", ENV, "--env", "other-torch9"]
    assert cli.main([*argv, "--workdir", "envs"]) == 2
    captured = capsys.readouterr()
    assert "other-torch9: in the way and not an environment" in captured.err
    assert made == [] and not captured.out
    assert list((tmp_path / "envs").iterdir()) == [tmp_path / "envs" / "other-torch9"]


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.usefixtures("index")
def test_runs_the_users_tests_on_the_pins_and_reports_each_outcome(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("numpy")
    versions = metadata.version("torch"), metadata.version("numpy")  # what the installer saw
    pins = _pins(tmp_path / "pins", *versions)
    project = _project(tmp_path / "proj", *versions)
    leak = tmp_path / "leak" / "numpy"  # a PYTHONPATH the user had set must not reach the env
    leak.mkdir(parents=True)
    (leak / "__init__.py").write_text("__version__ = 'leaked'\n", encoding="utf-8")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(leak.parent), env.get("PYTHONPATH")]))
    if "UV_FIND_LINKS" not in env and env.get("PIP_FIND_LINKS"):  # a local torch build
        env["UV_FIND_LINKS"] = ",".join(env["PIP_FIND_LINKS"].split())

    def matrix(*pytest_args: str) -> tuple[int, str]:
        argv = [sys.executable, "-m", "compatshim", "matrix", "--pins", str(pins), "--env", ENV]
        done = subprocess.run(
            [*argv, "--", "-p", "no:cacheprovider", *pytest_args],
            cwd=project,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        return done.returncode, done.stdout + done.stderr

    code, out = matrix("-k", "not broken")
    assert f"{ENV}: installing {ENV}.txt on Python {PYTHON}" in out, out[-3000:]
    assert _row(out, ENV) == [ENV, PYTHON, "passed", "2", "0", "1", _row(out, ENV)[-1]]
    assert code == 0, out[-3000:]
    assert (project / ".compatshim-matrix" / ".gitignore").read_text(encoding="utf-8") == "*\n"

    code, out = matrix()  # test_broken fails
    assert f"{ENV}: reusing" in out and "installing" not in out, out[-3000:]
    assert "assert 2 == 3" in out  # pytest's own output is shown
    assert _row(out, ENV)[:6] == [ENV, PYTHON, "failed", "2", "1", "1"]
    assert code == 1

    code, out = matrix("-k", "no_test_has_this_name")  # pytest exit 5: a failure here
    assert _row(out, ENV)[:6] == [ENV, PYTHON, "no", "tests", "0", "0"]
    assert code == 1

    (project / "pyproject.toml").write_text(  # a changed project is installed again
        (project / "pyproject.toml").read_text(encoding="utf-8") + "description = 'x'\n",
        encoding="utf-8",
    )
    code, out = matrix("-k", "not broken")
    assert f"{ENV}: installing" in out and code == 0, out[-3000:]


def _builder() -> list[str]:
    if shutil.which("uv"):
        return ["uv", "build", "--wheel", "--quiet", "--out-dir"]
    pytest.importorskip("build", reason="neither uv nor build is installed to build the wheel")
    return [sys.executable, "-m", "build", "--wheel", "--outdir"]


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.usefixtures("index")
def test_the_wheel_carries_the_pin_sets_and_finds_them(tmp_path: Path) -> None:
    done = subprocess.run(
        [*_builder(), str(tmp_path), str(ROOT)], capture_output=True, text=True, timeout=500
    )
    assert done.returncode == 0, done.stderr
    (wheel,) = tmp_path.glob("compatshim-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        shipped = sorted(n for n in names if n.startswith("compatshim/_pins/"))
        one = archive.read(f"compatshim/_pins/{matrix_cli.pin_sets(ROOT / 'matrix')[0]}.txt")
    expected = sorted(f"compatshim/_pins/{n}.txt" for n in matrix_cli.pin_sets(ROOT / "matrix"))
    assert shipped == expected  # every set, nothing else (no bench pins, scripts, results)
    first = matrix_cli.pin_sets(ROOT / "matrix")[0]
    assert one == (ROOT / "matrix" / f"{first}.txt").read_bytes()
    assert {"compatshim_auto.pth", "compatshim/cli.py", "compatshim/matrix_cli.py"} <= set(names)
    site = tmp_path / "site"  # the installed wheel finds its own pins, not the checkout's
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    env = {**os.environ, "PYTHONPATH": str(site)}
    done = subprocess.run(
        [sys.executable, "-m", "compatshim", "matrix", "--list"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    listed = [line.split()[0] for line in done.stdout.splitlines()[1:]]
    assert listed == matrix_cli.pin_sets(ROOT / "matrix")
    where = "import compatshim.matrix_cli as m; print(m.default_pins())"
    done = subprocess.run([sys.executable, "-c", where], env=env, capture_output=True, text=True)
    assert Path(done.stdout.strip()) == site / "compatshim" / "_pins", done.stderr


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.usefixtures("index")
def test_pip_installer_and_a_set_that_cannot_install(tmp_path: Path) -> None:
    """Without uv (``--installer pip``); a set that cannot be installed fails the run, named."""
    pytest.importorskip("numpy")
    numpy_version = metadata.version("numpy")
    pins = tmp_path / "pins"
    pins.mkdir()
    (pins / "np-ok.txt").write_text(f"numpy=={numpy_version}\n", encoding="utf-8")
    (pins / "np-absent.txt").write_text("numpy==0.0.1\n", encoding="utf-8")  # no such release
    project = tmp_path / "proj"
    (project / "tests").mkdir(parents=True)
    (project / "setup.py").write_text(
        "from setuptools import setup\nsetup(name='userproj', version='0.1', py_modules=[])\n",
        encoding="utf-8",
    )
    (project / "tests" / "test_np.py").write_text(
        f"import compatshim, numpy\n\ndef test_pin():\n    assert numpy.__version__ == "
        f"{numpy_version!r}\n",
        encoding="utf-8",
    )
    argv = [sys.executable, "-m", "compatshim", "matrix", "--pins", str(pins), "--family", "np"]
    done = subprocess.run(
        [*argv, "--installer", "pip", "--python", PYTHON, "--", "-p", "no:cacheprovider"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=800,
    )
    out = done.stdout + done.stderr
    assert _row(out, "np-ok")[:6] == ["np-ok", PYTHON, "passed", "1", "0", "0"], out[-3000:]
    assert _row(out, "np-absent") == ["np-absent", PYTHON, "install", "failed", *"----"]
    log = project / ".compatshim-matrix" / "np-absent.install.log"
    assert f"the whole log: {log}" in out and "numpy==0.0.1" in log.read_text(encoding="utf-8")
    assert done.returncode == 1
    assert (project / ".compatshim-matrix" / "np-ok" / "pyvenv.cfg").is_file()
