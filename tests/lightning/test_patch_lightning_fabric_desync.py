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

import atexit
import importlib
import os
import re
import sys
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Iterator

import pytest

pytest.importorskip("torch")

from tests.lightning.fabric_runs import FABRIC_MODULE, Run, run_script, site_line

pytest.importorskip(FABRIC_MODULE)

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
    "second_setup_in_launch_function": ("second_setup_on_rank0.py", ("barrier", "function"), True),
    "world_size_decides": ("world_size_decides.py", (), True),
    "different_shapes": ("different_shapes.py", (), True),
    "teardown_2": ("healthy_teardown.py", ("2",), True),
    "teardown_2_unpatched": ("healthy_teardown.py", ("2",), False),
    "teardown_1": ("healthy_teardown.py", ("1",), True),
}
HEADLINE = "compatshim.dist.DesyncError: "
TEARDOWN = re.compile(r"TEARDOWN rank=(\d+) (.*) monitor_ran=(True|False)")


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
    assert HEADLINE in text, text[-3000:]
    # every report, raised or printed by a monitor, opens with the same headline
    assert not re.search(r"^(\[rank\d\]: )?compatshim\.dist: ", text, re.M), text[-3000:]
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
    assert HEADLINE + "rank 1 ended (exit code 0) before joining the process group" in run.output, (
        run.output[-3000:]
    )
    assert "Fabric.launch" in run.output


@pytest.mark.parametrize(
    ("name", "rank1_site"),
    [
        ("second_setup_then_barrier", "barrier-site"),
        ("second_setup_then_step", "step-site"),
        # fabric.launch(run): launch() ends where run() starts; run()'s calls are watched
        ("second_setup_in_launch_function", "barrier-site"),
    ],
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


def teardown_lines(run: Run, *, exited: bool = True) -> dict[int, tuple[str, bool]]:
    """Per rank: what was left after destroy_process_group, and whether a monitor ran before."""
    assert run.returncode == 0 or not exited, run.output[-3000:]
    found = {int(m[1]): (m[2], m[3] == "True") for m in TEARDOWN.finditer(run.stdout)}
    assert found, run.output[-3000:]
    return found


def assert_nothing_left(line: str) -> None:
    assert "excepthook=compatshim" not in line, line
    assert "compatshim_atexit_handlers=0" in line, line
    assert "threads=[]" in line, line


def test_a_launch_that_fails_here_ends_the_child_ranks_it_started() -> None:
    """``MASTER_PORT`` already in use (a previous run still holds it): the launcher's
    ``launch()`` fails with torch's EADDRINUSE after it started rank 1, whose TCPStore client
    then retries for 30 minutes. Armed, rank 1 ends with the launcher; Fabric alone (the
    control) leaves it behind. Found when a loaded CI box handed two runs one port."""
    import socket

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)  # listens, never answers
        port = {"MASTER_PORT": str(held.getsockname()[1])}
        armed = run_script("healthy.py", auto=True, extra_env=port, hard_timeout=HARD_TIMEOUT)
        plain = run_script("healthy.py", auto=False, extra_env=port, hard_timeout=HARD_TIMEOUT)
    for run in (armed, plain):
        assert not run.timed_out and run.returncode != 0, run.output[-3000:]
        assert "EADDRINUSE" in run.output or "address already in use" in run.output
    assert armed.survivors == [], armed.output[-3000:]
    assert plain.survivors, "Fabric alone now ends its child ranks: the patch adds nothing here"


