"""Rank functions for tests/core/test_sync_point.py, run by ``harness.dist.run_ranks``.

Each is module-level so spawned processes can import it. They use plain
``torch.distributed`` over gloo, no Lightning, and report what they saw as
plain data (strings, lists) the parent can assert on.
"""

from __future__ import annotations

import os
import signal
import time
from datetime import timedelta
from typing import Any

from compatshim.dist import DesyncError, check_module_consistency, sync_point


def same_tags(rank: int, world_size: int, rounds: int) -> list[str]:
    """Every rank passes the same tags: each sync point returns."""
    for step in range(rounds):
        sync_point(f"step {step}", timeout=30)
    return [f"rank {rank} passed {rounds} sync points"]


def store_keys_over_many_sync_points(rank: int, world_size: int, steps: int) -> dict[str, int]:
    """The store's key count (rank 0's TCPStore, read on every rank) once the monitor's keys are
    in, and again after ``steps`` more sync points: a sync point must not leave keys behind."""
    import torch.distributed as dist

    store = dist.distributed_c10d._get_default_store()
    for step in range(3):
        sync_point(f"warm {step}", timeout=30)
    dist.barrier()  # every rank has left the warm-up sync points
    before = int(store.num_keys())
    for _ in range(steps):
        sync_point("step", timeout=30)
    dist.barrier()
    return {"before": before, "after": int(store.num_keys())}


def lagging_rank_finds_the_arrivals(rank: int, world_size: int, steps: int) -> str:
    """Rank 1 writes its arrival, then looks for the others' only 50 ms later: rank 0 has
    left that sync point by then (and deleted what it may) and waits at the next one."""
    from compatshim.desync import _store

    if rank == 1:
        plain_has = _store.Meeting.has

        def late_has(self: Any, keys: list[str]) -> bool:
            if len(keys) > 1 and "/sp/" in keys[0]:  # every rank's arrival at one sync point
                time.sleep(0.05)
            return plain_has(self, keys)

        _store.Meeting.has = late_has  # type: ignore[method-assign]
    for step in range(steps):
        sync_point(f"step {step}", timeout=30)
    return f"rank {rank} passed {steps} sync points"


def _catch(fn: Any) -> dict[str, Any]:
    start = time.monotonic()
    try:
        fn()
    except DesyncError as exc:
        return {
            "raised": True,
            "report": exc.report,
            "message": str(exc),
            "ranks": sorted(exc.ranks),
            "elapsed": time.monotonic() - start,
        }
    return {"raised": False, "elapsed": time.monotonic() - start}


def different_tags(rank: int, world_size: int) -> dict[str, Any]:
    """Rank 0 at 'save', the others at 'eval': both raise naming both call sites."""
    tag = "save" if rank == 0 else "eval"
    return _catch(lambda: sync_point(tag, timeout=20))


def _wait_for_report(limit: float = 60.0) -> None:
    """Block until some rank has announced a desync in the store (an event, not a guess)."""
    import torch.distributed as dist

    from compatshim.desync._records import Keys

    store = dist.distributed_c10d._get_default_store()
    store.wait([Keys.desync()], timedelta(seconds=limit))


def overrides_that_disagree_with_the_group(rank: int, world_size: int) -> list[str]:
    """rank= / world_size= given without store= that contradict the default group: each is
    refused at once (before: the sync point waited its timeout for a rank that cannot come)."""
    said = []
    for kwargs in ({"world_size": world_size + 1}, {"rank": (rank + 1) % world_size}):
        start = time.monotonic()
        try:
            sync_point("override", timeout=5, **kwargs)
            said.append("returned")
        except Exception as exc:
            said.append(f"{type(exc).__name__} after {time.monotonic() - start:.0f} s: {exc}")
    sync_point("agreeing", timeout=30, rank=rank, world_size=world_size)  # the group's own
    return said


