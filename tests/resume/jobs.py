"""Run a job script of this folder in a fresh interpreter, with or without compatshim."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
# A job imports torch and a framework and trains a few steps: 30-90 s on a busy 2-core machine.
# The bound is generous (a machine shared with other test runs) and only stops a hung job.
JOB_TIMEOUT_S = 600


def timeout_for(jobs: int) -> int:
    """A ``pytest.mark.timeout`` for a test whose module fixture runs ``jobs`` jobs in a row."""
    return jobs * JOB_TIMEOUT_S + 120


def run_job(
    script: str, mode: str, folder: Path, *, compatshim: bool, hardened: bool = False
) -> dict[str, Any]:
    """The job's ``RESULT`` record, plus its stderr; ``compatshim`` sets ``COMPATSHIM_AUTO=1``.

    ``hardened`` adds ``COMPATSHIM_SAFE_LOAD=1``: every ``torch.load``, ``weights_only=False``
    included, goes through compatshim's loader.

    Without it the job runs with no compatshim at all (not even imported); neither run
    ever loads with ``weights_only=False`` unless the framework itself passes it.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COMPATSHIM_", "TORCH_FORCE"))}
    env["PYTHONWARNINGS"] = "default"
    if compatshim:
        env["COMPATSHIM_AUTO"] = "1"
    if hardened:
        env["COMPATSHIM_SAFE_LOAD"] = "1"
    try:
        done = subprocess.run(
            [sys.executable, str(HERE / script), mode, str(folder)],
            env=env,
            capture_output=True,
            text=True,
            timeout=JOB_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired as late:  # killed by subprocess.run; show how far it got
        raise AssertionError(
            f"{script} {mode} (compatshim={compatshim}) still running after {JOB_TIMEOUT_S} s:\n"
            f"{_text(late.stdout)[-3000:]}\n{_text(late.stderr)[-5000:]}"
        ) from None
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            result: dict[str, Any] = json.loads(line[len("RESULT ") :])
            result["stderr"] = done.stderr
            assert result["compatshim_imported"] is compatshim, f"{script} {mode}: {result}"
            return result
    raise AssertionError(
        f"{script} {mode} (compatshim={compatshim}) printed no result, exit {done.returncode}:\n"
        f"{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    )


def _text(output: str | bytes | None) -> str:
    if isinstance(output, bytes):  # TimeoutExpired holds bytes even in text mode
        return output.decode(errors="replace")
    return output or ""


def release(distribution: str) -> tuple[int, int]:
    from importlib.metadata import version

    major, minor = version(distribution).split(".")[:2]
    return int(major), int(minor)


def torch_loads_weights_only_by_default() -> bool:
    """torch 2.6 made ``weights_only=True`` the default of ``torch.load``."""
    return release("torch") >= (2, 6)
