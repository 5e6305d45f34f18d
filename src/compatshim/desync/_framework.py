"""The internal API a framework patch uses to watch a run (today: the Lightning Fabric patch).

A patch marks the framework's calls, meets the other ranks at its set-up
calls, says which calls may be ended when stuck, adds watches of its own (the
launcher's child processes), and ends the run with a report. It reaches the
monitor, the store and the report layout only through these functions:

- :func:`enter_call` / :func:`leave_call` / :func:`waiting_call` - breadcrumbs
  (the hot path: an in-memory write, no store traffic);
- :func:`watch_process_group` - start watching once the default group spans 2+ ranks;
- :func:`meet` - a sync point, comparing a module's parameters when given one;
- :func:`watch_calls` - end a watched call stuck past the timeout (plus an
  allowance per call) once no rank is moving;
- :func:`add_watch` / :func:`remove_watch` - a :class:`Watch` of the framework's own;
- :func:`record_exit`, :func:`ended_rank_report`, :func:`end_run`,
  :func:`exit_description` - for a watch that learns of a rank's end first
  hand (a launcher's child process).
"""

from __future__ import annotations

import contextlib
import sys
import weakref
from typing import Any, Callable, Mapping, NoReturn

from .._settings import desync_timeout
from ._ending import exit_description
from ._liveness import RankState, describe_all
from ._records import ExitRecord, Keys
from ._sites import format_site
from ._store import default_meeting
from ._stuck import StuckCalls
from ._trail import TRAIL, Crumb
from ._watch import Watch
from .consistency import first_difference, module_summary
from .desync_report import build_report
from .monitor import get_monitor
from .sync import meet as _meet

__all__ = [
    "Call",
    "Watch",
    "add_watch",
    "end_run",
    "ended_rank_report",
    "enter_call",
    "exit_description",
    "leave_call",
    "meet",
    "record_exit",
    "remove_watch",
    "waiting_call",
    "watch_calls",
    "watch_process_group",
]

Call = Crumb  # a watched call in progress: ``op``, ``stack`` (user frames), ``since``


def _no_group() -> object:
    return None


_decided_for: Callable[[], object] = _no_group  # weak: the default group last looked at
_distributed = False  # whether it spans 2+ ranks (then the monitor watches it)


#: ``enter_call(op, collective=False)``: mark entering ``op`` (``collective``: a world-wide
#: collective, it needs every rank). Returns None when already inside a watched call on this
#: thread (only the outermost counts); pass the result to ``leave_call`` either way. Bound
#: methods, not wrappers: this is the hot path of every training step.
enter_call = TRAIL.enter
leave_call = TRAIL.leave


def waiting_call() -> Call | None:
    """The watched call this process is blocked in; None outside one or while a sync point waits."""
    return TRAIL.waiting_in()


def watch_process_group() -> bool:
    """Watch the default process group when it spans 2+ ranks; whether one is distributed.

    Cheap to call on every framework call: it looks at each new group once.
    """
    global _decided_for, _distributed
    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    world = c10d.GroupMember.WORLD if c10d is not None else None
    if world is None:
        return False
    if world is not _decided_for():
        meeting = default_meeting()
        if meeting is not None:
            get_monitor().attach(meeting)
        _decided_for, _distributed = weakref.ref(world), meeting is not None
    return _distributed


def meet(tag: str, module: Any = None) -> None:
    """A sync point named ``tag``; with ``module``, its parameters and buffers must match too.

    Something that is not a module is not compared (the framework raises its own error).
    """
    if not callable(getattr(module, "named_parameters", None)):
        _meet(tag)
    else:
        _meet(tag, payload=module_summary(module), compare=first_difference)


def watch_calls(allowances: Mapping[str, float] | None = None) -> Watch:
    """From now on, end a watched call stuck past the desync timeout (plus its allowance).

    Starts the monitor; returns the watch (for :func:`remove_watch`). Stopped,
    with every other watch, when the process group is destroyed or the process exits.
    """
    monitor = get_monitor()
    for watch in monitor.watches():
        if isinstance(watch, StuckCalls):
            watch.allowances.update(allowances or {})
            return watch
    stuck = StuckCalls(desync_timeout(), allowances or {})
    monitor.add(stuck)
    return stuck


def add_watch(watch: Watch) -> None:
    get_monitor().add(watch)


def remove_watch(watch: Watch) -> None:
    get_monitor().remove(watch)


def record_exit(rank: int, how: str, code: int | None = None) -> None:
    """Tell the other ranks that ``rank`` has ended (when a process group is watched)."""
    meeting = get_monitor().meeting
    if meeting is not None:
        with contextlib.suppress(Exception):
            meeting.put(Keys.exit(rank), ExitRecord(how=how, code=code))


def ended_rank_report(
    rank: int, how: str, call: Call, *, this_rank: int, exits: Mapping[int, str], hint: str
) -> str:
    """The report for ``rank`` having ended (``how``) while this one waits in ``call``.

    ``exits``: how each rank this process saw end, ended (rank -> words);
    ``hint``: what the user may have done (the framework knows its own pitfalls).
    """
    meeting = get_monitor().meeting
    ranks = describe_all(meeting) if meeting is not None else {}
    ranks.setdefault(this_rank, RankState(is_self=True)).seen = call.as_seen(active=True)
    for other, words in exits.items():
        ranks.setdefault(other, RankState()).exit = ExitRecord(how=words)
    before = " before joining the process group" if meeting is None else ""
    site = format_site(call.stack[0] if call.stack else None)
    return build_report(
        headline=f"rank {rank} ended ({how}){before} while rank {this_rank} waits in {call.op}",
        ranks=ranks,
        differs=[f"rank {this_rank} called {call.op} at {site}; rank {rank} ended {hint}"],
    )


def end_run(report: str) -> NoReturn:
    """Print ``report`` and end this process (exit code 70), letting every watch clean up."""
    get_monitor().end(report)
