"""The launcher process vanished while this rank is blocked: end the rank instead of hanging.

A rank started by a launcher (Lightning's, torchrun's) is re-parented when the
launcher dies. Blocked in a collective whose peers died with the launcher, it
would wait for torch's 30-minute timeout.
"""

from __future__ import annotations

import os

from ._sites import format_site
from ._trail import TRAIL
from ._watch import Watch
from .desync_report import titled

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .monitor import Monitor


class ParentGone(Watch):
    def __init__(self) -> None:
        self._ppid = os.getppid()

    def tick(self, now: float, monitor: Monitor) -> None:
        where = TRAIL.waiting_in()
        if self._ppid > 1 and os.getppid() != self._ppid and where is not None:
            monitor.end(
                titled(
                    f"the launcher process (pid {self._ppid}) is gone while rank {monitor.rank} "
                    f"is blocked in {where.op} called at "
                    f"{format_site(where.stack[0] if where.stack else None)}; ending this rank."
                )
            )
