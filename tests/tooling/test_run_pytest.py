"""tests/run_pytest.py turns "nothing tested" into a failure: no test collected
(pytest's exit 5) or every test skipped. A matrix env that tests nothing is broken."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

RUN_PYTEST = Path(__file__).resolve().parents[1] / "run_pytest.py"


def run(folder: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "TOX_ENV_NAME": "selftest",
        "COMPATSHIM_TEST_RESULTS": str(tmp_path / "res"),
    }
    return subprocess.run(
        [sys.executable, str(RUN_PYTEST), "-p", "no:cacheprovider", str(folder)],
        env=env,
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=120,
    )


def suite(tmp_path: Path, body: str) -> Path:
    folder = tmp_path / "suite"
    folder.mkdir()
    if body:
        (folder / "test_it.py").write_text(body)
    return folder


def test_no_test_collected_fails(tmp_path: Path) -> None:
    done = run(suite(tmp_path, ""), tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "collected no tests" in done.stderr


def test_module_skipped_at_import_fails(tmp_path: Path) -> None:
    body = "import pytest\npytest.importorskip('no_such_framework')\ndef test_a(): pass\n"
    done = run(suite(tmp_path, body), tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "collected no tests" in done.stderr


def test_every_test_skipped_fails(tmp_path: Path) -> None:
    body = "import pytest\n@pytest.mark.skip(reason='x')\ndef test_a(): pass\n"
    done = run(suite(tmp_path, body), tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "every test skipped" in done.stderr


def test_a_failure_stays_a_failure(tmp_path: Path) -> None:
    done = run(suite(tmp_path, "def test_a(): assert False\n"), tmp_path)
    assert done.returncode == pytest.ExitCode.TESTS_FAILED


def test_passing_env_passes_and_records_results(tmp_path: Path) -> None:
    body = "import pytest\ndef test_a(): pass\n@pytest.mark.skip(reason='x')\ndef test_b(): pass\n"
    done = run(suite(tmp_path, body), tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "res" / "selftest.xml").is_file()
    versions = json.loads((tmp_path / "res" / "selftest.versions.json").read_text())
    assert versions["python"] == ".".join(map(str, sys.version_info[:3]))
    assert "pytest" in versions


def test_its_own_folder_is_not_on_sys_path(tmp_path: Path) -> None:
    """``tests/`` on ``sys.path`` would make ``tests/lightning`` importable as ``lightning``."""
    body = (
        "import sys, os\n"
        f"def test_a(): assert {str(RUN_PYTEST.parent)!r} not in map(os.path.abspath, sys.path)\n"
    )
    done = run(suite(tmp_path, body), tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
