"""The wheel ships both start-up files: ``compatshim_auto.pth`` (an ``import`` line, Pythons
before 3.15) and ``compatshim_auto.start`` (PEP 829's entry point, 3.15 on), and the entry
point arms compatshim exactly when ``COMPATSHIM_AUTO`` says so."""

from __future__ import annotations

import json
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


# A probe that counts the start-up hook's calls per process: its .pth import line runs
# before any other start-up code (sorted first, and PEP 829 runs import lines before .start
# entry points), so both routes to compatshim_auto.start() go through the count.
_PROBE = """
import os
import compatshim_auto

_hook = compatshim_auto.start


def _counted():
    with open(os.environ["HOOK_CALLS"], "a") as calls:
        calls.write(f"{os.getpid()}\\n")
    _hook()


compatshim_auto.start = _counted
"""
_RUN = """
import json, multiprocessing as mp, sys

def armed(queue):
    queue.put("compatshim.auto" in sys.modules)

if __name__ == "__main__":
    seen = {"main": "compatshim.auto" in sys.modules, "default": mp.get_start_method()}
    for method in ("spawn", "forkserver"):
        ctx = mp.get_context(method)
        queue = ctx.Queue()
        child = ctx.Process(target=armed, args=(queue,))
        child.start()
        seen[method] = queue.get(timeout=60)
        child.join(120)
    print(json.dumps(seen))
"""


def _venv_with_the_wheel(tmp_path: Path, start_name: str) -> tuple[Path, Path]:
    """A fresh venv holding the installed wheel's files as they are (dist-info included), and
    its one dependency's (packaging)."""
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")],
        check=True,
        timeout=120,
    )
    python = tmp_path / "venv" / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    for file in [*(metadata.files("compatshim") or []), *(metadata.files("packaging") or [])]:
        source = Path(str(file.locate()))
        if source.is_file() and not str(file).startswith(".."):
            name = start_name if str(file) == "compatshim_auto.start" else str(file)
            (site / name).parent.mkdir(parents=True, exist_ok=True)
            (site / name).write_bytes(source.read_bytes())
    (site / "aaa_hook_probe.py").write_text(_PROBE)
    (site / "aaa_hook_probe.pth").write_text("import aaa_hook_probe\n")
    return python, site


def _calls_per_process(calls: Path) -> list[int]:
    pids = calls.read_text().split() if calls.exists() else []
    return sorted(pids.count(pid) for pid in set(pids))


@pytest.mark.timeout(300)
@pytest.mark.skipif(sys.version_info < (3, 15), reason="PEP 829 .start files: Python 3.15+")
def test_on_315_the_start_entry_point_runs_once_per_process_and_the_pth_line_not_at_all(
    tmp_path: Path,
) -> None:
    _installed_files()  # skips where the wheel is not installed
    python, site = _venv_with_the_wheel(tmp_path, "compatshim_auto.start")
    calls = tmp_path / "calls"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COMPATSHIM_", "PYTHON"))}
    env.update(COMPATSHIM_AUTO="1", HOOK_CALLS=str(calls))
    script = tmp_path / "user_script.py"  # spawn children import the main module by path
    script.write_text(_RUN)
    done = subprocess.run(
        [str(python), str(script)], env=env, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen == {"main": True, "default": "forkserver", "spawn": True, "forkserver": True}
    # main, the spawn child, the forkserver (its children fork from it), the resource tracker
    counts = _calls_per_process(calls)
    assert len(counts) >= 3 and set(counts) == {1}, counts
    assert "Warning" not in done.stderr, done.stderr
    traced = subprocess.run(
        [str(python), "-v", "-c", "pass"], env=env, capture_output=True, text=True, timeout=120
    ).stderr
    pth = site / "compatshim_auto.pth"
    assert f"import lines in {pth} are suppressed due to matching" in traced
    assert f"import lines in {pth} are deprecated" not in traced


@pytest.mark.timeout(300)
@pytest.mark.skipif(sys.version_info < (3, 15), reason="PEP 829 .start files: Python 3.15+")
def test_on_315_the_probe_sees_a_hook_run_twice(tmp_path: Path) -> None:
    """The probe's own check: with a .start file that does not match the .pth (another name),
    3.15 runs the import line and the entry point, and the count says 2."""
    _installed_files()
    python, _ = _venv_with_the_wheel(tmp_path, "compatshim_other.start")
    calls = tmp_path / "calls"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COMPATSHIM_", "PYTHON"))}
    env.update(COMPATSHIM_AUTO="1", HOOK_CALLS=str(calls))
    done = subprocess.run(
        [str(python), "-c", "pass"], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert _calls_per_process(calls) == [2]
