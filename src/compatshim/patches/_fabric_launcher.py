"""Lightning's launcher process: the child ranks it starts, watched for the desync patch.

Fabric's ``_SubprocessScriptLauncher`` re-executes the user's script once per
extra local rank and keeps the ``subprocess.Popen`` objects in
``launcher.procs`` (child ``i`` is local rank ``i + 1``). A child that exits -
before ``launch()`` (it never built the object that calls it) or in the middle
of the run - is recorded for the other ranks with its exact exit code, and
when the launcher itself waits in a Fabric call that the child can no longer
join, the run ends with a report a second later. When this process ends after
a report, the children it started end with it, and so they do when ``launch()``
itself fails here (:func:`end_children`).

Used by :mod:`.lightning_fabric_desync` only; reaches ``compatshim.desync``
through its internal framework API.
"""

from __future__ import annotations

import subprocess
import time
from typing import Any

from ..desync import _framework as watch

EXIT_NOTICED_FOR = 1.0  # seconds a child has been gone before the waiting launcher ends the run
LAUNCH_FAILED_GRACE = 5.0  # seconds the children of a failed launch() get to end on their own
NEVER_LAUNCHED_HINT = (
    "without ever calling it (is launch() in code that only the main process runs?)"
)


def launcher_children(fabric: Any) -> list[subprocess.Popen[bytes]] | None:
    """The live list of child processes of Fabric's launcher, or None when it starts none."""
    launcher = getattr(getattr(fabric, "_strategy", None), "launcher", None)
    procs = getattr(launcher, "procs", None)
    return procs if isinstance(procs, list) else None


class LauncherChildren(watch.Watch):
    """Watch the child ranks in ``procs`` (filled by ``launch()``); this process is ``rank``."""

    def __init__(self, procs: list[subprocess.Popen[bytes]], rank: int) -> None:
        self.procs = procs
        self.rank = rank
        self.noticed: dict[int, float] = {}  # child rank -> when its exit was first seen

    def children(self) -> list[tuple[int, subprocess.Popen[bytes]]]:
        return [(self.rank + 1 + i, proc) for i, proc in enumerate(list(self.procs))]

    def tick(self, now: float, monitor: object) -> None:
        for rank, proc in self.children():
            code = proc.poll()
            if code is None:
                continue
            if rank not in self.noticed:
                self.noticed[rank] = now
                how = f"{watch.exit_description(code)} (process {proc.pid}, seen by the launcher)"
                watch.record_exit(rank, how, code)
                continue
            call = watch.waiting_call()
            if call is None or call.since > self.noticed[rank]:
                continue  # not waiting, or entered the call knowing the child had gone
            if now - self.noticed[rank] >= EXIT_NOTICED_FOR:
                watch.end_run(self._report(rank, code, call))

    def _report(self, rank: int, code: int, call: watch.Call) -> str:
        exits = {
            other: f"{watch.exit_description(other_code)} (process {proc.pid})"
            for other, proc in self.children()
            if (other_code := proc.poll()) is not None
        }
        joined = watch.watch_process_group()
        return watch.ended_rank_report(
            rank,
            watch.exit_description(code),
            call,
            this_rank=self.rank,
            exits=exits,
            hint="without joining it" if joined else NEVER_LAUNCHED_HINT,
        )

    def ending(self, grace: float) -> None:
        """End the children this launcher started: they would wait for a rank that is gone."""
        deadline = time.monotonic() + grace
        for _rank, proc in self.children():
            while proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
        for _rank, proc in self.children():
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)


def end_children(watches: list[Any]) -> None:
    """``launch()`` raised in the process that started the child ranks: they end with it.

    They can only wait for this one. When it failed before its process group existed
    (``MASTER_PORT`` in use: torch's ``EADDRINUSE``), each child's TCPStore client retries
    for 30 minutes against a store nobody will open; later, they wait in a collective.
    torchrun ends a worker group whose member failed, and Lightning's Trainer kills its
    launcher's children on an exception; Fabric's launcher left them running.
    """
    for each in watches:
        if isinstance(each, LauncherChildren):
            each.ending(LAUNCH_FAILED_GRACE)
