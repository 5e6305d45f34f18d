"""``watchdog(timeout)``: when a rank's main thread stops moving, every rank's stack in one report.

The per-process monitor samples the main thread's current frame; if it has not
moved for ``timeout`` seconds (a collective that never completes, a dead lock),
the monitor asks every rank through the store for its Python stacks, prints one
report and, with ``action="exit"``, ends the ranks (exit code 70) instead of
waiting for torch's 30-minute timeout. A rank blocked while holding the GIL
cannot answer; the report says so and gives its last breadcrumb.
"""

from __future__ import annotations

from typing import Any

from ._store import default_meeting, resolve_timeout
from .monitor import Monitor, ensure_monitor, get_monitor


class Watchdog:
    """Handle returned by :func:`watchdog`; ``stop()`` or leave the ``with`` block to disarm."""

    def __init__(self, monitor: Monitor) -> None:
        self._monitor = monitor

    def stop(self) -> None:
        self._monitor.hang_timeout = None

    def __enter__(self) -> Watchdog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def watchdog(
    timeout: float | None = None,
    *,
    action: str = "exit",
    store: Any = None,
    rank: int | None = None,
    world_size: int | None = None,
) -> Watchdog:
    """Arm the hang watchdog on this rank (call it on every rank after init_process_group).

    ``action="exit"`` ends every rank after the report; ``"report"`` only prints it.
    """
    if action not in ("exit", "report"):
        raise ValueError(f"action must be 'exit' or 'report', got {action!r}")
    limit = resolve_timeout(timeout)
    meeting = default_meeting(store, rank, world_size)
    monitor = ensure_monitor(meeting) if meeting is not None else get_monitor()
    monitor.start()
    monitor.hang_action = action
    monitor.hang_timeout = limit
    return Watchdog(monitor)
