"""Lint sees every file: ``ruff check --show-files`` lists each ``*.py`` under src/ and tests/.

ruff's default ``exclude`` skips folders named like build output (``dist``, ``build``,
``.venv``, ...): ``src/compatshim/dist/`` went unlinted that way (22 files, three errors
waiting). A folder the linter silently drops is found here, not by the next reviewer.
Format checks read the same ``exclude`` setting, so they see the same files.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _ruff() -> list[str]:
    if importlib.util.find_spec("ruff") is not None:
        return [sys.executable, "-m", "ruff"]
    found = shutil.which("ruff")
    if found is None:
        pytest.skip("ruff is not installed (the lint env installs it: extras dev)")
    return [found]


def _python_files(folder: str) -> set[str]:
    return {
        path.relative_to(ROOT).as_posix()
        for path in (ROOT / folder).rglob("*.py")
        if "__pycache__" not in path.parts
    }


@pytest.mark.timeout(120)
@pytest.mark.parametrize("folder", ["src", "tests"])
def test_ruff_lists_every_python_file(folder: str) -> None:
    done = subprocess.run(
        [*_ruff(), "check", "--show-files", folder],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=110,
        check=True,
    )
    listed = {
        Path(line.strip()).resolve().relative_to(ROOT).as_posix()
        for line in done.stdout.splitlines()
        if line.strip().endswith(".py")
    }
    expected = _python_files(folder)
    assert sorted(expected - listed) == [], "files ruff does not lint"
    assert listed == expected
