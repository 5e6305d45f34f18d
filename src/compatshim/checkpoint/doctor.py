"""``compatshim doctor`` rows for the checkpoint loader: its allowlist, torch's own loader,
hardened mode and the process-wide allow entries.

Cheap: versions come from metadata; neither torch nor numpy is imported (the
entry points of ``compatshim.allow`` are loaded, as the first load needing them would).
"""

from __future__ import annotations

from .._engine.versions import installed_version, version_at_least
from .._records import DoctorRow
from .._text import names


def doctor_rows() -> list[DoctorRow]:
    from .allowlist import entries

    torch = installed_version("torch")
    detail = (
        f"compatshim.checkpoint.load/inspect: {len(entries())} allow-listed globals, "
        "the same on every torch"
    )
    if torch is not None and not version_at_least(torch, "2.6"):
        detail += (
            f"; torch {torch}'s own weights_only unpickler can run code from a crafted file "
            "(CVE-2025-32434, fixed in 2.6): load untrusted files with compatshim.checkpoint"
        )
    rows = [
        DoctorRow(
            name="checkpoint",
            kind="adapter",
            applies=torch is not None,
            present=None,
            fixed=None,
            detail=detail if torch is not None else "torch not installed",
        )
    ]
    if torch is not None:
        rows.append(safe_load_row())
    return rows


def safe_load_row() -> DoctorRow:
    """Whether hardened mode is asked for in processes started with this environment
    (``compatshim doctor`` says whether it is in force there: its start-up armed it)."""
    import sys

    from .. import _settings
    from .process_allow import allowed

    patch = "torch-load-safe-globals"
    on = _settings.safe_load()
    disabled = patch in {n.strip().lower().replace("_", "-") for n in _settings.disabled_names()}
    if not on:
        detail = (
            f"off: torch.load(weights_only=False) (DeepSpeed's checkpoint engine, Lightning "
            f"2.4/2.5 resume, PyG's retry) runs any code in a file; {_settings.SAFE_LOAD}=1 "
            "makes every torch.load weights-only (the start-up hook arms it, alone)"
        )
    elif disabled:
        detail = f"off: {_settings.SAFE_LOAD} is set but {_settings.DISABLE} names {patch}"
    else:
        detail = (
            "on: every torch.load is read by compatshim.checkpoint.load alone (torch's own "
            "unpickler never sees the file), weights_only=False included, honouring torch's "
            "add_safe_globals; torch.serialization._load/_legacy_load refuse the full "
            "unpickler (torch.load references taken before install()); DCP .metadata by "
            "torch-dcp-safe-metadata (torch 2.1-2.3's fsspec reader too); "
            "numpy.load(allow_pickle=True) by numpy-load-hardened; NOT covered: plain pickle"
        )
        torch = sys.modules.get("torch")
        wrapper = getattr(getattr(torch, "load", None), "__compatshim_hardened__", None)
        if torch is not None and wrapper is not True:
            detail += "; NOT applied in the doctor's own probe process"
    entries = allowed()
    if entries:
        listed = names([f"{e.qualname} ({e.source})" for e in entries], 10)
        detail += f"; {len(entries)} process-wide allow entries: {listed}"
    return DoctorRow(
        name="checkpoint-safe-load",
        kind="adapter",
        applies=True,
        present=None,
        fixed=None,
        detail=detail,
        extra={
            "safe_load": on and not disabled,
            "allowed": [
                {"qualname": e.qualname, "reason": e.reason, "source": e.source} for e in entries
            ],
        },
    )
