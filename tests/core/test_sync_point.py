"""compatshim.dist without Lightning: plain torch.multiprocessing ranks over a real gloo group.

Sync points that agree return; different tags, a rank that never arrives, a
rank that exits and a rank killed with SIGKILL each end in a DesyncError report
on the ranks still running, well inside the harness's hard timeout. The
consistency check names the first parameter that differs.
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from tests.core import dist_workers as workers
from tests.harness.dist import run_ranks

pytestmark = pytest.mark.dist


def test_matching_sync_points_return() -> None:
    assert run_ranks(workers.same_tags, 2, args=(3,), timeout=120) == [
        ["rank 0 passed 3 sync points"],
        ["rank 1 passed 3 sync points"],
    ]


def test_sync_points_leave_no_keys_behind_in_the_store() -> None:
    """A sync point per training step must not grow rank 0's store without bound: each rank
    deletes its arrival record of the sync point before once every rank has reached this one
    (before the fix: 2 keys more per sync point, 400 here)."""
    results = run_ranks(workers.store_keys_over_many_sync_points, 2, args=(200,), timeout=180)
    for result in results:
        assert result["after"] - result["before"] <= 2, result  # at most the world size


def test_a_rank_one_sync_point_behind_still_finds_every_arrival() -> None:
    """What a sync point deletes is only what no rank can read any more: a rank that looks
    after the others have gone on to the next sync point still finds their arrivals."""
    assert run_ranks(workers.lagging_rank_finds_the_arrivals, 2, args=(10,), timeout=120) == [
        "rank 0 passed 10 sync points",
        "rank 1 passed 10 sync points",
    ]


def test_a_store_that_cannot_delete_keeps_its_keys() -> None:
    """``Meeting.drop`` deletes on a torch store; a store without ``delete_key`` (or whose
    ``delete_key`` raises, as a ``Store`` subclass's does) keeps them and is not asked again."""
    import torch.distributed as dist

    from compatshim.desync._store import Meeting

    hashed = dist.HashStore()
    for key in ("a", "b"):
        hashed.set(key, "1")
    Meeting(hashed, 0, 2).drop(["a"])
    assert Meeting(hashed, 0, 2).has(["b"]) and not Meeting(hashed, 0, 2).has(["a"])

    class Lacks:  # a store-like object without delete_key
        pass

    class Refuses:
        asked = 0

        def delete_key(self, key: str) -> bool:
            Refuses.asked += 1
            raise RuntimeError("this store does not delete keys")

    class PureVirtual(dist.Store):  # type: ignore[misc]
        pass

    for store in (Lacks(), Refuses(), PureVirtual()):
        Meeting(store, 0, 2).drop(["b"])  # no error: the record stays
        Meeting(store, 0, 2).drop(["b"])
    assert Refuses.asked == 1
    assert Meeting(hashed, 0, 2).has(["b"])  # torch 2.1 has no Store.check


HEADLINE = "compatshim.dist.DesyncError: "


def test_different_tags_raise_on_every_rank() -> None:
    results = run_ranks(workers.different_tags, 2, timeout=120)
    for result in results:
        assert result["raised"], result
        report = result["report"]
        # the report opens with the error's name; the exception's own text does not repeat it
        assert report.startswith(HEADLINE + "ranks are out of step at sync point #1"), report
        assert result["message"] == report[len(HEADLINE) :]
        assert "ranks [0] at 'save'; ranks [1] at 'eval'" in report
        assert "dist_workers.py:" in report
        assert result["elapsed"] < 10


def test_rank_that_never_arrives_times_out_with_its_last_place() -> None:
    results = run_ranks(workers.one_rank_missing, 2, args=(3.0,), timeout=120)
    report = results[0]["report"]
    assert results[0]["raised"]
    assert 3.0 <= results[0]["elapsed"] < 15
    assert "rank 1: never arrived" in report
    assert "sync_point 'start'" in report and "dist_workers.py:" in report
    assert "not all ranks arrived within 3 s" in report


def test_a_new_process_group_on_the_same_store_does_not_read_the_last_ones_records() -> None:
    """destroy_process_group() then init_process_group() on a store that outlives the group
    (torchrun's agent store): the next group's sync points read the records of the one before
    (under torchrun rank 0 reported rank 1 'left the process group', its old exit record,
    while rank 1 was only late; here ranks compared their tag with an arrival from the group
    before)."""
    assert run_ranks(workers.reinit_on_a_shared_store, 2, args=(3,), init=False) == [
        ["met", "met", "met"],
        ["met", "met", "met"],
    ]


def test_ranks_told_different_world_sizes_raise_on_every_rank() -> None:
    """store= with world_size=2 on rank 0 and 3 on rank 1: rank 0 returned (both arrivals it
    waited for were there) and rank 1 waited its whole timeout for a rank 2."""
    for result in run_ranks(workers.world_sizes_disagree, 2, init=False):
        assert result["raised"] and result["elapsed"] < 15, result
        assert (
            "ranks disagree on the world size: ranks [0] say 2; ranks [1] say 3"
            in (result["report"])
        )


def test_a_rank_that_stops_on_another_ranks_report_does_not_claim_its_timeout() -> None:
    """Rank 1 (timeout 60 s) stopped waiting after about 2 s, on rank 0's report, and its
    own report said 'not all ranks arrived within 60 s'."""
    first, second, _ = run_ranks(workers.stops_on_another_ranks_report, 3)
    assert "(not all ranks arrived within 2 s)" in first["report"], first["report"]
    assert second["raised"] and second["elapsed"] < 30, second
    assert "within 60 s)" not in second["report"], second["report"]
    assert (
        "rank(s) [2] never reached sync point #1 'all three' (this rank stopped waiting when "
        "another rank reported the ranks out of step)" in second["report"]
    ), second["report"]
    assert "rank 0 already reported: " in second["report"]


def test_rank_killed_mid_run_is_reported_at_once() -> None:
    outcomes = run_ranks(workers.killed_mid_run, 2, timeout=120, expect_failure=True)
    kind, result = outcomes[0]
    assert kind == "ok", outcomes
    assert outcomes[1] == ("exit", -9)
    assert result["raised"] and result["elapsed"] < 15, result
    assert "is gone (killed or crashed" in result["report"]


def test_a_rank_that_loses_the_store_raises_a_desync_error() -> None:
    """Rank 0 (the TCPStore's host) ends while rank 1 waits at a sync point: rank 1 got torch's
    raw DistNetworkError ('Connection reset by peer'), naming neither rank nor sync point."""
    outcomes = run_ranks(workers.store_host_dies, 2, expect_failure=True)
    assert outcomes[0] == ("exit", 3), outcomes
    kind, result = outcomes[1]
    assert kind == "ok" and result["error"] == "DesyncError", outcomes
    assert result["text"].startswith(
        "rank 1 lost the process group's store while waiting at sync point #2 'second' "
        "(world size 2): "
    ), result
    assert "rank 0" in result["text"] and result["elapsed"] < 30, result


_LATE_RANK = """
import os, sys, time
from datetime import timedelta
import torch.distributed as dist
from compatshim.dist import DesyncError, sync_point
rank = int(os.environ["RANK"])
dist.init_process_group("gloo", rank=rank, world_size=2, timeout=timedelta(seconds=60))
sync_point("first", timeout=30)
if rank == 1:
    time.sleep(3)  # late, and alive
try:
    sync_point("second", timeout=30)
    print("met", os.getpid())
except DesyncError as exc:
    print(exc.report)
dist.destroy_process_group()
"""


@pytest.mark.timeout(200)
def test_a_late_rank_in_another_pid_namespace_is_not_taken_for_dead() -> None:
    """Ranks that share a hostname but not a PID namespace (docker --network=host, Kubernetes
    hostNetwork pods): rank 0 looked rank 1's pid up in its own namespace, did not find it
    and reported rank 1 'gone (killed or crashed)' while it was 3 s late. Rank 1 runs under
    ``unshare --pid`` with a pid that no process here has."""
    import shutil

    from tests.harness.dist import free_port

    unshare = shutil.which("unshare")
    probe = [unshare, "--pid", "--kill-child", "--mount-proc", "true"] if unshare else None
    if probe is None or subprocess.run(probe, capture_output=True, timeout=30).returncode:
        pytest.skip("needs unshare --pid --kill-child --mount-proc (root, Linux)")
    here = {int(name) for name in os.listdir("/proc") if name.isdigit()}
    wanted = next(pid for pid in range(4, 10_000) if pid not in here)
    # in the new namespace: sh is 1, seq 2, each /bin/true one more, python the next
    spawn = f'for i in $(seq 1 {wanted - 3}); do /bin/true; done; {sys.executable} -c "$0"'
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    env["WORLD_SIZE"] = "2"
    ranks = [
        subprocess.Popen(command, env={**env, "RANK": str(rank)}, stdout=subprocess.PIPE, text=True)
        for rank, command in enumerate(
            [
                [sys.executable, "-c", _LATE_RANK],
                [*probe[:-1], "sh", "-c", spawn, _LATE_RANK],
            ]
        )
    ]
    try:
        said = [rank.communicate(timeout=150)[0] for rank in ranks]
    finally:  # nothing left running if a rank hangs
        for rank in ranks:
            rank.kill()
            rank.wait(timeout=30)
    # torch 2.8's gloo prints "[Gloo] Rank 1 is connected to 1 peer ranks ..." on stdout
    said = [
        "".join(ln for ln in out.splitlines(True) if not ln.startswith("[Gloo]")) for out in said
    ]
    assert said[1].strip() == f"met {wanted}", said  # the pid nobody here has
    assert said[0].startswith("met "), said[0]


def test_rank_that_exits_is_reported_with_its_exit() -> None:
    results = run_ranks(workers.exits_early, 2, timeout=120)
    report = results[0]["report"]
    assert results[0]["raised"] and results[0]["elapsed"] < 15
    # it destroyed its process group on the way out (the harness does, like most scripts)
    assert "it left the process group: destroy_process_group() called at " in report
    assert "dist.py:" in report and "in _child" in report
    assert "rank(s) [1] left the process group)" in report


def test_module_consistency_passes_then_ddp_works() -> None:
    grads = run_ranks(workers.consistency_then_ddp, 2, timeout=120)
    assert grads[0] == pytest.approx(grads[1])


def test_module_shapes_differ() -> None:
    for result in run_ranks(workers.shapes_differ, 2, timeout=120):
        assert result["raised"]
        assert "ranks [0] have parameter '0.weight' shape (8, 4)" in result["report"]
        assert "ranks [1] have parameter '0.weight' shape (16, 4)" in result["report"]


def test_module_requires_grad_differs() -> None:
    for result in run_ranks(workers.requires_grad_differs, 2, timeout=120):
        assert result["raised"]
        assert (
            "torch.float32, requires_grad; ranks [1] have parameter '0.weight'" in result["report"]
        )


def test_watchdog_dumps_every_rank_and_ends_them(tmp_path: Path) -> None:
    outcomes = run_ranks(
        workers.watchdog_collective_hang,
        2,
        args=(4.0, str(tmp_path)),
        timeout=120,
        expect_failure=True,
    )
    assert outcomes == [("exit", 70), ("exit", 70)], outcomes
    reports = [(tmp_path / f"rank{rank}.txt").read_text() for rank in (0, 1)]
    joined = "\n".join(reports)
    for report in reports:  # the reporting rank and the rank ended by its monitor alike
        assert report.startswith(HEADLINE), report
    assert "has not moved for" in joined
    assert "--- rank 0 ---" in joined and "--- rank 1 ---" in joined
    assert "in watchdog_collective_hang" in joined
    assert "dist.barrier()" in joined and "threading.Event().wait()" in joined
    assert "never arrived" not in joined  # no sync point: nowhere to arrive


def test_watchdog_report_ends_a_rank_blocked_in_a_collective(tmp_path: Path) -> None:
    """Rank 1's watchdog fires long before rank 0's: rank 0, in a barrier, ends on rank 1's report.

    It must not be left in the barrier until rank 1's exit closes the connection (gloo's
    "Connection closed by peer" instead of the report), nor wait for its own watchdog.
    """
    outcomes = run_ranks(
        workers.watchdog_collective_hang,
        2,
        args=(3.0, str(tmp_path), 60.0),
        timeout=120,
        expect_failure=True,
    )
    assert outcomes == [("exit", 70), ("exit", 70)], outcomes
    rank0 = (tmp_path / "rank0.txt").read_text()
    assert rank0.startswith(HEADLINE + "rank 1's main thread has not moved for"), rank0
    assert "This rank (0, " in rank0 and "received rank 1's report and ends now" in rank0
    assert "Connection closed" not in rank0


def test_a_rank_that_caught_a_desync_answers_the_reports_of_a_later_group(
    tmp_path: Path,
) -> None:
    """After a caught DesyncError, destroy_process_group() and a new group, rank 0 ignored
    every report of the new group (it had 'raised one itself'): blocked in a barrier, it was
    not ended by rank 1's watchdog report and died of gloo's 'Connection closed by peer'."""
    outcomes = run_ranks(
        workers.caught_then_a_new_group_hangs, 2, args=(str(tmp_path),), expect_failure=True
    )
    rank0 = (tmp_path / "rank0.txt").read_text()
    assert outcomes == [("exit", 70), ("exit", 70)], (outcomes, rank0)
    assert rank0.startswith(HEADLINE + "rank 1's main thread has not moved for"), rank0
    assert "This rank (0, " in rank0 and "received rank 1's report and ends now" in rank0


def test_a_reporting_watchdog_does_not_pile_stacks_up_in_the_store() -> None:
    """watchdog(action="report") reports again every timeout while a rank stays still, and
    every report left each rank's stacks in rank 0's store: 37 keys more after 12 s at a 1 s
    timeout on 2 ranks (world size squared per timeout, for as long as it lasts)."""
    for result in run_ranks(workers.report_mode_store_keys, 2, args=(6.0,)):
        assert result["reports"] >= 2, result
        assert result["after"] - result["before"] <= 2, result  # the request counter, a late one


def test_watchdog_sees_a_loop_that_calls_one_helper_move() -> None:
    """Each step one long call in the same helper, 4 steps per timeout, 3 timeouts long: no
    report (a sample of the main thread's frame and line took each call for the last one)."""
    assert run_ranks(workers.watchdog_healthy_loop, 2, args=(1.0, 12), timeout=120) == [
        "rank 0 done",
        "rank 1 done",
    ]


def test_a_rank_that_caught_its_desync_error_goes_on() -> None:
    """Neither rank is ended by the notice of the report both raised, and later sync points
    pass though the ranks arrive 0.5 s apart."""
    for result in run_ranks(workers.goes_on_after_a_caught_desync, 2, args=(5,), timeout=120):
        assert result == {"raised": True, "steps": 5}


def test_monitor_stops_when_the_process_group_is_destroyed() -> None:
    for result in run_ranks(workers.monitor_gone_after_destroy, 2, timeout=120):
        assert result == {
            "ran": ["compatshim-dist-monitor"],
            "left": [],
            "excepthook_restored": True,
            "atexit_handlers": 0,
        }


def test_world_size_one_starts_no_monitor() -> None:
    assert run_ranks(workers.world_of_one, 1, timeout=120) == [
        {"left": [], "excepthook_restored": True, "atexit_handlers": 0}
    ]


def test_without_a_process_group_it_runs_alone_and_says_so_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A script run without a launcher goes on alone (supported), but not in silence: a call
    placed before init_process_group would otherwise hide every desync. One warning per
    process and function, at the caller's line, naming what to call."""
    import torch

    from compatshim.desync import sync
    from compatshim.dist import check_module_consistency, sync_point

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setattr(sync, "_warned_alone", set())
    with pytest.warns(RuntimeWarning, match=r"sync_point: no default process group") as warned:
        sync_point("alone", timeout=1)
    assert "init_process_group()" in str(warned[0].message)
    assert warned[0].filename == __file__
    with pytest.warns(RuntimeWarning, match="check_module_consistency: no default") as warned:
        check_module_consistency(torch.nn.Linear(2, 2), timeout=1)
    assert warned[0].filename == __file__
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once each
        sync_point("alone again", timeout=1)
        check_module_consistency(torch.nn.Linear(2, 2))


def test_a_one_rank_group_is_a_quiet_no_op(tmp_path: Path) -> None:
    """A 1-rank process group is a deliberate single-process run: nothing to say."""
    code = f"""
import warnings
import torch, torch.distributed as dist
from compatshim.dist import check_module_consistency, sync_point
warnings.simplefilter("error")
dist.init_process_group("gloo", init_method="file://{tmp_path / "store"}", rank=0, world_size=1)
sync_point("one", timeout=5)
check_module_consistency(torch.nn.Linear(2, 2), timeout=5)
dist.destroy_process_group()
print("QUIET")
"""
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK")}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=100
    )
    # torch 2.8's gloo prints its own "[Gloo] Rank 0 is connected to 0 peer ranks" line
    said = [line for line in done.stdout.splitlines() if not line.startswith("[Gloo] ")]
    assert done.returncode == 0 and said == ["QUIET"], (done.stdout, done.stderr)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda d: d.sync_point(None), "tag must be a non-empty string, got None"),
        (lambda d: d.sync_point("t", timeout="5"), "timeout: expected seconds.*got '5'"),
        (lambda d: d.sync_point("t", timeout=True), "timeout: expected seconds"),
        (lambda d: d.sync_point("t", store=object(), rank=0, world_size=2), "store: expected"),
        (lambda d: d.sync_point("t", store=_Store(), rank="0", world_size=2), "rank: expected"),
        (lambda d: d.sync_point("t", store=_Store(), rank=0, world_size=2.0), "world_size: exp"),
        (lambda d: d.check_module_consistency(None), "module: expected a torch.nn.Module"),
        (lambda d: d.check_module_consistency({"w": 1}), "module: expected a torch.nn.Module"),
        (lambda d: d.watchdog("60"), "timeout: expected seconds"),
        (lambda d: d.watchdog(store=object(), rank=0, world_size=2), "store: expected"),
    ],
)
def test_bad_arguments_are_named(call: Any, match: str) -> None:
    """Typed errors naming the argument, raised before anything waits or a thread starts."""
    import compatshim.dist as d

    with pytest.raises(TypeError, match=match):
        call(d)


