"""Real Lightning Fabric (CPU, 2 ranks, ddp over gloo): out-of-step ranks end in a DesyncError.

Each scenario is a script in ``scripts/`` run exactly as a user runs it, with
``COMPATSHIM_AUTO=1`` in the environment (the wheel's ``.pth`` hook arms the
patch in the launcher and in every rank Fabric re-executes) and a short
``COMPATSHIM_DESYNC_TIMEOUT``. Without compatshim each broken script hangs for
torch's 30 minutes; here each must end well inside a hard timeout, name the
ranks and the script's file:line, and leave no process behind.

The runs are slow to start (every rank imports torch and Lightning), so the
module starts them all at once, a few at a time, and each test waits for its own.
"""

from __future__ import annotations

import os
import re
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Iterator

import pytest

pytest.importorskip("lightning")

from fabric_runs import Run, run_script, site_line

pytestmark = [pytest.mark.dist, pytest.mark.slow]

RESULT = re.compile(r"RESULT rank=\d+ gathered=\[\[.*?\]\] params=-?\d+\.\d{6}")
DESYNC_TIMEOUT = 20.0
HARD_TIMEOUT = 240.0

SCENARIOS: dict[str, tuple[str, tuple[str, ...], bool]] = {
    "healthy": ("healthy.py", (), True),
    "healthy_unpatched": ("healthy.py", (), False),
    "launch_in_rank0_object": ("launch_in_rank0_object.py", (), True),
    "second_setup_then_barrier": ("second_setup_on_rank0.py", ("barrier",), True),
    "second_setup_then_step": ("second_setup_on_rank0.py", ("step",), True),
    "world_size_decides": ("world_size_decides.py", (), True),
    "different_shapes": ("different_shapes.py", (), True),
}


@pytest.fixture(scope="module")
def runs() -> Iterator[dict[str, Future[Run]]]:
    workers = int(os.environ.get("COMPATSHIM_TEST_PARALLEL", "3"))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {
            name: pool.submit(
                run_script,
                script,
                *args,
                auto=auto,
                desync_timeout=DESYNC_TIMEOUT,
                hard_timeout=HARD_TIMEOUT,
            )
            for name, (script, args, auto) in SCENARIOS.items()
        }
        yield futures


def finished(runs: dict[str, Future[Run]], name: str) -> Run:
    run = runs[name].result()
    assert not run.timed_out, (
        f"{name} still running after {HARD_TIMEOUT:.0f}s:\n{run.output[-4000:]}"
    )
    assert run.survivors == [], (
        f"{name} left processes behind: {run.survivors}\n{run.output[-3000:]}"
    )
    return run


def assert_desync(run: Run, *sites: str) -> None:
    text = run.output
    assert run.returncode != 0, text[-3000:]
    assert "compatshim.dist:" in text, text[-3000:]
    assert "rank 0" in text and "rank 1" in text, text[-3000:]
    for site in sites:
        assert site in text, f"{site} not in the report:\n{text[-3000:]}"


def test_healthy_script_runs_unchanged(runs: dict[str, Future[Run]]) -> None:
    patched = finished(runs, "healthy")
    plain = finished(runs, "healthy_unpatched")
    assert patched.returncode == 0, patched.output[-3000:]
    assert plain.returncode == 0, plain.output[-3000:]
    results = sorted(RESULT.findall(patched.stdout))
    assert len(results) == 2, patched.output[-3000:]
    assert results == sorted(RESULT.findall(plain.stdout))
    assert "compatshim.dist" not in patched.output


def test_launch_inside_rank0_only_object(runs: dict[str, Future[Run]]) -> None:
    run = finished(runs, "launch_in_rank0_object")
    assert_desync(run, site_line("launch_in_rank0_object.py", "launch-site"))
    assert "rank 1 ended (exit code 0) before joining the process group" in run.output
    assert "Fabric.launch" in run.output


@pytest.mark.parametrize(
    ("name", "rank1_site"),
    [("second_setup_then_barrier", "barrier-site"), ("second_setup_then_step", "step-site")],
)
def test_second_setup_module_on_rank0_only(
    runs: dict[str, Future[Run]], name: str, rank1_site: str
) -> None:
    run = finished(runs, name)
    script = "second_setup_on_rank0.py"
    assert_desync(run, site_line(script, "rank0-second-setup"), site_line(script, rank1_site))
    assert "DesyncError" in run.output
    assert "rank(s) [1] never reached sync point" in run.output
    # the report arrives once both ranks sit still, long before the timeout would
    assert "timeout 20 s" in run.output


def test_world_size_read_before_launch(runs: dict[str, Future[Run]]) -> None:
    run = finished(runs, "world_size_decides")
    script = "world_size_decides.py"
    assert_desync(run, site_line(script, "ddp-wrap-site"), site_line(script, "plain-step-site"))
    assert "in Fabric.all_reduce" in run.output


def test_different_parameter_shapes(runs: dict[str, Future[Run]]) -> None:
    run = finished(runs, "different_shapes")
    assert_desync(run, site_line("different_shapes.py", "shapes-site"))
    assert "modules differ at entry #0" in run.output
    assert (
        "'body.weight' shape (8, 4)" in run.output and "'body.weight' shape (12, 4)" in run.output
    )


def test_patch_is_idempotent_and_reverts_exactly() -> None:
    from lightning.fabric import Fabric

    import compatshim
    from compatshim.patches.lightning_fabric_desync import MARK, WRAPPED

    compatshim.uninstall(["lightning-fabric-desync"])  # in case COMPATSHIM_AUTO armed it
    originals = {name: Fabric.__dict__[name] for name in WRAPPED}
    try:
        assert compatshim.install(include=["lightning-fabric-desync"]) == [
            "lightning-fabric-desync"
        ]
        compatshim.install(include=["lightning-fabric-desync"])
        wrapped = {name: Fabric.__dict__[name] for name in WRAPPED}
        for name in WRAPPED:
            assert getattr(wrapped[name], MARK, False), name
            assert wrapped[name].__wrapped__ is originals[name], name  # wrapped once, not twice
        row = next(r for r in compatshim.status() if r["name"] == "lightning-fabric-desync")
        assert row["defect"] == "present" and row["applied"] and row["fixed"], row
    finally:
        compatshim.uninstall(["lightning-fabric-desync"])
    assert {name: Fabric.__dict__[name] for name in WRAPPED} == originals
