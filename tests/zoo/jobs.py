"""Run a job script of this folder in a fresh interpreter and return its ``RESULT`` record."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
# A job imports torch and a framework and trains a few steps: 10-60 s on a busy 2-core machine.
JOB_TIMEOUT_S = 600


def timeout_for(jobs: int) -> int:
    """A ``pytest.mark.timeout`` for a test whose module fixture runs ``jobs`` jobs in a row."""
    return jobs * JOB_TIMEOUT_S + 120


def run_job(script: str, mode: str, folder: Path) -> dict[str, Any]:
    """The job's ``RESULT`` record; the job itself decides whether to arm compatshim."""
    try:
        done = subprocess.run(
            [sys.executable, str(HERE / script), mode, str(folder)],
            capture_output=True,
            text=True,
            timeout=JOB_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        raise AssertionError(f"{script} {mode} still running after {JOB_TIMEOUT_S} s") from None
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            result: dict[str, Any] = json.loads(line[len("RESULT ") :])
            result["stderr"] = done.stderr[-5000:]
            return result
    raise AssertionError(
        f"{script} {mode} printed no result, exit {done.returncode}:\n"
        f"{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    )


def torch_loads_weights_only_by_default() -> bool:
    """torch 2.6 made ``weights_only=True`` the default of ``torch.load``."""
    major, minor = version("torch").split(".")[:2]
    return (int(major), int(minor)) >= (2, 6)
