"""Ending this process after a report; the exit record a rank leaves when it ends or leaves.

A rank blocked in a C++ collective cannot raise, so its monitor prints the
report and ends the process (exit code 70, EX_SOFTWARE). Before leaving it
records its exit for the other ranks and waits for theirs: leaving first would
close the transport under a peer still blocked, whose main thread would then
take gloo's "Connection closed by peer" (and run the user's error handling)
instead of ending with this report. The wait blocks on the store rather than
polling it, so every rank wakes when the last record lands and exits at once,
with nothing left to print; then every watch cleans up (Lightning's launcher
ends the child ranks it started). It is bounded: a rank that records nothing
(killed, or holding the GIL) is waited for ``DEPARTURE_WAIT`` seconds, one
whose monitor still runs while a desync notice is out (it will end or raise)
up to ``DEPARTURE_LIMIT``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from typing import NoReturn, Sequence

from . import _liveness
from ._records import ExitRecord, Keys
from ._sites import format_site, user_frames
from ._store import Meeting
from ._trail import TRAIL
from ._watch import Watch

EXIT_CODE = 70  # EX_SOFTWARE: the process was ended after a desync/hang report
DEPARTURE_WAIT = 2.0  # seconds to wait for every rank's exit record
DEPARTURE_LIMIT = 15.0  # ... for a rank whose monitor runs while a notice is out (see above)
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
    sys.stdout.flush()
    if write_record and meeting is not None:
        how = f"ended by compatshim after a desync report (exit code {EXIT_CODE})"
        with contextlib.suppress(Exception):
            meeting.put(Keys.exit(meeting.rank), ExitRecord(how=how, code=EXIT_CODE))
    if meeting is not None:
        _await_departures(meeting)
    for watch in watches:
        with contextlib.suppress(Exception):
            watch.ending(CLEANUP_GRACE)
    os._exit(EXIT_CODE)


def _await_departures(meeting: Meeting) -> None:
    """Leave together with the other ranks, for a bounded time (see the module docstring)."""
    keys = [Keys.exit(rank) for rank in range(meeting.world_size)]
    start = time.monotonic()
    try:
        if meeting.wait(keys, DEPARTURE_WAIT):
            return
        while time.monotonic() - start < DEPARTURE_LIMIT and _someone_ending(meeting):
            if meeting.wait(keys, 0.5):
                return
    except Exception:
        return  # the store is gone: nobody left to wait for


def _someone_ending(meeting: Meeting) -> bool:
    """A notice is out and a rank that has not left yet still runs its monitor: it will."""
    if not meeting.has([Keys.desync()]):
        return False
    for rank in meeting.others():
        info = _liveness.describe(meeting, rank)  # gone, silent, or alive with a fresh heartbeat
        if info.state == "alive" and info.heartbeat_age is not None:
            return True
    return False


def _uncaught() -> str | None:
    """The exception that ended the main thread, if one did (the interpreter keeps it)."""
    error = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
    return f"uncaught {type(error).__name__}" if error is not None else None


def at_exit(meeting: Meeting | None, watches: Sequence[Watch], *, reported: bool) -> None:
    """Interpreter exit: record how this rank ended (first: peers waiting on it may leave).

    ``reported``: this rank raised a DesyncError; it waits for the ranks its notice ends
    (see the module docstring), then the watches end what they started.
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
        if meeting is not None:
            _await_departures(meeting)
        for watch in watches:
            with contextlib.suppress(Exception):
                watch.ending(EXIT_CLEANUP_GRACE)


def left_group(meeting: Meeting) -> None:
    """This rank is destroying its process group: it will not arrive anywhere any more."""
    site = user_frames(limit=1)
    how = f"destroy_process_group() called at {format_site(site[0] if site else None)}"
    with contextlib.suppress(Exception):
        meeting.put(Keys.exit(meeting.rank), ExitRecord(how=how, left=True))
