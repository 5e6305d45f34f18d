"""compatshim.dist: ranks out of step become a clear error within a timeout, not a silent hang.

- :func:`sync_point` - ranks meet in the process group's key-value store.
- :func:`check_module_consistency` - same parameters on every rank before wrapping.
- :func:`watchdog` - a rank stuck anywhere: every rank's Python stack in one report.
- :class:`DesyncError` - the readable report.

Importing this package imports no framework; torch is imported on first use.
"""

from __future__ import annotations

from .._records import DoctorRow
from .consistency import check_module_consistency
from .report import DesyncError
from .sync import sync_point
from .watchdog import watchdog

__all__ = ["DesyncError", "check_module_consistency", "doctor_rows", "sync_point", "watchdog"]


def doctor_rows() -> list[DoctorRow]:
    """Rows for ``compatshim doctor``: the DETAIL-debug hazard (the Lightning patch has its
    own registry row).

    Cheap: reads installed metadata and the environment, imports no framework.
    """
    import os

    from .._engine.versions import installed_version

    debug = os.environ.get("TORCH_DISTRIBUTED_DEBUG", "").upper()
    torch_version = installed_version("torch") or ""
    risky = debug == "DETAIL" and torch_version.startswith("2.13")
    detail = (
        f"TORCH_DISTRIBUTED_DEBUG=DETAIL with torch {torch_version}: every DDP construction "
        "segfaults on 2.13.0+cpu (measured); unset it and rely on compatshim.dist"
        if risky
        else f"TORCH_DISTRIBUTED_DEBUG={debug or 'unset'}"
    )
    return [
        DoctorRow(
            name="torch-distributed-debug-detail",
            kind="hazard",
            applies=debug == "DETAIL",
            present=risky if debug == "DETAIL" else None,
            fixed=False if risky else None,
            detail=detail,
        )
    ]
