"""Is a rank still there? Exit records, heartbeats and, on the same host, the process itself.

A rank's monitor writes a heartbeat (time, pid, host) every half second and an
exit record from ``atexit``; the Fabric launcher process also records the exit
code of each child it started. A process killed outright leaves no exit record,
so on the same host its pid is checked directly.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

from ._store import Meeting

SILENT_AFTER = 5.0  # seconds without heartbeat before a rank counts as silent

_host = socket.gethostname()


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie has exited; only its parent has not collected it yet
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return True


def is_gone(meeting: Meeting, rank: int) -> bool:
    """True when ``rank`` has certainly ended (exit record, or its local pid is dead)."""
    if meeting.has([meeting.key("exit", rank)]):
        return True
    beat = meeting.read(meeting.key("hb", rank))
    if beat and beat.get("host") == _host and beat.get("pid") and beat["pid"] != os.getpid():
        return not pid_alive(int(beat["pid"]))
    return False


def describe(meeting: Meeting, rank: int) -> dict[str, Any]:
    """Everything the store says about ``rank``: last breadcrumb, exit, heartbeat age."""
    info: dict[str, Any] = {"state": "alive"}
    info["seen"] = meeting.read(meeting.key("seen", rank))
    exited = meeting.read(meeting.key("exit", rank))
    beat = meeting.read(meeting.key("hb", rank))
    now = time.time()
    if exited:
        info["exit"] = exited
        info["state"] = "gone"
    elif beat:
        age = now - float(beat.get("time", now))
        info["heartbeat_age"] = age
        local = beat.get("host") == _host and beat.get("pid") and beat["pid"] != os.getpid()
        if local and not pid_alive(int(beat["pid"])):
            info["state"] = "gone"
            info["exit"] = {
                "how": f"process {beat['pid']} is gone (killed or crashed; it left no exit record)"
            }
        elif age > SILENT_AFTER and rank != meeting.rank:
            info["state"] = "silent"
            info["silent_for"] = age
            info["why"] = "blocked while holding the GIL, stopped, or its host is unreachable"
    return info
