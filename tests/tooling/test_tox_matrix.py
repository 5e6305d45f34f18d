"""A new release is one pin file: tox's own listing of the envs follows matrix/*.txt.

toxfile.py makes ``env_list`` and the ``matrix`` label from the pin files; these
tests ask tox itself (``tox l``), in this checkout and in a temporary copy with a
pin file added, so they hold what tox will run, not a re-reading of tox.ini. The
``ci`` label stays a hand-written list: every name in it must be an env.
"""

from __future__ import annotations

import configparser
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# these ask tox itself; a machine without tox (a GPU box running the suite bare) skips them
pytest.importorskip("tox", reason="tox is not installed: the matrix listing cannot be asked")

ROOT = Path(__file__).resolve().parents[2]


def _tox(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``tox`` run in ``root``, free of the variables of a tox env this test may run in."""
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith(("TOX_", "_TOX"))}
    return subprocess.run(
        [sys.executable, "-m", "tox", *args],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def _envs(root: Path, *selection: str) -> list[str]:
    done = _tox(root, "l", "--no-desc", *selection)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.split()


def _copy(tmp_path: Path) -> Path:
    """What tox needs to list the envs: tox.ini, toxfile.py and matrix/."""
    for name in ("tox.ini", "toxfile.py", "src/compatshim/matrix_cli.py"):  # toxfile loads the last
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copytree(ROOT / "matrix", tmp_path / "matrix")
    return tmp_path


def _ini() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(ROOT / "tox.ini")
    return parser


def _labels() -> dict[str, list[str]]:
    """tox.ini's own ``labels`` (the derived ``matrix`` label is not among them)."""
    out = {}
    for line in _ini()["tox"].get("labels", "").strip().splitlines():
        name, _, value = line.partition("=")
        out[name.strip()] = [env.strip() for env in value.split(",") if env.strip()]
    return out


@pytest.fixture(scope="module")
def matrix() -> list[str]:
    return _envs(ROOT, "-m", "matrix")


def test_the_matrix_is_lint_and_every_pin_file(matrix: list[str]) -> None:
    pins = sorted(p.stem for p in (ROOT / "matrix").glob("*.txt") if not p.name.startswith("bench"))
    assert matrix == ["lint", *pins]
    assert _envs(ROOT, "-d") == matrix, "the default env_list is the matrix"


def test_a_new_pin_file_is_a_new_env_without_editing_tox_ini(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    (root / "matrix" / "core-torch9.9.txt").write_text("torch==9.9.0\n")
    assert "core-torch9.9" in _envs(root, "-d")
    assert "core-torch9.9" in _envs(root, "-m", "matrix")
    deps = _tox(root, "config", "-e", "core-torch9.9", "-k", "deps")
    assert "-r matrix/core-torch9.9.txt" in deps.stdout, deps.stdout + deps.stderr
    assert (root / "tox.ini").read_bytes() == (ROOT / "tox.ini").read_bytes()


def test_a_name_tox_would_read_as_python_is_refused(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    (root / "matrix" / "resume-lightning-2.7.txt").write_text("lightning==2.7.0\n")
    done = _tox(root, "l")
    assert done.returncode != 0
    assert "rename it resume-lightning2.7.txt" in done.stdout + done.stderr


def test_ci_envs_are_matrix_envs(matrix: list[str]) -> None:
    ci = _labels()["ci"]
    assert len(set(ci)) == len(ci), "an env is listed twice in the ci label"
    assert sorted(set(ci) - set(matrix)) == [], "ci names envs that have no pin file"
    assert _envs(ROOT, "-m", "ci") == [env for env in matrix if env in ci]


def test_tox_ini_lists_no_matrix_env() -> None:
    """A hand-written env_list or matrix label would shadow the derived ones."""
    ini = _ini()
    assert not ini.has_option("tox", "env_list") and not ini.has_option("tox", "envlist")
    assert "matrix" not in _labels()


def test_bench_pin_files_belong_to_bench_envs() -> None:
    ini = _ini()
    used = {ini[s].get("deps", "").strip() for s in ini.sections() if s.startswith("testenv:bench")}
    for pins in sorted((ROOT / "matrix").glob("bench*.txt")):
        assert f"-r matrix/{pins.name}" in used, f"{pins.name}: no [testenv:bench*] installs it"


def test_every_family_has_a_command_and_a_test_folder(matrix: list[str]) -> None:
    commands = _ini()["testenv"]["commands"]
    lines = dict(line.split(":", 1) for line in commands.strip().splitlines())
    families = {family.strip(): line for family, line in lines.items()}
    for env in (e for e in matrix if e != "lint"):
        family = env.split("-", 1)[0]
        assert family in families, f"{env}: no '{family}:' line under [testenv] commands"
        # a family runs a tests/ folder of its own, or named files of others (forkserver: the
        # start-method-sensitive tests of tests/core on the interpreter where it is the default)
        paths = [
            p for p in families[family].split() if p.startswith("tests/") and "run_pytest" not in p
        ]
        assert paths, f"{env}: its command names no tests/ path"
        for path in paths:
            assert (ROOT / path).exists(), f"{env}: {path} does not exist"
