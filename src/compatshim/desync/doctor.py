"""``doctor_rows()``: the desync hazard ``compatshim doctor`` reports (the Lightning patch has
its own registry row).

Cheap: reads installed metadata and the environment, imports no framework.
"""

from __future__ import annotations

import os

from .._engine.versions import installed_version
from .._records import DoctorRow


def doctor_rows() -> list[DoctorRow]:
    """One row: ``TORCH_DISTRIBUTED_DEBUG=DETAIL``, which segfaults DDP on torch 2.13.0+cpu."""
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
