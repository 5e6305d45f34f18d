"""One job of the monitor thread: the base class every watch derives from.

The monitor calls :meth:`Watch.tick` about twice a second on its own thread.
A watch that talks to the store says so (``needs_store``): it runs only while
the process group's store answers, and its store errors count towards "the
store is lost". :meth:`Watch.ending` lets a watch clean up (end the child
processes it knows of) when this process is about to end after a report.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .monitor import Monitor


class Watch:
    """Override :meth:`tick` (and :meth:`ending` when there is something to clean up)."""

    needs_store = False

    def tick(self, now: float, monitor: Monitor) -> None:
        """Look once; ``now`` is ``time.time()``. Raise nothing but store errors."""

    def ending(self, grace: float) -> None:
        """This process ends after a report within ``grace`` seconds: release what is yours."""
