"""One version source, ``compatshim.__version__``: pyproject.toml, metadata and --version follow."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

import compatshim

ROOT = Path(__file__).resolve().parents[2]


def test_pyproject_reads_the_package_version() -> None:
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    project = text.split("[project]", 1)[1].split("\n[", 1)[0]
    assert 'dynamic = ["version"]' in project
    assert "\nversion =" not in project, "a second version in pyproject.toml"
    assert '[tool.hatch.version]\npath = "src/compatshim/__init__.py"' in text


def test_installed_metadata_matches() -> None:
    try:
        installed = metadata.version("compatshim")
    except metadata.PackageNotFoundError:
        pytest.skip("compatshim is not installed (run from a checkout)")
    assert installed == compatshim.__version__


@pytest.mark.timeout(60)
def test_cli_prints_it() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "compatshim", "--version"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.strip() == f"compatshim {compatshim.__version__}"
