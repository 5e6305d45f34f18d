"""Run a Fabric scenario script as a user would (``python script.py``); account for every process.

Each run gets a unique ``COMPATSHIM_TEST_RUN`` marker in its environment,
which Fabric passes on to the ranks it re-executes. Processes are found by
that marker in ``/proc/<pid>/environ``, so a rank orphaned by its launcher is
still found. The run has a hard timeout; afterwards any process still
carrying the marker is reported as a survivor and killed - once it has made no
progress (no CPU time) for a short grace: on a loaded machine a rank may still
be working through its interpreter exit after the launcher has gone. Before a
survivor is killed it is asked (SIGUSR1, see ``scripts/_common.py``) to dump
every thread's stack into the run's stderr.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from tests.harness.dist import free_port, python_env

SCRIPTS = Path(__file__).resolve().parent / "scripts"
sys.path.insert(0, str(SCRIPTS))
from _common import FABRIC_MODULE  # noqa: E402  (the scripts' own choice of Fabric module)

__all__ = ["FABRIC_MODULE", "Run", "run_script", "site_line"]
MARKER = "COMPATSHIM_TEST_RUN"


@dataclass
class Run:
    script: str
    args: tuple[str, ...]
    returncode: int | None
    stdout: str
    stderr: str
    elapsed: float
    timed_out: bool
    survivors: list[int] = field(default_factory=list)

    @property
    def output(self) -> str:
        return self.stdout + "\n" + self.stderr


def marked_pids(marker: str) -> list[int]:
    """Live processes whose environment carries ``MARKER=marker`` (zombies excluded)."""
    needle = f"{MARKER}={marker}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as env:
                if needle not in env.read().split(b"\0"):
                    continue
            with open(f"/proc/{entry}/stat") as stat:
                if stat.read().rsplit(")", 1)[-1].split()[0] == "Z":
                    continue
        except OSError:
            continue
        found.append(int(entry))
    return found


def site_line(script: str, tag: str) -> str:
    """``script.py:N`` for the line marked ``# <- tag`` in a scenario script."""
    for number, line in enumerate((SCRIPTS / script).read_text().splitlines(), start=1):
        if re.search(rf"#\s*<-\s*{re.escape(tag)}\b", line):
            return f"{script}:{number}"
    raise LookupError(f"no '# <- {tag}' marker in {script}")


def run_script(
    script: str,
    *args: str,
    auto: bool = True,
    desync_timeout: float = 20.0,
    hard_timeout: float = 240.0,
    extra_env: dict[str, str] | None = None,
    grace: float = 10.0,
) -> Run:
    """Run ``scripts/<script>``; kill everything it left after ``grace`` seconds.

    The port is picked free, but another process may take it before rank 0 listens
    (gloo's connections and other tests' draw ports from the same range): a run whose
    rank 0 could not listen there (torch's EADDRINUSE) runs once more on another port.
    A ``MASTER_PORT`` given in ``extra_env`` is used as it is.
    """
    for attempt in range(2):
        run = _run_once(script, args, auto, desync_timeout, hard_timeout, extra_env, grace)
        if attempt or "MASTER_PORT" in (extra_env or {}) or "EADDRINUSE" not in run.stderr:
            break
    return run


def _run_once(
    script: str,
    args: tuple[str, ...],
    auto: bool,
    desync_timeout: float,
    hard_timeout: float,
    extra_env: dict[str, str] | None,
    grace: float,
) -> Run:
    marker = uuid.uuid4().hex
    env = python_env(
        **{
            MARKER: marker,
            "COMPATSHIM_AUTO": "1" if auto else "0",
            "COMPATSHIM_DESYNC_TIMEOUT": str(desync_timeout),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(free_port()),
            "PYTHONUNBUFFERED": "1",
            "OMP_NUM_THREADS": "1",
        }
    )
    for key in ("WORLD_SIZE", "LOCAL_RANK", "RANK", "NODE_RANK"):
        env.pop(key, None)
    env.update(extra_env or {})
    logs = Path(os.environ.get("TMPDIR", "/tmp"))
    out_path = logs / f"fabric-{marker}.out"
    err_path = logs / f"fabric-{marker}.err"
    start = time.monotonic()
    timed_out = False
    with open(out_path, "w") as out, open(err_path, "w") as err:
        proc = subprocess.Popen(
            [sys.executable, str(SCRIPTS / script), *args],
            cwd=SCRIPTS,
            env=env,
            stdout=out,
            stderr=err,
            start_new_session=True,
        )
        try:
            proc.wait(hard_timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill([*marked_pids(marker), proc.pid])
            proc.wait(10)
    elapsed = time.monotonic() - start
    survivors = _await_exit(marker, grace, limit=max(grace, hard_timeout - elapsed))
    _dump_stacks(survivors)
    _kill(survivors)
    run = Run(
        script=script,
        args=args,
        returncode=proc.returncode,
        stdout=out_path.read_text(errors="replace"),
        stderr=err_path.read_text(errors="replace"),
        elapsed=elapsed,
        timed_out=timed_out,
        survivors=survivors,
    )
    out_path.unlink(missing_ok=True)
    err_path.unlink(missing_ok=True)
    return run


def progress(pid: int) -> tuple[bool, int]:
    """Whether ``pid`` is runnable (waiting only for a CPU), and its CPU time so far (ticks)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[-1].split()
    except OSError:
        return False, 0
    return fields[0] == "R", int(fields[11]) + int(fields[12])


def _await_exit(marker: str, grace: float, limit: float) -> list[int]:
    """The marked processes left after ``grace`` seconds in which none of them used CPU
    nor waited for one (a rank still exiting does), or after ``limit`` seconds in all."""
    end = time.monotonic() + limit
    still_since = time.monotonic()
    last: dict[int, int] = {}
    survivors = marked_pids(marker)
    while survivors and time.monotonic() < end:
        seen = {pid: progress(pid) for pid in survivors}
        ticks = {pid: used for pid, (_, used) in seen.items()}
        if ticks != last or any(runnable for runnable, _ in seen.values()):
            last, still_since = ticks, time.monotonic()
        elif time.monotonic() - still_since >= grace:
            break
        time.sleep(0.2)
        survivors = marked_pids(marker)
    return survivors


def _dump_stacks(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGUSR1)
    if pids:
        time.sleep(1.0)  # faulthandler writes from a signal handler: give it a moment


def _kill(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
