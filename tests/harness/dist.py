"""Run a function on N real processes over a real process group, with a hard timeout.

Every rank is a process of its own, joined to a gloo group through a TCP store
on a free loopback port. By default the ranks are forked from a zygote
(:mod:`tests.harness.zygote`): an interpreter started with the ranks'
environment that has imported ``torch.distributed`` once, so a call costs its
work and not two interpreter starts, two ``import torch`` and two shutdowns
(about 95% of a small test's time, and what timed tests out on a busy
machine). ``fresh=True`` starts each rank as a new ``spawn`` interpreter, as
torchrun would, for a test about interpreter start or exit itself. What a fork
does not give: each fresh rank draws its own string-hash seed (set iteration
order differs between torchrun ranks unless ``PYTHONHASHSEED`` is set); forked
ranks share the zygote's. A test about order across ranks uses ``fresh=True``.

The parent collects each rank's return value or traceback; if any rank is
still running when the timeout expires, all ranks are killed and
:class:`RanksFailed` reports which ranks were stuck (children dump their
Python stacks via faulthandler first). Nothing is left running after
``run_ranks`` returns or raises.
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import multiprocessing as mp
import os
import pickle
import socket
import sys
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Any, Callable

from tests.harness.zygote import ZygoteFailed, zygote_for

GRACE = 30.0  # seconds on top of the timeout for the zygote to kill, join and answer
EXIT_GRACE = 30.0  # seconds a rank that reported may take to destroy its group and end
# before destroying the group, a moment without the GIL: a gloo worker that still has to drop a
# finished work's tensors needs the GIL, and ~ProcessGroupGloo joins the workers while holding it
# (pytorch issue 56297; seen here on torch 2.1 at load 18: rank 0 stuck in destroy_process_group)
SETTLE = 0.1
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


def _report(conn: Any, kind: str, value: Any) -> None:
    """Send this rank's outcome now, from this thread (no feeder thread that needs the GIL)."""
    with contextlib.suppress(OSError):
        conn.send((kind, value))
        conn.close()


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"


def _child(payload: bytes, rank: int, conn: Any, forked: bool) -> None:
    """One rank: the job is unpickled here, so only the ranks import the test's modules."""
    _trace(rank, "started")
    try:
        job: _Job = pickle.loads(payload)
    except BaseException as exc:
        _report(conn, "error", _error(exc))
        return
    os.environ.update(job.env)
    os.environ.update(
        {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(job.world_size)}
    )
    if forked:  # a fresh interpreter seeds numpy's global generator from entropy at import
        numpy = sys.modules.get("numpy")
        if numpy is not None:  # (Python's random reseeds itself after a fork)
            numpy.random.seed()
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
        _report(conn, "ok", pickle.dumps(result))
    except BaseException as exc:  # report everything to the parent
        _report(conn, "error", _error(exc))
    finally:
        if job.init:
            try:
                import torch.distributed as dist

                if dist.is_initialized():
                    time.sleep(SETTLE)
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
    procs, readers = [], {}
    deadline = time.monotonic() + timeout
    _trace(method, f"starting {world_size} ranks")
    try:
        for rank in range(world_size):
            reader, writer = ctx.Pipe(duplex=False)
            proc = ctx.Process(
                target=_child, args=(payload, rank, writer, method == "fork"), daemon=True
            )
            proc.start()
            writer.close()  # before the next fork: a rank's pipe ends (EOF) when that rank does
            procs.append(proc)
            readers[reader] = rank
        _trace(method, "ranks started")
        outcomes: dict[int, Any] = {}
        while readers and time.monotonic() < deadline:
            for reader in wait(list(readers), timeout=max(0.0, deadline - time.monotonic())):
                rank = readers.pop(reader)
                try:
                    outcomes[rank] = reader.recv()
                except EOFError:  # it ended without a word: its exit code says how
                    procs[rank].join(5)
                    outcomes[rank] = ("exit", procs[rank].exitcode)
                reader.close()
        # every rank reported or the time is up: the ones that reported may take EXIT_GRACE to end
        leave_by = min(deadline, time.monotonic() + EXIT_GRACE) if not readers else 0.0
        for rank, proc in enumerate(procs):
            proc.join(max(0.0, leave_by - time.monotonic()))
            if proc.is_alive() and rank in outcomes:
                print(
                    f"run_ranks: rank {rank} reported, then did not end within {EXIT_GRACE:.0f}s "
                    "(killed; a hang in destroy_process_group, pytorch issue 56297?)",
                    file=sys.stderr,
                    flush=True,
                )
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
