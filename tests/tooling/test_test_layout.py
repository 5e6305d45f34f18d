"""No test folder can shadow a real package, and the whole suite collects without any framework.

``tests/`` is one package (``tests.core``, ``tests.nuscenes``, ...) and is never put on
``sys.path`` itself: a folder ``tests/nuscenes`` reachable as ``nuscenes`` once hid
the missing devkit and broke collection where nuscenes-devkit was not installed
(the first GPU run, 2026-11-27). The lint env has torch and pytest but none of the
frameworks, so collecting there is the check that every framework test skips
with a reason instead of failing to import.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the lint env runs 3.11
    tomllib = None

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
# folders run as scripts or holding data: their code is never imported as a package
SCRIPT_FOLDERS = {
    "tests/lightning/scripts",
    "tests/lightning/upstream",
    "tests/checkpoint/upstream",
    "tests/checkpoint/fixtures",
    "tests/checkpoint/numpy_fixtures",
    "tests/checkpoint/omegaconf_fixtures",
}


def test_every_test_folder_with_code_is_a_subpackage_of_tests() -> None:
    loose = []
    for folder in sorted({path.parent for path in TESTS.rglob("*.py")}):
        relative = folder.relative_to(ROOT).as_posix()
        if relative in SCRIPT_FOLDERS or "__pycache__" in relative:
            continue
        if not (folder / "__init__.py").is_file():
            loose.append(relative)
    assert loose == [], f"folders importable under their own name if put on sys.path: {loose}"


def test_pytest_does_not_put_tests_on_sys_path() -> None:
    if tomllib is None:
        return
    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert not any(Path(entry).parts[:1] == ("tests",) for entry in options.get("pythonpath", []))


def test_the_whole_suite_collects_in_this_env() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "tests"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    tail = done.stdout[-3000:] + done.stderr[-3000:]
    assert done.returncode == 0, tail
    assert " error" not in done.stdout.splitlines()[-1], tail
