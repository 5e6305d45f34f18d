"""Run a function on N real processes over a real process group, with a hard timeout.

Every rank is a process of its own, joined to a gloo group through a TCP store
on a free loopback port. By default the ranks are forked from a zygote
(:mod:`tests.harness.zygote`): an interpreter started with the ranks'
environment that has imported ``torch.distributed`` once, so a call costs its
work and not two interpreter starts, two ``import torch`` and two shutdowns
(about 95% of a small test's time, and what timed tests out on a busy
machine). ``fresh=True`` starts each rank as a new ``spawn`` interpreter, as
torchrun would, for a test about interpreter start or exit itself.

The parent collects each rank's return value or traceback; if any rank is
still running when the timeout expires, all ranks are killed and
:class:`RanksFailed` reports which ranks were stuck (children dump their
Python stacks via faulthandler first). Nothing is left running after
``run_ranks`` returns or raises.
"""

from __future__ import annotations

import atexit
import faulthandler
import multiprocessing as mp
import os
import pickle
import socket
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable

from tests.harness.zygote import ZygoteFailed, zygote_for

GRACE = 30.0  # seconds on top of the timeout for the zygote to kill, join and answer
# a zygote's start is one import of torch.distributed and torch._dynamo: 4-7 s on an idle
# 2-core box, 30 s at load 16; it is bounded apart from the call's own timeout
START_LIMIT = 300.0
PER_CALL = ("MASTER_ADDR", "MASTER_PORT", "PYTEST_CURRENT_TEST")  # not part of a zygote's key
TRACE = "RUN_RANKS_TRACE"  # set to 1: every rank prints when each phase of its life ends


def _trace(who: object, phase: str) -> None:
    if os.environ.get(TRACE):
        name = f"rank {who}" if isinstance(who, int) else who
        print(f"[run_ranks {time.time():.3f}] {name}: {phase}", file=sys.stderr, flush=True)


class RanksFailed(AssertionError):
    """One or more ranks raised, crashed or timed out."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class _Job:
    fn: Callable[..., Any]
    world_size: int
    args: tuple[Any, ...]
    env: dict[str, str]
    init: bool
    backend: str
    timeout: float


def _child(payload: bytes, rank: int, queue: Any, forked: bool) -> None:
    """One rank: the job is unpickled here, so only the ranks import the test's modules."""
    _trace(rank, "started")
    try:
        job: _Job = pickle.loads(payload)
    except BaseException as exc:
        queue.put((rank, "error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
        return
    os.environ.update(job.env)
    os.environ.update(
        {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(job.world_size)}
    )
    faulthandler.dump_traceback_later(max(job.timeout - 3, 1), exit=False)
    _trace(rank, "job unpickled (the test's modules imported)")
    try:
        if job.init:
            from datetime import timedelta

            import torch.distributed as dist

            dist.init_process_group(
                job.backend,
                rank=rank,
                world_size=job.world_size,
                timeout=timedelta(seconds=job.timeout),
            )
            _trace(rank, f"init_process_group({job.backend!r})")
        result = job.fn(rank, job.world_size, *job.args)
        _trace(rank, f"{getattr(job.fn, '__name__', 'fn')} returned")
        queue.put((rank, "ok", pickle.dumps(result)))
    except BaseException as exc:  # report everything to the parent
        queue.put((rank, "error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
    finally:
        if job.init:
            try:
                import torch.distributed as dist

                if dist.is_initialized():
                    dist.destroy_process_group()
                    _trace(rank, "destroy_process_group()")
            except Exception:
                pass
        faulthandler.cancel_dump_traceback_later()
        if forked:  # a forked child ends in os._exit: run what interpreter exit would run
            atexit._run_exitfuncs()
        _trace(rank, "leaving")


def _run_here(method: str, payload: bytes, world_size: int, timeout: float) -> dict[int, Any]:
    """Start the ranks from this process and collect ``{rank: (kind, value)}`` (none: stuck)."""
    ctx: Any = mp.get_context(method)
    queue = ctx.Queue()
    procs = [
        ctx.Process(target=_child, args=(payload, rank, queue, method == "fork"), daemon=True)
        for rank in range(world_size)
    ]
    _trace(method, f"starting {world_size} ranks")
    for proc in procs:
        proc.start()
    _trace(method, "ranks started")
    outcomes: dict[int, Any] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(outcomes) < world_size and time.monotonic() < deadline:
            try:
                rank, kind, value = queue.get(timeout=0.2)
                outcomes[rank] = (kind, value)
            except Exception:
                for rank, proc in enumerate(procs):
                    if rank not in outcomes and proc.exitcode is not None:
                        time.sleep(0.2)  # let a late queue message land
                        if rank not in outcomes and queue.empty():
                            outcomes[rank] = ("exit", proc.exitcode)
        for proc in procs:
            proc.join(timeout=max(0.1, deadline - time.monotonic()))
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join(5)
    _trace(method, "ranks joined")
    return outcomes


def run_ranks(
    fn: Callable[..., Any],
    world_size: int = 2,
    *,
    args: tuple[Any, ...] = (),
    timeout: float = 120.0,
    env: dict[str, str] | None = None,
    init: bool = True,
    backend: str = "gloo",
    expect_failure: bool = False,
    fresh: bool = False,
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` processes; return results by rank.

    ``fn`` must be a module-level function of an importable module; results must
    pickle. With ``expect_failure=True`` the per-rank outcomes
    ``("ok"|"error"|"exit"|"timeout", value)`` are returned instead of raising.
    ``fresh=True``: every rank is a new interpreter (slow; see the module docstring).
    """
    child_env = {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        # ranks are daemonic processes: inductor's compile worker pool cannot start in them
        "TORCHINDUCTOR_COMPILE_THREADS": "1",
    }
    if "PYTEST_CURRENT_TEST" in os.environ:
        child_env["PYTEST_CURRENT_TEST"] = os.environ["PYTEST_CURRENT_TEST"]
    child_env.update(env or {})
    payload = pickle.dumps(_Job(fn, world_size, args, child_env, init, backend, timeout))
    if fresh or "fork" not in mp.get_all_start_methods():
        saved = {k: os.environ.get(k) for k in child_env}
        os.environ.update(child_env)  # spawn copies the parent's environment at start
        try:
            outcomes = _run_here("spawn", payload, world_size, timeout)
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
    else:
        environ = {**os.environ, **child_env}
        for key in PER_CALL:  # the ranks set these from the job (pytest changes its own per test)
            environ.pop(key, None)
        try:
            _trace("parent", "zygote wanted")
            zygote = zygote_for(environ, START_LIMIT)
            _trace("parent", "zygote ready")
            outcomes = zygote.call(
                _run_here, ("fork", payload, world_size, timeout), timeout + GRACE
            )
        except ZygoteFailed as exc:
            raise RanksFailed(f"every rank: {exc}") from None
    results = {
        rank: (kind, pickle.loads(value) if kind == "ok" else value)
        for rank, (kind, value) in outcomes.items()
    }
    if expect_failure:
        return [results.get(r, ("timeout", None)) for r in range(world_size)]
    problems = []
    for rank in range(world_size):
        kind, value = results.get(rank, ("timeout", f"still running after {timeout:.0f}s"))
        if kind != "ok":
            problems.append(f"rank {rank}: {kind}: {value}")
    if problems:
        raise RanksFailed("\n".join(problems))
    return [results[r][1] for r in range(world_size)]


def python_env(**extra: str) -> dict[str, str]:
    """A copy of this environment for a child interpreter, with ``extra`` set."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    env.update(extra)
    return env