class _Store:
    """Something with a store's methods, never reached (the rank is checked first)."""

    def set(self, *_: Any) -> None: ...
    def get(self, *_: Any) -> None: ...
    def add(self, *_: Any) -> None: ...
    def wait(self, *_: Any) -> None: ...


def test_a_world_size_without_a_group_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    from compatshim.dist import sync_point

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(RuntimeError, match=r"world_size=2 but no default process group"):
        sync_point("nobody", timeout=1, rank=0, world_size=2)


def test_rank_or_world_size_that_contradicts_the_group_is_refused_at_once() -> None:
    """sync_point(world_size=3) in a 2-rank group waited its timeout for a rank 2 that cannot
    exist and reported it 'never arrived'; rank=0 on rank 1 had both ranks wait for rank 1."""
    for rank, said in enumerate(run_ranks(workers.overrides_that_disagree_with_the_group, 2)):
        assert said == [
            "ValueError after 0 s: compatshim.dist: world_size=3 but the default process group "
            "has world_size=2; pass rank= and world_size= only together with store=, or leave "
            "them out",
            f"ValueError after 0 s: compatshim.dist: rank={1 - rank} but the default process "
            f"group has rank={rank}; pass rank= and world_size= only together with store=, or "
            "leave them out",
        ], said


def test_sync_point_without_group_in_a_distributed_run_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from compatshim.dist import sync_point

    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(RuntimeError, match="init_process_group"):
        sync_point("nobody", timeout=1)


