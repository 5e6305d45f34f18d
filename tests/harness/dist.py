"""Run a function on N real processes over a real process group, with a hard timeout.

Every rank is a fresh ``spawn`` process (as torchrun would give), joined to a
gloo group through a TCP store on a free loopback port. The parent collects
each rank's return value or traceback; if any rank is still running when the
timeout expires, all ranks are killed and :class:`RanksFailed` reports which
ranks were stuck (children dump their Python stacks via faulthandler first).
Nothing is left running after ``run_ranks`` returns or raises.
"""

from __future__ import annotations

import faulthandler
import multiprocessing as mp
import os
import socket
import sys
import time
import traceback
from typing import Any, Callable


class RanksFailed(AssertionError):
    """One or more ranks raised, crashed or timed out."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _child(
    fn: Callable[..., Any],
    rank: int,
    world_size: int,
    args: tuple[Any, ...],
    env: dict[str, str],
    init: bool,
    backend: str,
    timeout: float,
    queue: Any,
) -> None:
    os.environ.update(env)
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world_size)})
    faulthandler.dump_traceback_later(max(timeout - 3, 1), exit=False)
    try:
        if init:
            from datetime import timedelta

            import torch.distributed as dist

            dist.init_process_group(
                backend, rank=rank, world_size=world_size, timeout=timedelta(seconds=timeout)
            )
        result = fn(rank, world_size, *args)
        queue.put((rank, "ok", result))
    except BaseException as exc:  # report everything to the parent
        queue.put((rank, "error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
    finally:
        if init:
            try:
                import torch.distributed as dist

                if dist.is_initialized():
                    dist.destroy_process_group()
            except Exception:
                pass
        faulthandler.cancel_dump_traceback_later()


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
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` processes; return results by rank.

    ``fn`` must be a module-level function of an importable module. With
    ``expect_failure=True`` the per-rank outcomes ``("ok"|"error"|"exit", value)``
    are returned instead of raising.
    """
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    child_env = {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        # ranks are daemonic processes: inductor's compile worker pool cannot start in them
        "TORCHINDUCTOR_COMPILE_THREADS": "1",
    }
    child_env.update(env or {})
    procs = [
        ctx.Process(
            target=_child,
            args=(fn, rank, world_size, args, child_env, init, backend, timeout, queue),
            daemon=True,
        )
        for rank in range(world_size)
    ]
    saved = {k: os.environ.get(k) for k in child_env}
    os.environ.update(child_env)  # spawn copies the parent's environment at start
    try:
        for proc in procs:
            proc.start()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    outcomes: dict[int, tuple[str, Any]] = {}
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
    if expect_failure:
        return [outcomes.get(r, ("timeout", None)) for r in range(world_size)]
    problems = []
    for rank in range(world_size):
        kind, value = outcomes.get(rank, ("timeout", f"still running after {timeout:.0f}s"))
        if kind != "ok":
            problems.append(f"rank {rank}: {kind}: {value}")
    if problems:
        raise RanksFailed("\n".join(problems))
    return [outcomes[r][1] for r in range(world_size)]


def python_env(**extra: str) -> dict[str, str]:
    """A copy of this environment for a child interpreter, with ``extra`` set."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    env.update(extra)
    return env
