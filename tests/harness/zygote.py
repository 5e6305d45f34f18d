"""A pre-started interpreter that has imported torch once and forks the ranks of a test.

Starting a rank the way torchrun does costs an interpreter start and an
``import torch`` (2-5 s of CPU each on the CI box, 15-30 s at load 8 on 2
cores) and an interpreter shutdown (1-4 s), against milliseconds of gloo work
for most multi-process tests; a busy machine timed such tests out. A zygote pays
the start-up once per pytest process and environment: it is a fresh ``spawn``
interpreter started with exactly the environment the ranks would get, it
imports the modules every rank imports (``torch.distributed``) and nothing of
the tests, then forks each rank (single-threaded Python: nothing in it has run
a torch op, so nothing is held across the fork). A fork of an interpreter that
started with the ranks' environment and imported torch is what a fresh rank is
after its first import, minus the seconds.

Per call the parent hands the zygote its stdout/stderr (so rank output and
faulthandler dumps land in the calling test's capture), its working directory
and ``sys.path``; the zygote runs ``fn(*args)`` (a harness function that starts
and joins the ranks) and sends back its return value. A zygote that does not
answer within the limit is killed with its ranks (its own process group).
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing as mp
import os
import signal
import sys
import threading
from multiprocessing.reduction import recv_handle, send_handle
from typing import Any, Callable

# What a rank imports anyway: torch.distributed before the test's function runs; torch._dynamo
# on the first DistributedDataParallel or ZeroRedundancyOptimizer (torch 2.x: 900 modules,
# sympy included, as much again as torch itself on 2.15). Neither starts a thread.
PRELOAD = ("torch.distributed", "torch._dynamo")
KEEP = 2  # zygotes kept alive at once (one per distinct environment, least recent ended first)


class ZygoteFailed(RuntimeError):
    """The zygote did not start, died, or did not answer in time."""


def _serve(conn: Any, preload: tuple[str, ...]) -> None:
    """The zygote's main loop: import ``preload``, then run one request at a time."""
    os.setpgrp()  # the parent ends this process and every rank it forked with one killpg
    environ = dict(os.environ)
    for name in preload:
        with contextlib.suppress(ImportError):  # a rank that needs it reports it itself
            __import__(name)
    # imports may set variables for their own subprocesses (torch._inductor sets
    # TORCHINDUCTOR_CACHE_DIR); a fresh rank has none of them before it imports those modules
    os.environ.clear()
    os.environ.update(environ)
    conn.send("ready")
    while True:
        try:
            fn, args, cwd, path = conn.recv()
            out, err = recv_handle(conn), recv_handle(conn)
        except EOFError:
            return  # the parent closed the pipe or died
        os.dup2(out, 1)
        os.dup2(err, 2)
        os.close(out)
        os.close(err)
        os.chdir(cwd)
        sys.path[:] = path
        try:
            reply: tuple[str, Any] = ("ok", fn(*args))
        except BaseException as exc:  # the parent raises it with the zygote's traceback
            import traceback

            reply = ("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
        sys.stdout.flush()
        sys.stderr.flush()
        conn.send(reply)


class Zygote:
    """One pre-started interpreter with a fixed environment."""

    def __init__(self, environ: dict[str, str], start_limit: float) -> None:
        ctx = mp.get_context("spawn")
        self._conn, child_conn = ctx.Pipe()
        self._lock = threading.Lock()
        self._proc = ctx.Process(
            target=_serve, args=(child_conn, PRELOAD), name="run_ranks-zygote", daemon=False
        )
        saved = dict(os.environ)
        os.environ.clear()
        os.environ.update(environ)  # spawn copies the parent's environment at start
        try:
            self._proc.start()
        finally:
            os.environ.clear()
            os.environ.update(saved)
        child_conn.close()
        if not self._conn.poll(start_limit):
            self.close()
            raise ZygoteFailed(f"the zygote did not import {PRELOAD} within {start_limit:.0f}s")
        try:
            self._conn.recv()
        except EOFError:
            self.close()
            raise ZygoteFailed(
                f"the zygote died while importing {PRELOAD} (exit {self._proc.exitcode})"
            ) from None

    def alive(self) -> bool:
        return self._proc.is_alive()

    def call(self, fn: Callable[..., Any], args: tuple[Any, ...], limit: float) -> Any:
        """``fn(*args)`` inside the zygote (``fn`` importable by name); raise if it raised."""
        with self._lock:
            self._conn.send((fn, args, os.getcwd(), list(sys.path)))
            assert self._proc.pid is not None
            for fd in (1, 2):
                send_handle(self._conn, fd, self._proc.pid)
            if not self._conn.poll(limit):
                self.close()
                raise ZygoteFailed(f"the zygote did not answer within {limit:.0f}s (killed)")
            try:
                kind, value = self._conn.recv()
            except EOFError:
                self.close()
                raise ZygoteFailed(f"the zygote died (exit {self._proc.exitcode})") from None
        if kind != "ok":
            raise ZygoteFailed(f"inside the zygote: {value}")
        return value

    def close(self) -> None:
        """End the zygote and anything it forked (its process group)."""
        self._conn.close()
        pid = self._proc.pid
        if pid is not None and self._proc.exitcode is None:
            with contextlib.suppress(OSError):  # no group yet if it died before setpgrp
                os.killpg(pid, signal.SIGKILL)
            self._proc.kill()
        self._proc.join(5)


_ZYGOTES: dict[frozenset[tuple[str, str]], Zygote] = {}
_ZYGOTES_LOCK = threading.Lock()


def zygote_for(environ: dict[str, str], start_limit: float) -> Zygote:
    """The zygote started with ``environ`` (started now if none is alive)."""
    key = frozenset(environ.items())
    with _ZYGOTES_LOCK:
        found = _ZYGOTES.pop(key, None)
        if found is None or not found.alive():
            if found is not None:
                found.close()
            while len(_ZYGOTES) >= KEEP:
                _ZYGOTES.pop(next(iter(_ZYGOTES))).close()
            found = Zygote(environ, start_limit)
        _ZYGOTES[key] = found  # most recently used last
        return found


@atexit.register
def _close_all() -> None:  # before multiprocessing's own exit hook joins them (atexit is LIFO)
    with _ZYGOTES_LOCK:
        while _ZYGOTES:
            _ZYGOTES.popitem()[1].close()
