"""Run a job script of this folder in a fresh interpreter, with or without compatshim."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
JOB_TIMEOUT_S = 600  # a resume imports torch and a framework: tens of seconds on 2 cores


def run_job(
    script: str, mode: str, folder: Path, *, compatshim: bool, unrestricted: bool = False
) -> dict[str, Any]:
    """The job's ``RESULT`` record, plus its stderr; ``compatshim`` sets ``COMPATSHIM_AUTO=1``.

    ``unrestricted`` sets ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1``: what users do today (plain
    pickle, runs any code), used only as the reference of what a full load gives.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COMPATSHIM_", "TORCH_FORCE"))}
    env["PYTHONWARNINGS"] = "default"
    if unrestricted:
        env["TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"] = "1"
    if compatshim:
        env["COMPATSHIM_AUTO"] = "1"
    done = subprocess.run(
        [sys.executable, str(HERE / script), mode, str(folder)],
        env=env,
        capture_output=True,
        text=True,
        timeout=JOB_TIMEOUT_S,
    )
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            result: dict[str, Any] = json.loads(line[len("RESULT ") :])
            result["stderr"] = done.stderr
            return result
    raise AssertionError(
        f"{script} {mode} (compatshim={compatshim}) printed no result, exit {done.returncode}:\n"
        f"{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    )


def release(distribution: str) -> tuple[int, int]:
    from importlib.metadata import version

    major, minor = version(distribution).split(".")[:2]
    return int(major), int(minor)


def torch_loads_weights_only_by_default() -> bool:
    """torch 2.6 made ``weights_only=True`` the default of ``torch.load``."""
    return release("torch") >= (2, 6)
