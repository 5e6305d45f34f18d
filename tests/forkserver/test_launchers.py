"""The forkserver default as users meet it: torchrun, ``mp.spawn`` and Lightning's launcher.

Each launcher starts a training script in a fresh interpreter armed only by
``COMPATSHIM_AUTO=1`` (as a user's job is), and every rank's DataLoader starts two
workers with no start method named: ``forkserver`` from Python 3.14 on Linux (below
3.14 the ranks set it as the default, which is how it is emulated there; Lightning's
run is skipped there, tests/lightning runs it with the method named), and ``spawn`` in
``mp.spawn``'s ranks on every Python (a child started by ``spawn`` keeps that method as its
default). What must hold:

- ``torch-processgroup-copy`` applies in the workers: a dataset holding a gloo subgroup
  crosses into them (an unbound stand-in arrives; the workers are armed too);
- ``multiprocessing-pickle-paths``: a worker, or an ``mp.spawn`` rank, whose arguments
  hold a lambda fails with pickle's error plus compatshim's line naming the lambda's path;
- the control (``COMPATSHIM_AUTO=0``) fails with torch's own pickling error, no line added.

The runs start together (``COMPATSHIM_TEST_PARALLEL``, 2 by default); each has a hard
timeout and leaves no process behind (the whole session is killed on timeout).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Iterator

import pytest

dist = pytest.importorskip("torch.distributed")

from tests.harness.dist import free_port, python_env  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = "tests.forkserver.launch_ranks"
HARD_TIMEOUT = 420.0
RESULT = re.compile(r"^RESULT (\{.*\})$", re.M)
GROUP_ERROR = "cannot pickle 'torch._C._distributed_c10d.ProcessGroup' object"
PATH_LINE = "compatshim: the child process cannot be sent "
DEFAULT_IS_FORKSERVER = sys.version_info >= (3, 14)

pytestmark = [
    pytest.mark.dist,
    pytest.mark.slow,
    pytest.mark.timeout(900),
    pytest.mark.skipif(not dist.is_available(), reason="torch built without distributed"),
]


def _installed(distribution: str) -> bool:
    # not find_spec("lightning"): under pytest, tests/lightning/ is a namespace package
    try:
        metadata.distribution(distribution)
    except metadata.PackageNotFoundError:
        return False
    return True


HAS_LIGHTNING = _installed("lightning")
LIGHTNING_SCRIPTS = ROOT / "tests" / "lightning" / "scripts"


@dataclass
class Run:
    returncode: int | None
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + "\n" + self.stderr

    def reports(self) -> dict[int, dict[str, Any]]:
        """Each rank's RESULT line, by rank; both ranks must have reported."""
        found = {r["rank"]: r for r in map(json.loads, RESULT.findall(self.stdout))}
        assert sorted(found) == [0, 1], self.output[-4000:]
        return found