class _OutlivesItsGroups:
    """A store whose compatshim records outlive each process group, as torchrun's agent store
    does (it serves every ``init_process_group`` of a worker); torch's own keys go to a prefix
    per group (gloo's rendezvous on a reused key space may read the address of the group
    before, and fail: torch's problem, not the one tested)."""

    def __new__(cls, base: Any, run: int) -> Any:
        import torch.distributed as dist

        class Store(dist.Store):  # type: ignore[misc]
            def __init__(self) -> None:
                super().__init__()
                self.own = dist.PrefixStore(f"run{run}", base)

            def _to(self, key: str) -> Any:
                return base if "compatshim/" in key else self.own

            def set(self, key: str, value: Any) -> None:
                self._to(key).set(key, value)

            def get(self, key: str) -> Any:
                return self._to(key).get(key)

            def add(self, key: str, value: int) -> int:
                return int(self._to(key).add(key, value))

            def delete_key(self, key: str) -> bool:
                return bool(self._to(key).delete_key(key))

            def wait(self, keys: list[str], timeout: Any = None) -> None:
                for key in keys:
                    if timeout is None:
                        self._to(key).wait([key])
                    else:
                        self._to(key).wait([key], timeout)

            if hasattr(dist.TCPStore, "check"):  # torch 2.1 has none: compatshim probes by wait

                def check(self, keys: list[str]) -> bool:
                    return all(self._to(key).check([key]) for key in keys)

        return Store()


def reinit_on_a_shared_store(rank: int, world_size: int, runs: int) -> list[str]:
    """``runs`` process groups one after another on a store that outlives them, rank 1
    arriving late at each group's first sync point."""
    import torch.distributed as dist

    port = int(os.environ["MASTER_PORT"])
    base = dist.TCPStore("127.0.0.1", port, world_size, rank == 0, timedelta(seconds=60))
    said = []
    for run in range(runs):
        store = _OutlivesItsGroups(base, run)  # referenced while torch uses it
        dist.init_process_group(
            "gloo", store=store, rank=rank, world_size=world_size, timeout=timedelta(seconds=60)
        )
        dist.barrier()
        if rank == 1:
            time.sleep(1.0)
        try:
            for step in range(2):
                sync_point(f"run {run} step {step}", timeout=30)
            said.append("met")
        except DesyncError as exc:
            said.append(str(exc).splitlines()[-1])
        dist.destroy_process_group()
    base.add("finished", 1)
    while rank == 0 and int(base.add("finished", 0)) < world_size:  # it hosts the store
        time.sleep(0.05)
    return said


def world_sizes_disagree(rank: int, world_size: int) -> dict[str, Any]:
    """With store=, rank 0 is told a world of 2 and rank 1 a world of 3: rank 0 found both
    arrivals it waited for and returned; rank 1 waited its timeout for a rank 2."""
    import torch.distributed as dist

    port = int(os.environ["MASTER_PORT"])
    store = dist.TCPStore("127.0.0.1", port, world_size, rank == 0, timedelta(seconds=60))
    told = world_size + rank
    result = _catch(lambda: sync_point("t", timeout=30, store=store, rank=rank, world_size=told))
    store.add("finished", 1)
    while rank == 0 and int(store.add("finished", 0)) < world_size:  # it hosts the store
        time.sleep(0.05)
    return result


def stops_on_another_ranks_report(rank: int, world_size: int) -> dict[str, Any]:
    """Rank 2 never arrives; rank 0 gives up after 2 s and reports; rank 1 (timeout 60 s) stops
    waiting on rank 0's report: its own report must not claim it waited 60 s."""
    if rank == 2:
        _wait_for_report()
        return {"raised": False, "elapsed": 0.0}
    return _catch(lambda: sync_point("all three", timeout=2 if rank == 0 else 60))


def one_rank_missing(rank: int, world_size: int, timeout: float) -> dict[str, Any]:
    """Rank 1 never reaches the second sync point (it waits for the report): rank 0 raises
    after ``timeout``."""
    sync_point("start", timeout=30)
    if rank == 1:
        _wait_for_report()
        return {"raised": False, "elapsed": 0.0}
    return _catch(lambda: sync_point("after start", timeout=timeout))