def test_a_port_taken_before_rank0_listens_is_picked_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The harness: a free port another process takes first (as seems to have happened in a
    fresh-clone CI run with other test envs beside it) ends one run in EADDRINUSE;
    ``run_script`` runs it once more on another port."""
    import socket

    from tests.lightning import fabric_runs

    real = fabric_runs.free_port
    picked: list[int] = []
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        taken = held.getsockname()[1]

        def first_taken() -> int:
            picked.append(real() if picked else taken)
            return picked[-1]

        monkeypatch.setattr(fabric_runs, "free_port", first_taken)
        run = run_script("healthy.py", hard_timeout=HARD_TIMEOUT)
    assert picked[0] == taken and len(picked) == 2
    assert run.returncode == 0 and run.survivors == [], run.output[-3000:]
    assert len(RESULT.findall(run.stdout)) == 2


def test_two_rank_run_leaves_nothing_after_destroy_process_group(
    runs: dict[str, Future[Run]],
) -> None:
    patched = teardown_lines(finished(runs, "teardown_2"))
    # The control is plain Lightning: only its TEARDOWN lines are compared. Its exit may hang
    # after destroy_process_group (torch's own race, pytorch/pytorch#75097: once in a loaded
    # fresh-clone CI run, both lines printed, then 240 s), which is not compatshim's to pass.
    control = runs["teardown_2_unpatched"].result()
    plain = teardown_lines(control, exited=False)
    assert sorted(plain) == [0, 1], control.output[-3000:]
    assert sorted(patched) == [0, 1]
    for rank in (0, 1):
        assert patched[rank][1], f"rank {rank}: the monitor never ran, the check proves nothing"
        assert patched[rank][0] == plain[rank][0], (rank, patched[rank], plain[rank])
        assert_nothing_left(patched[rank][0])


def test_one_rank_run_starts_no_monitor(runs: dict[str, Future[Run]]) -> None:
    found = teardown_lines(finished(runs, "teardown_1"))
    assert list(found) == [0]
    left, monitor_ran = found[0]
    assert not monitor_ran, found
    assert_nothing_left(left)


def fabric_class() -> Any:
    return importlib.import_module(FABRIC_MODULE).Fabric


# In-process gloo: a hang here would sit in C++ holding the GIL, where pytest-timeout's
# signal never lands; the thread method ends the run with every stack instead.
@pytest.mark.timeout(300, method="thread")
def test_in_process_one_device_run_leaves_nothing() -> None:
    """As Lightning's own tests run Fabric: in the test process, then its thread check."""
    import torch

    import compatshim

    def ours() -> list[str]:
        return [t.name for t in threading.enumerate() if t.name.startswith("compatshim")]

    fabric_class()  # imported first: its own import-time set-up is not ours
    compatshim.install(include=["lightning-fabric-desync"])
    assert ours() == []
    # torch (seen on 2.13, plain and armed) can deadlock when the last reference to a gloo
    # group goes while one of its worker threads drops a finished all_reduce that holds the
    # last reference to a Python tensor: the worker waits for the GIL, the main thread holds
    # it while joining that worker. Keeping the reduced tensors alive until the end means
    # the worker never needs the GIL.
    reduced: list[torch.Tensor] = []
    try:
        for strategy in ("auto", "ddp"):
            fabric = fabric_class()(accelerator="cpu", devices=1, strategy=strategy)
            fabric.launch()
            model = fabric.setup_module(torch.nn.Linear(4, 1))
            reduced.append(model(torch.ones(2, 4)).sum().detach())
            reduced.append(fabric.all_reduce(reduced[-1]))
            fabric.barrier()
            assert ours() == [], strategy
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
    finally:
        compatshim.uninstall(["lightning-fabric-desync"])
    assert ours() == []
    # torch's init_process_group installs an excepthook of its own; none may be compatshim's
    assert not getattr(sys.excepthook, "__module__", "").startswith("compatshim")
    from compatshim.desync.monitor import get_monitor

    handlers = atexit._ncallbacks()
    atexit.unregister(get_monitor()._at_exit)  # a no-op unless it is still registered
    assert atexit._ncallbacks() == handlers


