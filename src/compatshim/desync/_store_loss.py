"""The store stopped answering: retry gently, and end a rank that is blocked with no way out.

The store lives in rank 0's process (TCPStore). When it stops answering while
this rank is blocked in a watched call, rank 0 has most likely ended and the
collective this rank waits in will never complete: after a few seconds of
failures the rank ends with a report instead of hanging until torch's timeout.
"""

from __future__ import annotations

from ._sites import format_site
from ._trail import TRAIL
from .desync_report import titled

RETRY_EVERY = 1.0  # seconds between store attempts once it has failed
GIVE_UP_AFTER = 3.0  # seconds of failures, while blocked, before this rank ends

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .monitor import Monitor


class StoreLoss:
    """Tracks store failures for the monitor (which owns one) and decides when to give up."""

    def __init__(self) -> None:
        self.failing_since: float | None = None
        self._last_try = 0.0

    @property
    def healthy(self) -> bool:
        return self.failing_since is None

    def may_try(self, now: float) -> bool:
        """Whether to use the store this tick (at most once a second while it fails)."""
        if self.failing_since is not None and now - self._last_try <= RETRY_EVERY:
            return False
        self._last_try = now
        return True

    def answered(self) -> None:
        self.failing_since = None

    def failed(self, exc: Exception, now: float, monitor: Monitor) -> None:
        if self.failing_since is None:
            self.failing_since = now
            return
        where = TRAIL.waiting_in()
        if now - self.failing_since > GIVE_UP_AFTER and where is not None:
            monitor.end(
                titled(
                    f"rank {monitor.rank} lost the process group's store "
                    f"({type(exc).__name__}: {exc}) while blocked in {where.op} called at "
                    f"{format_site(where.stack[0] if where.stack else None)}; the rank that "
                    "hosts the store (rank 0) has most likely ended. Ending this rank too."
                ),
                write_record=False,
            )