def killed_mid_run(rank: int, world_size: int) -> dict[str, Any]:
    """Rank 1 is killed with SIGKILL after the first sync point; rank 0 must not wait it out."""
    sync_point("first", timeout=30)
    if rank == 1:  # its heartbeat (pid, host) is in the store since the first sync point
        os.kill(os.getpid(), signal.SIGKILL)
    return _catch(lambda: sync_point("second", timeout=60))


def store_host_dies(rank: int, world_size: int) -> dict[str, Any]:
    """Rank 0, which hosts the TCPStore, ends (os._exit) while rank 1 waits at a sync point."""
    sync_point("first", timeout=30)
    if rank == 0:
        time.sleep(1.0)  # rank 1 is waiting by then
        os._exit(3)
    start = time.monotonic()
    try:
        sync_point("second", timeout=60)
    except Exception as exc:
        return {"error": type(exc).__name__, "text": str(exc), "elapsed": time.monotonic() - start}
    return {"error": None}


def exits_early(rank: int, world_size: int) -> dict[str, Any]:
    """Rank 1 returns (its process ends normally) while rank 0 goes on to another sync point."""
    sync_point("first", timeout=30)
    if rank == 1:
        return {"raised": False, "elapsed": 0.0}
    return _catch(lambda: sync_point("second", timeout=60))


def _model(width: int, frozen: bool = False) -> Any:
    import torch

    model = torch.nn.Sequential(
        torch.nn.Linear(4, width), torch.nn.ReLU(), torch.nn.Linear(width, 2)
    )
    if frozen:
        model[0].weight.requires_grad_(False)
    return model


def consistent_module(rank: int, world_size: int) -> dict[str, Any]:
    return _catch(lambda: check_module_consistency(_model(8), timeout=30))


def shapes_differ(rank: int, world_size: int) -> dict[str, Any]:
    width = 8 if rank == 0 else 16
    return _catch(lambda: check_module_consistency(_model(width), timeout=30))


def requires_grad_differs(rank: int, world_size: int) -> dict[str, Any]:
    return _catch(lambda: check_module_consistency(_model(8, frozen=rank == 1), timeout=30))


def consistency_then_ddp(rank: int, world_size: int) -> list[float]:
    """The check passes and DDP still works after it (the store keys do not disturb the group)."""
    import torch

    torch.manual_seed(rank)
    model = _model(8)
    check_module_consistency(model, timeout=30)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    out = ddp(torch.ones(3, 4)).sum()
    out.backward()
    return [float(p.grad.sum()) for p in ddp.parameters()]


def watchdog_collective_hang(
    rank: int, world_size: int, timeout: float, report_dir: str, rank0_timeout: float = 0.0
) -> str:
    """Rank 0 waits in a barrier that rank 1 never joins; the watchdog ends both with stacks.

    The watchdog prints to stderr, which is sent to ``report_dir/rank<N>.txt`` here.
    ``rank0_timeout``: rank 0's own watchdog timeout, when it differs from rank 1's.
    """
    import sys
    import threading

    import torch.distributed as dist

    from compatshim.dist import watchdog

    sys.stderr = open(os.path.join(report_dir, f"rank{rank}.txt"), "w")  # noqa: SIM115
    watchdog(rank0_timeout if rank == 0 and rank0_timeout else timeout)
    sync_point("armed", timeout=30)
    if rank == 0:
        dist.barrier()  # <- barrier-site
    else:
        threading.Event().wait()  # <- stuck-site: nothing ever sets it
    return "not reached"


def caught_then_a_new_group_hangs(rank: int, world_size: int, report_dir: str) -> str:
    """Both ranks raise and catch a DesyncError, destroy the group and make a new one (a
    FileStore under ``report_dir``); there rank 1's watchdog fires while rank 0 waits in a
    barrier: rank 0 must end on rank 1's report, as in a first group."""
    import sys
    import threading

    import torch.distributed as dist

    from compatshim.dist import watchdog

    _catch(lambda: sync_point("eval" if rank == 0 else "train", timeout=20))
    dist.destroy_process_group()
    sys.stderr = open(os.path.join(report_dir, f"rank{rank}.txt"), "w")  # noqa: SIM115
    init = f"file://{os.path.join(report_dir, 'store')}"
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world_size)
    watchdog(60.0 if rank == 0 else 3.0)
    sync_point("armed", timeout=30)
    if rank == 0:
        dist.barrier()
    else:
        threading.Event().wait()
    return "not reached"


