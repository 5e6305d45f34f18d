"""matrix/pythons.py installs CPython 3.14/3.15 once, into its cache only, and where Debian's
archive cannot be reached it says so and the tox env is skipped with that reason, never run
on another interpreter or passed."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "matrix" / "pythons.py"
UNREACHABLE = "http://127.0.0.1:9/debian"  # the discard port: refused at once


@pytest.fixture(scope="module")
def pythons() -> ModuleType:
    spec = importlib.util.spec_from_file_location("compatshim_matrix_pythons", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _env(cache: Path) -> dict[str, str]:
    return {
        **os.environ,
        "COMPATSHIM_TEST_PYTHONS": str(cache),
        "COMPATSHIM_TEST_PYTHONS_ARCHIVE": UNREACHABLE,
    }


def test_an_installed_interpreter_is_found_without_any_download(
    pythons: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    exe = pythons.interpreter("3.14", tmp_path)
    exe.parent.mkdir(parents=True)
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)

    def no_install(*args: object) -> None:
        raise AssertionError("installed again")

    monkeypatch.setattr(pythons, "_install", no_install)
    assert pythons.ensure("3.14", tmp_path) == exe


def test_only_the_versions_it_knows(pythons: ModuleType, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"version: '3\.13' is not one of 3\.14, 3\.15"):
        pythons.ensure("3.13", tmp_path)


@pytest.mark.timeout(120)
def test_unreachable_archive_is_a_skip_with_the_reason_and_leaves_nothing(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "3.14"],
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert done.returncode == 3, done.stderr
    assert "Python 3.14 not installed, skipped:" in done.stderr
    assert done.stdout == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == [".lock"]  # no half-made interpreter


@pytest.mark.timeout(300)
def test_tox_skips_the_env_with_the_reason_and_lists_without_installing(tmp_path: Path) -> None:
    pytest.importorskip("tox_uv", reason="tox-uv is not installed: the envs are uv venvs")
    tox = [sys.executable, "-m", "tox", "--workdir", str(tmp_path / "work")]
    cache = tmp_path / "cache"
    listed = subprocess.run(
        [*tox, "l"], cwd=ROOT, env=_env(cache), capture_output=True, text=True, timeout=120
    )
    assert "core-torch2.15-py3.14" in listed.stdout, listed.stdout + listed.stderr
    assert not cache.exists()  # listing envs installs nothing
    ran = subprocess.run(
        [*tox, "-e", "aliases-numpy2.5-py3.14"],
        cwd=ROOT,
        env=_env(cache),
        capture_output=True,
        text=True,
        timeout=240,
    )
    out = ran.stdout + ran.stderr
    assert ran.returncode != 0, out  # nothing ran: no pass
    assert "aliases-numpy2.5-py3.14: SKIP" in out, out
    assert "Python 3.14 is not installed" in out and "cannot be reached" in out, out
    assert not (tmp_path / "work" / "aliases-numpy2.5-py3.14").exists()
    shutil.rmtree(tmp_path / "work", ignore_errors=True)
