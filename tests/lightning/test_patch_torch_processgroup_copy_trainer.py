"""Patch ``torch-processgroup-copy`` under a real Lightning Trainer: a dataset holding a subgroup.

``scripts/group_dataset.py`` runs as a user runs it (``python group_dataset.py
<method>``; CPU, 2 ranks, ddp over gloo): each rank builds a dataset that keeps a
``dist.new_group`` subgroup and hands it to a DataLoader with two workers started
by ``forkserver`` (Python 3.14's default on Linux; named here, which is how 3.14 is
emulated below it) or ``spawn``, so the dataset crosses into each worker by pickle.

- ``COMPATSHIM_AUTO=1``: every rank fits its steps; each worker holds an unbound
  stand-in for the group (armed in the worker too), and the batches equal those
  of the same seed from a dataset that keeps no group, with nothing armed: the
  stand-in changes no sample. (That reference is not ``fork``, though fork gives the
  same batches: Python 3.11 up to 3.11.7 can deadlock a child forked from a process
  whose other threads hold the interpreter's thread-state lock, CPython gh-112275. A
  rank here has gloo's and Lightning's threads; the CI's 3.11.7 hung there once, and
  here once in 32 runs.)
- ``COMPATSHIM_AUTO=0`` (the control): the workers cannot be started, with torch's
  known ``cannot pickle ... ProcessGroup`` error.
"""

from __future__ import annotations

import json
import os
import re
from concurrent.futures import Future, ThreadPoolExecutor
from importlib import metadata
from typing import Any, Iterator

import pytest

pytest.importorskip("torch")

from tests.lightning.fabric_runs import Run, run_script

try:
    metadata.distribution("lightning")  # not find_spec: tests/lightning/ is a namespace package
except metadata.PackageNotFoundError:
    pytest.skip("the lightning distribution (Trainer) is not installed", allow_module_level=True)

pytestmark = [pytest.mark.dist, pytest.mark.slow]

SCRIPT = "group_dataset.py"
HARD_TIMEOUT = 480.0
STEPS = 3
RESULT = re.compile(r"^RESULT (\{.*\})$", re.M)
PICKLE_ERROR = "TypeError: cannot pickle 'torch._C._distributed_c10d.ProcessGroup' object"
SCENARIOS: dict[str, tuple[tuple[str, ...], bool]] = {  # name: (arguments, armed)
    "forkserver": (("forkserver",), True),
    "spawn": (("spawn",), True),
    "reference": (("spawn", "no-group"), False),  # the same seed, no group, nothing armed
    "forkserver_unarmed": (("forkserver",), False),
    "spawn_unarmed": (("spawn",), False),
}


@pytest.fixture(scope="module")
def runs() -> Iterator[dict[str, Future[Run]]]:
    workers = int(os.environ.get("COMPATSHIM_TEST_PARALLEL", "2"))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        yield {
            name: pool.submit(run_script, SCRIPT, *args, auto=auto, hard_timeout=HARD_TIMEOUT)
            for name, (args, auto) in SCENARIOS.items()
        }


def finished(runs: dict[str, Future[Run]], name: str) -> Run:
    run = runs[name].result()
    assert not run.timed_out, (
        f"{name} still running after {HARD_TIMEOUT:.0f}s:\n{run.output[-4000:]}"
    )
    assert run.survivors == [], f"{name} left processes behind: {run.survivors}"
    return run


def reports(run: Run) -> dict[int, dict[str, Any]]:
    """Each rank's RESULT line, by rank; both ranks must have fitted every step."""
    assert run.returncode == 0, run.output[-4000:]
    found = {r["rank"]: r for r in map(json.loads, RESULT.findall(run.stdout))}
    assert sorted(found) == [0, 1], run.output[-4000:]
    for report in found.values():
        assert report["global_step"] == STEPS and report["backend"] == "gloo", report
        assert len(report["batches"]) == STEPS, report
    return found


def samples(report: dict[str, Any], key: str) -> list[Any]:
    return [value for batch in report["batches"] for value in batch[key]]


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_every_rank_fits_with_workers_armed_by_the_environment(
    runs: dict[str, Future[Run]], method: str
) -> None:
    got = reports(finished(runs, method))
    for rank, report in got.items():
        assert set(samples(report, "group_type")) == {"UnboundProcessGroup"}, (rank, report)
        assert set(samples(report, "armed")) == {True}, f"rank {rank}: a worker was not armed"
        assert report["pid"] not in samples(report, "pid"), "the batches came from the rank itself"


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_batches_equal_the_same_seed_without_the_group(
    runs: dict[str, Future[Run]], method: str
) -> None:
    reference = reports(finished(runs, "reference"))
    got = reports(finished(runs, method))
    for rank in (0, 1):
        assert set(samples(reference[rank], "group_type")) == {"NoneType"}
        assert set(samples(reference[rank], "armed")) == {False}
        for key in ("index", "x"):
            assert samples(got[rank], key) == samples(reference[rank], key), (rank, key)


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_without_compatshim_the_workers_cannot_be_started(
    runs: dict[str, Future[Run]], method: str
) -> None:
    run = finished(runs, f"{method}_unarmed")
    assert run.returncode != 0, run.output[-4000:]
    assert RESULT.search(run.stdout) is None, run.output[-4000:]
    assert PICKLE_ERROR in run.output, run.output[-4000:]
    assert "compatshim: the child process" not in run.output  # nothing armed, not even the paths