def report_mode_store_keys(rank: int, world_size: int, seconds: float) -> dict[str, int]:
    """watchdog(1, action="report") while both ranks sit in one long call for ``seconds``:
    a report about every second; the store's key count before and after."""
    import io
    import sys

    import torch.distributed as dist

    from compatshim.desync import _stacks
    from compatshim.dist import watchdog

    store = dist.distributed_c10d._get_default_store()
    sys.stderr = io.StringIO()
    with watchdog(1.0, action="report"):
        sync_point("armed", timeout=30)
        dist.barrier()
        before = int(store.num_keys())
        time.sleep(seconds)  # one call that does not return for a while: reported, not ended
    time.sleep(_stacks.STACKS_WAIT + 1.0)  # a report still gathering when the watch stopped
    dist.barrier()
    after = int(store.num_keys())
    reports = sys.stderr.getvalue().count(HEADLINE)
    sys.stderr = sys.__stderr__
    return {"before": before, "after": after, "reports": reports}


HEADLINE = "compatshim.dist.DesyncError: "


def _leftovers() -> tuple[object, int, set[str]]:
    """sys.excepthook, compatshim's atexit handlers still registered, thread names."""
    import atexit
    import sys
    import threading

    from compatshim.desync.monitor import get_monitor

    before = atexit._ncallbacks()
    atexit.unregister(get_monitor()._at_exit)  # a no-op unless it is still registered
    ours = before - atexit._ncallbacks()
    return sys.excepthook, ours, {t.name for t in threading.enumerate()}


def monitor_gone_after_destroy(rank: int, world_size: int) -> dict[str, Any]:
    """A sync point starts the monitor; destroying the process group must stop and unhook it."""
    import torch.distributed as dist

    hook, _, threads = _leftovers()
    sync_point("before destroy", timeout=30)
    running = _leftovers()[2] - threads
    dist.destroy_process_group()
    after_hook, handlers, after_threads = _leftovers()
    return {
        "ran": sorted(running),
        "left": sorted(after_threads - threads),
        "excepthook_restored": after_hook is hook,
        "atexit_handlers": handlers,
    }


def world_of_one(rank: int, world_size: int) -> dict[str, Any]:
    """A one-rank group has nobody to be out of step with: no monitor, no hooks."""
    hook, _, threads = _leftovers()
    sync_point("alone", timeout=30)
    check_module_consistency(_model(8), timeout=30)
    after_hook, handlers, after_threads = _leftovers()
    return {
        "left": sorted(after_threads - threads),
        "excepthook_restored": after_hook is hook,
        "atexit_handlers": handlers,
    }


def _one_long_call(seconds: float) -> None:
    time.sleep(seconds)  # stands in for one long C call: a matmul chain, a backward


def watchdog_healthy_loop(rank: int, world_size: int, timeout: float, steps: int) -> str:
    """Each step is one long call inside the same helper, far shorter than the watchdog's
    timeout: the loop moves, though each call's frame is usually allocated where the last
    one's was."""
    from compatshim.dist import watchdog

    with watchdog(timeout):
        for _ in range(steps):
            _one_long_call(timeout / 4)
    return f"rank {rank} done"


def goes_on_after_a_caught_desync(rank: int, world_size: int, steps: int) -> dict[str, Any]:
    """Both ranks catch the DesyncError of different tags, then meet in step (rank 1 a little
    later each time) for longer than the grace a rank that has not raised gets."""
    from compatshim.desync import _desync_notice

    _desync_notice.DESYNC_GRACE = 1.0  # 10 s otherwise: the test would take that long
    caught = _catch(lambda: sync_point("eval" if rank == 0 else "train", timeout=20))
    for step in range(steps):
        time.sleep(0.6 if rank == 1 else 0.1)
        sync_point(f"step {step}", timeout=20)
    return {"raised": caught["raised"], "steps": steps}