def test_launch_with_a_stand_in_strategy_behaves_as_unpatched() -> None:
    """Lightning's own test_verify_launch_called swaps in a Mock strategy: launch() must work."""
    from unittest.mock import Mock

    import compatshim

    strategies = importlib.import_module(f"{FABRIC_MODULE}.strategies")
    compatshim.install(include=["lightning-fabric-desync"])
    try:
        fabric = fabric_class()(accelerator="cpu")
        fabric._strategy = Mock(spec=strategies.DDPStrategy)
        fabric.launch()
        assert fabric._launched
        assert not [t for t in threading.enumerate() if t.name.startswith("compatshim")]
    finally:
        compatshim.uninstall(["lightning-fabric-desync"])


def test_launch_arguments_reach_fabric_unchanged() -> None:
    """Fabric's own checks of launch()'s function still answer (as Lightning's
    test_launch_with_function expects)."""
    import compatshim

    compatshim.install(include=["lightning-fabric-desync"])
    try:
        fabric_class()().launch(lambda fabric, value: seen.append((fabric, value)), 7)
        with pytest.raises(TypeError, match="needs to be a callable"):
            fabric_class()().launch(None)  # a user calling the function instead of passing it
        with pytest.raises(TypeError, match="needs to take at least one argument"):
            fabric_class()().launch(lambda: None)
    finally:
        compatshim.uninstall(["lightning-fabric-desync"])
    assert [value for _, value in seen] == [7]


seen: list[tuple[Any, int]] = []


def test_patch_is_idempotent_and_reverts_exactly() -> None:
    Fabric = fabric_class()

    import compatshim
    from compatshim._engine.patching import in_force
    from compatshim.patches.lightning_fabric_desync import WRAPPED

    compatshim.uninstall(["lightning-fabric-desync"])  # in case COMPATSHIM_AUTO armed it
    originals = {name: Fabric.__dict__[name] for name in WRAPPED}
    try:
        assert compatshim.install(include=["lightning-fabric-desync"]) == [
            "lightning-fabric-desync"
        ]
        compatshim.install(include=["lightning-fabric-desync"])
        wrapped = {name: Fabric.__dict__[name] for name in WRAPPED}
        for name in WRAPPED:
            assert in_force(wrapped[name]), name
            assert wrapped[name].__wrapped__ is originals[name], name  # wrapped once, not twice
        row = next(r for r in compatshim.status() if r["name"] == "lightning-fabric-desync")
        assert row["defect"] == "present" and row["applied"] and row["fixed"], row
    finally:
        compatshim.uninstall(["lightning-fabric-desync"])
    assert {name: Fabric.__dict__[name] for name in WRAPPED} == originals


def test_a_wrapper_a_library_put_on_after_install_survives_uninstall(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Uninstall keeps it, and ours under it then watches nothing (Fabric's own call);
    installing again watches through it."""
    import compatshim
    from compatshim.desync import _framework
    from tests.harness.catalogue import a_library_wraps

    Fabric = fabric_class()
    compatshim.uninstall(["lightning-fabric-desync"])
    torchs = Fabric.__dict__["barrier"]
    watched: list[int] = []
    real_watch = _framework.watch_process_group

    def counted() -> Any:
        watched.append(1)
        return real_watch()

    monkeypatch.setattr(_framework, "watch_process_group", counted)
    compatshim.install(include=["lightning-fabric-desync"])
    try:
        library = a_library_wraps(Fabric, "barrier")
        compatshim.uninstall(["lightning-fabric-desync"])
        assert Fabric.__dict__["barrier"] is library
        fabric = Fabric(accelerator="cpu", devices=1)
        fabric.barrier()
        assert watched == []
        compatshim.install(include=["lightning-fabric-desync"])
        fabric.barrier()
        assert watched, "armed again: the barrier is watched"
        compatshim.uninstall(["lightning-fabric-desync"])
        assert Fabric.__dict__["barrier"] is library
    finally:
        compatshim.uninstall(["lightning-fabric-desync"])
        Fabric.barrier = torchs
