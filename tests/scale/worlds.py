"""Large worlds on one CPU: torch's threaded process group (real numerics) and fake one (structure).

Two ways torch itself simulates many ranks in one process, adapted across the
releases of the matrix (torch 2.1 to 2.15) by feature detection, never by
version number:

- :func:`run_threaded` runs ``fn(rank, world_size)`` on one thread per rank
  over ``torch.testing._internal.distributed.multi_threaded_pg`` (backend
  ``"threaded"``): collectives move real tensors, so results are real. Caveat:
  the "ranks" share process-global state (Python/numpy/torch generators,
  compatshim's monitor thread and import hooks); a test that touches such
  state serialises it itself (:data:`GLOBAL_LOCK`).
- :func:`fake_world` initialises ``fake_pg``'s backend as one rank of a large
  world: no peer exists and collectives are not real, but ranks, sizes and
  subgroups are (2.1: ``FakeStore`` and ``FakeProcessGroup`` are Python
  classes; 2.13: the group is C++, the store still Python; 2.14+: the store
  is C++ too; 2.15 adds ``FakeProcessGroup.Options``; the creator's
  signature changed on the way: :func:`fake_world` only names the backend).

Every thread is joined before :func:`run_threaded` returns; a rank still
running at the deadline ends the world (torch's terminate event wakes ranks
blocked in a collective) and fails the call with every rank's stack.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
import traceback
from datetime import timedelta
from typing import Any, Callable, Iterator

GLOBAL_LOCK = threading.RLock()  # for rank code that touches process-global state


class WorldFailed(AssertionError):
    """One or more thread ranks raised or did not finish in time."""


def _threaded_module() -> Any:
    import torch.testing._internal.distributed.multi_threaded_pg as mtpg

    return mtpg


def _fake_module() -> Any:
    import torch.testing._internal.distributed.fake_pg as fake_pg

    return fake_pg


def fake_store() -> Any:
    """A store for the fake backend: ``FakeStore`` (Python class up to 2.13, C++ from 2.14)."""
    import torch._C._distributed_c10d as c10d

    store_type = getattr(c10d, "FakeStore", None) or _fake_module().FakeStore
    return store_type()


def _isolation(on: bool) -> None:
    """torch 2.2+ wants thread isolation on while threaded ranks run (absent on 2.1)."""
    import torch._C._distributed_c10d as c10d

    setter = getattr(c10d, "_set_thread_isolation_mode", None)
    if setter is not None:
        setter(on)


def _stacks(threads: dict[int, threading.Thread]) -> str:
    frames = sys._current_frames()
    lines = []
    for rank, thread in threads.items():
        frame = frames.get(thread.ident or -1)
        if frame is not None:
            lines.append(f"--- rank {rank} ---")
            lines += traceback.format_stack(frame)[-8:]
    return "\n".join(lines)


def run_threaded(
    fn: Callable[..., Any],
    world_size: int,
    *,
    args: tuple[Any, ...] = (),
    timeout: float = 60.0,
    expect_failure: bool = False,
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` thread ranks of a threaded group.

    Returns the results by rank; raises :class:`WorldFailed` naming every rank
    that raised or hung. ``expect_failure=True`` returns ``("ok", result)`` or
    ``("error", exception)`` per rank instead.
    """
    import torch.distributed as dist

    mtpg = _threaded_module()
    store = dist.HashStore()
    world = mtpg._install_threaded_pg()
    _isolation(True)
    outcomes: dict[int, tuple[str, Any]] = {}

    def rank_body(rank: int) -> None:
        initialised = False
        try:
            dist.init_process_group(
                "threaded",
                rank=rank,
                world_size=world_size,
                store=store,
                timeout=timedelta(seconds=timeout),
            )
            initialised = True
            outcomes[rank] = ("ok", fn(rank, world_size, *args))
        except BaseException as exc:  # every rank's outcome is reported
            outcomes[rank] = ("error", exc)
            if not expect_failure:  # wake ranks waiting for this one in a collective
                mtpg.ProcessLocalGroup.exception_handle(exc)
        finally:
            if initialised and dist.distributed_c10d._world is world:
                with contextlib.suppress(Exception):
                    dist.destroy_process_group()

    threads = {
        rank: threading.Thread(target=rank_body, args=(rank,), name=f"rank{rank}", daemon=True)
        for rank in range(world_size)
    }
    hung = ""
    try:
        for thread in threads.values():
            thread.start()
        deadline = time.monotonic() + timeout
        for thread in threads.values():
            thread.join(max(0.0, deadline - time.monotonic()))
        alive = {r: t for r, t in threads.items() if t.is_alive()}
        if alive:
            hung = _stacks(alive)
            mtpg.ProcessLocalGroup.exception_handle(TimeoutError("world timed out"))
            for thread in alive.values():
                thread.join(5.0)
    finally:
        mtpg.ProcessLocalGroup.reset()
        mtpg._uninstall_threaded_pg()
        _isolation(False)
    still = [r for r, t in threads.items() if t.is_alive()]
    if still:
        raise WorldFailed(f"ranks {still} still running {timeout:.0f} s after start:\n{hung}")
    if expect_failure:
        return [outcomes.get(r, ("timeout", None)) for r in range(world_size)]
    problems = []
    for rank in range(world_size):
        kind, value = outcomes.get(rank, ("timeout", f"no result within {timeout:.0f} s"))
        if kind != "ok":
            text = "".join(traceback.format_exception(value)) if kind == "error" else value
            problems.append(f"rank {rank}: {kind}: {text}")
    if problems:
        raise WorldFailed("\n".join(problems[:4]) + f"\n({len(problems)} rank(s) failed)")
    return [outcomes[r][1] for r in range(world_size)]


@contextlib.contextmanager
def fake_world(world_size: int, rank: int, store: Any = None) -> Iterator[None]:
    """This process as rank ``rank`` of a fake world of ``world_size`` (destroyed on exit)."""
    import torch.distributed as dist

    _fake_module()  # registers the "fake" backend
    dist.init_process_group(
        "fake", store=store if store is not None else fake_store(), rank=rank, world_size=world_size
    )
    try:
        yield
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def stop_compatshim_monitor() -> None:
    """End compatshim.dist's per-process monitor thread (it is shared by every thread rank)."""
    from compatshim.desync.monitor import get_monitor

    get_monitor().stop()
