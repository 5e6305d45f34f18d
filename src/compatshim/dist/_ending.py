"""Ending this process after a report; the exit record a rank leaves when it ends or leaves.

A rank blocked in a C++ collective cannot raise, so its monitor prints the
report and ends the process (exit code 70, EX_SOFTWARE). Before leaving it
records its exit for the other ranks, waits briefly for theirs (leaving first
would close the transport under a peer still blocked, which would then die of
gloo's "Connection closed" instead of this report) and lets every watch clean
up (Lightning's launcher ends the child ranks it started).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from typing import NoReturn, Sequence

from ._records import ExitRecord, Keys
from ._sites import format_site, user_frames
from ._store import Meeting
from ._trail import TRAIL
from ._watch import Watch

EXIT_CODE = 70  # EX_SOFTWARE: the process was ended after a desync/hang report
DEPARTURE_WAIT = 2.0  # seconds to wait for every rank's exit record
CLEANUP_GRACE = 3.0  # seconds a watch may take to end what it started
EXIT_CLEANUP_GRACE = 5.0  # the same at interpreter exit after this rank raised a DesyncError


def exit_description(code: int) -> str:
    """``exit code 1`` or ``killed by signal 9 (SIGKILL)`` for a ``Popen.returncode``."""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = "unknown signal"
        return f"killed by signal {-code} ({name})"
    return f"exit code {code}"


def end_process(
    report: str, meeting: Meeting | None, watches: Sequence[Watch], *, write_record: bool
) -> NoReturn:
    """Print ``report``, record this rank's exit, let the watches clean up, exit (code 70)."""
    print(report, file=sys.stderr, flush=True)
    if write_record and meeting is not None:
        how = f"ended by compatshim after a desync report (exit code {EXIT_CODE})"
        with contextlib.suppress(Exception):
            meeting.put(Keys.exit(meeting.rank), ExitRecord(how=how, code=EXIT_CODE))
    if meeting is not None:
        _await_departures(meeting, DEPARTURE_WAIT)
    for watch in watches:
        with contextlib.suppress(Exception):
            watch.ending(CLEANUP_GRACE)
    sys.stdout.flush()
    os._exit(EXIT_CODE)


def _await_departures(meeting: Meeting, limit: float) -> None:
    """Leave together, for at most ``limit`` seconds (see the module docstring)."""
    keys = [Keys.exit(rank) for rank in range(meeting.world_size)]
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            if meeting.has(keys):
                return
        except Exception:
            return  # the store is gone: nobody left to wait for
        time.sleep(0.01)


def _uncaught() -> str | None:
    """The exception that ended the main thread, if one did (the interpreter keeps it)."""
    error = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
    return f"uncaught {type(error).__name__}" if error is not None else None


def at_exit(meeting: Meeting | None, watches: Sequence[Watch], *, reported: bool) -> None:
    """Interpreter exit: record how this rank ended (first: peers waiting on it may leave).

    ``reported``: this rank raised a DesyncError; the watches end what they started.
    """
    if meeting is not None:
        uncaught = _uncaught()
        how = f"{uncaught} at interpreter exit" if uncaught else "interpreter exited normally"
        with contextlib.suppress(Exception):
            crumb = TRAIL.where()
            if crumb is not None:
                meeting.put(Keys.seen(meeting.rank), crumb.as_seen(active=False))
            if not meeting.has([Keys.exit(meeting.rank)]):
                meeting.put(Keys.exit(meeting.rank), ExitRecord(how=how))
    if reported:
        for watch in watches:
            with contextlib.suppress(Exception):
                watch.ending(EXIT_CLEANUP_GRACE)


def left_group(meeting: Meeting) -> None:
    """This rank is destroying its process group: it will not arrive anywhere any more."""
    site = user_frames(limit=1)
    how = f"destroy_process_group() called at {format_site(site[0] if site else None)}"
    with contextlib.suppress(Exception):
        meeting.put(Keys.exit(meeting.rank), ExitRecord(how=how, left=True))
