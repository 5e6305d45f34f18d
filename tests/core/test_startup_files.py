"""The wheel ships both start-up files: ``compatshim_auto.pth`` (an ``import`` line, Pythons
before 3.15) and ``compatshim_auto.start`` (PEP 829's entry point, 3.15 on), and the entry
point arms compatshim exactly when ``COMPATSHIM_AUTO`` says so."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

FILES = ("compatshim_auto.pth", "compatshim_auto.start", "compatshim_auto.py")


def _installed_files() -> dict[str, Path]:
    try:
        files = metadata.files("compatshim") or []
    except metadata.PackageNotFoundError:
        pytest.skip("compatshim is not installed (tox installs the wheel)")
    return {str(f): Path(str(f.locate())) for f in files if str(f) in FILES}


def test_the_installed_wheel_holds_both_start_up_files() -> None:
    found = _installed_files()
    assert sorted(found) == sorted(FILES)
    assert all(path.is_file() for path in found.values())


def _entry_points(text: str) -> list[str]:
    """The lines PEP 829 calls: neither blank nor a comment, each ``pkg.mod:callable``."""
    lines = [ln.strip() for ln in text.splitlines()]
    points = [ln for ln in lines if ln and not ln.startswith("#")]
    for point in points:
        assert re.fullmatch(r"\w+(\.\w+)*:\w+(\.\w+)*", point), point
    return points


@pytest.mark.parametrize("value,armed", [("1", True), ("0", False), ("", False)])
def test_the_start_entry_point_arms_as_the_pth_line_does(value: str, armed: bool) -> None:
    """What Python 3.15's site.py does with a .start file: ``pkgutil.resolve_name`` of each
    entry point, called with no arguments (the child starts unarmed, then sets the variable)."""
    start = _installed_files().get("compatshim_auto.start")
    if start is None:
        pytest.fail("compatshim_auto.start is not installed")
    points = _entry_points(start.read_text(encoding="utf-8-sig"))
    assert points == ["compatshim_auto:start"]
    code = (
        "import os, pkgutil, sys\n"
        "assert 'compatshim.auto' not in sys.modules\n"
        f"os.environ['COMPATSHIM_AUTO'] = {value!r}\n"
        f"for point in {points!r}:\n"
        "    pkgutil.resolve_name(point)()\n"
        "print('compatshim.auto' in sys.modules)\n"
    )
    env = dict(os.environ, COMPATSHIM_AUTO="0")
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(armed)


def test_the_pth_line_calls_the_same_hook() -> None:
    pth = _installed_files()["compatshim_auto.pth"].read_text(encoding="utf-8")
    (line,) = [ln for ln in pth.splitlines() if ln.startswith("import")]
    assert line == "import compatshim_auto; compatshim_auto.start()"


def test_the_start_entry_point_arms_the_loading_patches_for_safe_load_alone() -> None:
    """``COMPATSHIM_SAFE_LOAD=1`` without ``COMPATSHIM_AUTO``: the entry point arms the three
    loading patches and nothing else (the tree's hook first on the path: an editable install
    keeps a copy of it in site-packages)."""
    import compatshim

    source = str(Path(compatshim.__file__).resolve().parent.parent)
    code = (
        "import os, pkgutil, sys\n"
        "os.environ['COMPATSHIM_SAFE_LOAD'] = '1'\n"
        "pkgutil.resolve_name('compatshim_auto:start')()\n"
        "import compatshim\n"
        "print(sorted(r.name for r in compatshim.status() if r.armed))\n"
        "print('compatshim.auto' in sys.modules)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPATSHIM_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (source, env.get("PYTHONPATH")) if p)
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    armed, auto = done.stdout.strip().splitlines()
    assert armed == str(
        ["numpy-load-hardened", "torch-dcp-safe-metadata", "torch-load-safe-globals"]
    )
    assert auto == "False"
