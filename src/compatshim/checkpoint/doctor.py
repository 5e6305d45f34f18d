"""``compatshim doctor`` rows for the checkpoint loader: its allowlist, and torch's own loader.

Cheap: versions come from metadata; neither torch nor numpy is imported.
"""

from __future__ import annotations

from .._records import DoctorRow
from .._versions import installed_version, version_at_least


def doctor_rows() -> list[DoctorRow]:
    from .allowlist import entries

    torch = installed_version("torch")
    table = entries()
    torch_safe = sum(1 for entry in table if entry.torch_safe)
    detail = (
        f"compatshim.checkpoint.load/inspect: {len(table)} allow-listed globals "
        f"({torch_safe} also safe for torch's own unpickler), the same on every torch"
    )
    if torch is not None and not version_at_least(torch, "2.6"):
        detail += (
            f"; torch {torch}'s own weights_only unpickler can run code from a crafted file "
            "(CVE-2025-32434, fixed in 2.6): load untrusted files with compatshim.checkpoint"
        )
    return [
        DoctorRow(
            name="checkpoint",
            kind="adapter",
            applies=torch is not None,
            present=None,
            fixed=None,
            detail=detail if torch is not None else "torch not installed",
        )
    ]
