"""Job scripts of this folder: run one in a fresh interpreter (``run_job``), or be its ``main``.

A job script (``mmengine_job.py``, ``timm_job.py``) runs as ``SCRIPT MODE FOLDER``
and imports this module as ``jobs`` (its folder is first on ``sys.path``); it
supplies what differs, :func:`job_main` does the rest.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import traceback
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import Any

PATCH = "torch-load-safe-globals"

HERE = Path(__file__).resolve().parent
# A job imports torch and a framework and trains a few steps: 10-60 s on a busy 2-core machine.
JOB_TIMEOUT_S = 600


def timeout_for(jobs: int) -> int:
    """A ``pytest.mark.timeout`` for a test whose module fixture runs ``jobs`` jobs in a row."""
    return jobs * JOB_TIMEOUT_S + 120


def run_job(script: str, mode: str, folder: Path) -> dict[str, Any]:
    """The job's ``RESULT`` record; the job itself decides whether to arm compatshim."""
    # mmengine's Runner takes CUDA whenever it is visible and has no CPU switch of its own: hiding
    # the GPUs is its documented way to train on CPU, so the job runs as on a CPU machine
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    try:
        done = subprocess.run(
            [sys.executable, str(HERE / script), mode, str(folder)],
            env=env,
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


class _Keep(logging.Handler):
    """compatshim logs each decision (a retried load among them) on its logger."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


Save = Callable[[Path, dict[str, Any]], None]
Resume = Callable[[Path, str, dict[str, Any]], Callable[[], None]]


def job_main(save: Save, resume: Resume) -> None:
    """A job's ``main``: ``save FOLDER`` or ``resume-plain|resume-armed FOLDER``; one RESULT line.

    ``save(folder, states)`` trains and checkpoints. ``resume(folder, mode, states)``
    builds the resumed run unarmed and returns what resumes it; for ``resume-armed``
    that runs between ``compatshim.install(include=[PATCH])`` and
    ``compatshim.uninstall``. Both record what they check in ``states``.
    """
    mode, folder = sys.argv[1], Path(sys.argv[2])
    kept = _Keep()
    logging.getLogger("compatshim").setLevel(logging.DEBUG)
    logging.getLogger("compatshim").addHandler(kept)
    result: dict[str, Any] = {"mode": mode}
    states: dict[str, Any] = {}
    installed: list[str] = []
    try:
        if mode == "save":
            save(folder, states)
        else:
            run = resume(folder, mode, states)
            if mode == "resume-armed":
                import compatshim

                installed = compatshim.install(include=[PATCH])
            try:
                run()
            finally:
                if installed:
                    import compatshim

                    compatshim.uninstall(installed)
        result["ok"] = True
    except Exception as exc:
        result.update(
            ok=False,
            error_type=f"{type(exc).__module__}.{type(exc).__qualname__}",
            error=str(exc)[:2000],
            traceback=traceback.format_exc()[-4000:],
        )
    import torch

    if installed:
        result["restored"] = torch.load.__module__ == "torch.serialization"
    result["installed"] = installed
    result["states"] = states
    result["retried"] = [line for line in kept.lines if "retried" in line]
    result["compatshim_imported"] = "compatshim" in sys.modules
    print("RESULT " + json.dumps(result))
