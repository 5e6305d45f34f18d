"""Patch ``torch-processgroup-copy`` in ``torch.multiprocessing`` children: the EMA deep copy.

``start_processes(start_method=...)`` under ``forkserver`` (Python 3.14's default on
Linux; named here, which is how 3.14 is emulated below it) and ``spawn``. Each run is
a fresh interpreter (:mod:`core.ema_spawn`), so the forkserver it starts carries only
that run's ``COMPATSHIM_AUTO``. Armed, every child deep-copies a model holding a
gloo subgroup, steps an EMA of it and all-reduces through the copy's group; the
control (``COMPATSHIM_AUTO=0``) fails the deep copy with torch's pickling error.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

dist = pytest.importorskip("torch.distributed")

from tests.harness.dist import free_port, python_env  # noqa: E402

START_METHODS = ("forkserver", "spawn")
TIMEOUT_S = 240.0

pytestmark = [
    pytest.mark.dist,
    pytest.mark.skipif(not dist.is_available(), reason="torch built without distributed"),
]


def _run(method: str, auto: str, tmp_path: Path) -> dict[str, Any]:
    code = (
        "from tests.core.ema_spawn import main; "
        f"main({method!r}, {free_port()}, {str(tmp_path)!r}, {TIMEOUT_S - 30})"
    )
    env = python_env(COMPATSHIM_AUTO=auto, OMP_NUM_THREADS="1")
    env.pop("COMPATSHIM_DISABLE", None)
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=TIMEOUT_S
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.parametrize("method", START_METHODS)
def test_ema_deep_copy_works_in_every_child_armed_by_the_environment(
    method: str, tmp_path: Path
) -> None:
    result = _run(method, "1", tmp_path)
    ranks = result["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1]
    for report in ranks:
        assert report["armed"] is True, f"COMPATSHIM_AUTO=1 did not arm the child: {report}"
        assert report["deepcopy"] == "ok", report
        assert report["shares_group"] is True and report["params_copied"] is True, report
        assert report["ema_err"] < 1e-6, report
        assert report["all_reduce"] == 2.0, report  # one from each rank, through the copy


@pytest.mark.parametrize("method", START_METHODS)
def test_without_compatshim_the_deep_copy_fails_in_every_child(method: str, tmp_path: Path) -> None:
    result = _run(method, "0", tmp_path)
    assert result["parent_armed"] is False
    for report in result["ranks"]:
        assert report["armed"] is False, report
        assert report["deepcopy"].startswith("TypeError: "), report
        assert "pickle" in report["deepcopy"] and "ProcessGroup" in report["deepcopy"], report