def test_timeout_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The desync timeout comes from compatshim's one settings module; a bad value is named."""
    from compatshim import _settings
    from compatshim.dist import sync_point, watchdog

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setenv("COMPATSHIM_DESYNC_TIMEOUT", "12.5")
    assert _settings.desync_timeout() == 12.5
    monkeypatch.setenv("COMPATSHIM_DESYNC_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="COMPATSHIM_DESYNC_TIMEOUT='soon'"):
        sync_point("alone")
    with pytest.raises(ValueError, match="COMPATSHIM_DESYNC_TIMEOUT='soon'"):
        watchdog()
    with pytest.raises(ValueError, match="positive"):
        sync_point("alone", timeout=0)


def test_doctor_rows_shape() -> None:
    from compatshim._records import DoctorRow
    from compatshim.dist import doctor_rows

    rows = doctor_rows()
    # the Lightning patch is reported once, by the registry's row, not here
    assert [row.name for row in rows] == ["torch-distributed-debug-detail"]
    assert all(isinstance(row, DoctorRow) and row.kind == "hazard" for row in rows)


def test_meeting_wait_wakes_when_the_last_key_lands_and_is_bounded() -> None:
    """The wait a leaving rank blocks in: it returns as the key is set, not at a poll, and
    says False after its timeout (torch 2.1's store has no check: the timeout is an error)."""
    import threading
    import time

    import torch.distributed as dist

    from compatshim.desync._store import Meeting

    store = dist.TCPStore("127.0.0.1", 0, 2, True, wait_for_workers=False)
    other = dist.TCPStore("127.0.0.1", store.port, 2, False)  # another rank's client
    meeting = Meeting(store, 0, 2)
    start = time.monotonic()
    assert meeting.wait(["a", "b"], 0.3) is False
    assert 0.25 < time.monotonic() - start < 5
    other.set("a", "1")
    threading.Timer(0.2, other.set, ("b", "1")).start()
    start = time.monotonic()
    assert meeting.wait(["a", "b"], 30) is True
    assert time.monotonic() - start < 5


def test_watchdog_without_a_group_watches_this_process_alone() -> None:
    """Not a silent no-op: with no process group, a stuck main thread is still reported."""
    code = """
import time, warnings
warnings.simplefilter("error")
from compatshim.dist import watchdog
with watchdog(1, action="report"):
    time.sleep(4)
print("DONE")
"""
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK")}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=100
    )
    assert done.returncode == 0 and done.stdout.strip() == "DONE", done.stderr
    assert "compatshim.dist.DesyncError: rank 0's main thread has not moved for" in done.stderr
    assert "time.sleep(4)" in done.stderr or "<string>" in done.stderr, done.stderr
