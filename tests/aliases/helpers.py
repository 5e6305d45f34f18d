"""Children for the alias tests: each runs in a fresh interpreter, so ``sys.modules`` is clean."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def child_env(extra_path: str | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("COMPATSHIM_AUTO", None)
    paths = [str(ROOT / "src")]  # not tests/: its lightning/ folder would pass for a package
    if extra_path:
        paths.insert(0, extra_path)
    env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")])
    return env


def run(code: str, *, extra_path: str | None = None, check: bool = True) -> Any:
    """Run ``code`` in a child; it prints one JSON value last, which is returned."""
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=child_env(extra_path),
        capture_output=True,
        text=True,
        timeout=180,
    )
    if check and done.returncode != 0:
        raise AssertionError(f"child failed ({done.returncode}):\n{done.stderr[-3000:]}")
    if not check:
        return done
    return json.loads(done.stdout.strip().splitlines()[-1])


def version_at_least(distribution: str, minimum: str) -> bool:
    from importlib import metadata

    from packaging.version import Version

    try:
        return Version(metadata.version(distribution)) >= Version(minimum)
    except metadata.PackageNotFoundError:
        return False


def real_module_findable(name: str) -> bool:
    from importlib.machinery import PathFinder

    return PathFinder.find_spec(name) is not None


def skip_unless_installed(distribution: str) -> None:
    """``importorskip`` without importing (the module may need the alias being tested)."""
    from importlib import metadata

    import pytest

    try:
        metadata.version(distribution)
    except metadata.PackageNotFoundError:
        pytest.skip(f"{distribution} is not installed")