def _run(argv: list[str], auto: bool, cwd: Path = ROOT) -> Run:
    env = python_env(
        COMPATSHIM_AUTO="1" if auto else "0",
        OMP_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
    )
    for key in ("COMPATSHIM_DISABLE", "WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK"):
        env.pop(key, None)
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=HARD_TIMEOUT)
    except subprocess.TimeoutExpired:
        _end(proc.pid, signal.SIGTERM)  # torchrun and Lightning stop their ranks on SIGTERM
        try:
            out, err = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            _end(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
        return Run(None, out, f"still running after {HARD_TIMEOUT:.0f}s, stopped:\n{err}")
    finally:
        _end(proc.pid, signal.SIGKILL)  # ranks or workers their launcher left behind
    return Run(proc.returncode, out, err)


def _end(session: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(session, sig)


TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
RUNS: dict[str, tuple[list[str], bool, Path]] = {
    "torchrun": ([*TORCHRUN, "-m", SCRIPT, "torchrun"], True, ROOT),
    "torchrun_unarmed": ([*TORCHRUN, "-m", SCRIPT, "torchrun"], False, ROOT),
    "mp_spawn": ([sys.executable, "-m", SCRIPT, "mp-spawn"], True, ROOT),
    "mp_spawn_unpicklable": ([sys.executable, "-m", SCRIPT, "mp-spawn-unpicklable"], True, ROOT),
}
if HAS_LIGHTNING and DEFAULT_IS_FORKSERVER:
    for name, auto in (("lightning", True), ("lightning_unarmed", False)):
        argv = [sys.executable, str(LIGHTNING_SCRIPTS / "group_dataset.py"), "default"]
        RUNS[name] = (argv, auto, LIGHTNING_SCRIPTS)


@pytest.fixture(scope="module")
def runs() -> Iterator[dict[str, Future[Run]]]:
    workers = int(os.environ.get("COMPATSHIM_TEST_PARALLEL", "2"))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        yield {name: pool.submit(_run, *spec) for name, spec in RUNS.items()}


DEFAULT_METHOD = {"torchrun": "forkserver", "mp_spawn": "spawn"}


def _armed_reports(run: Run, launcher: str) -> dict[int, dict[str, Any]]:
    assert run.returncode == 0, run.output[-4000:]
    found = run.reports()
    for rank, report in found.items():
        assert report["armed"] is True, f"COMPATSHIM_AUTO=1 did not arm rank {rank}: {report}"
        assert report["start_method"] == DEFAULT_METHOD[launcher], report
        assert report["loader"] == "ok", report
        assert report["group_type"] == ["UnboundProcessGroup"], report
        assert report["worker_armed"] == [True], f"rank {rank}: a worker was not armed: {report}"
        assert report["pid"] not in report["worker_pids"], "the batches came from the rank itself"
        assert report["all_reduce"] == 2.0, report  # the rank's own group still talks
    return found


@pytest.mark.parametrize("launcher", ["torchrun", "mp_spawn"])
def test_workers_get_the_group_and_an_unpicklable_config_is_named(
    runs: dict[str, Future[Run]], launcher: str
) -> None:
    for report in _armed_reports(runs[launcher].result(), launcher).values():
        error = report["unpicklable"]
        assert error != "started", report
        first, *rest = error.splitlines()
        assert "lambda" in first, error  # pickle's own message comes first, unchanged
        assert len(rest) == 1 and rest[0].startswith(PATH_LINE), error
        # torch 2.15 passes the dataset in a tuple: args[1][0]
        assert "_worker_loop args[1]" in rest[0] and ".config.transform (function)" in rest[0]


def test_torchrun_control_without_compatshim_fails_with_torchs_error(
    runs: dict[str, Future[Run]],
) -> None:
    run = runs["torchrun_unarmed"].result()
    for report in run.reports().values():
        assert report["armed"] is False, report
        assert GROUP_ERROR in report["loader"], report
        assert PATH_LINE not in report["loader"] + report["unpicklable"], report


def test_mp_spawn_argument_that_cannot_be_pickled_is_named(runs: dict[str, Future[Run]]) -> None:
    run = runs["mp_spawn_unpicklable"].result()
    assert run.returncode not in (0, None), run.output[-4000:]
    assert "a rank started" not in run.output, run.output[-4000:]
    lines = [line for line in run.output.splitlines() if line.startswith(PATH_LINE)]
    assert len(lines) == 1, run.output[-4000:]
    assert "args[2][0].transform (function)" in lines[0], lines[0]


@pytest.mark.skipif(not DEFAULT_IS_FORKSERVER, reason="the default is fork before Python 3.14")
@pytest.mark.skipif(not HAS_LIGHTNING, reason="the lightning distribution is not installed")
def test_lightning_launcher_workers_get_the_group(runs: dict[str, Future[Run]]) -> None:
    run = runs["lightning"].result()
    assert run.returncode == 0, run.output[-4000:]
    for rank, report in run.reports().items():
        seen = [value for batch in report["batches"] for value in batch["group_type"]]
        armed = [value for batch in report["batches"] for value in batch["armed"]]
        assert set(seen) == {"UnboundProcessGroup"}, (rank, report)
        assert set(armed) == {True}, f"rank {rank}: a worker was not armed"
    control = runs["lightning_unarmed"].result()
    assert control.returncode != 0 and RESULT.search(control.output) is None, control.output[-4000:]
    assert GROUP_ERROR in control.output, control.output[-4000:]
