"""compatshim.dist: ranks out of step become a clear error within a timeout, not a silent hang.

- :func:`sync_point` - ranks meet in the process group's key-value store.
- :func:`check_module_consistency` - same parameters on every rank before wrapping.
- :func:`watchdog` - a rank stuck anywhere: every rank's Python stack in one report.
- :class:`DesyncError` - the readable report (pickled under this module's name).

The public names only; the code lives in :mod:`compatshim.desync`. Importing this module
imports no framework; torch is imported on first use.
"""

from __future__ import annotations

from .desync.consistency import check_module_consistency
from .desync.desync_report import DesyncError
from .desync.doctor import doctor_rows
from .desync.sync import sync_point
from .desync.watchdog import watchdog

__all__ = ["DesyncError", "check_module_consistency", "doctor_rows", "sync_point", "watchdog"]
