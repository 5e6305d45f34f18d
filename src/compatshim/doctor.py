"""``compatshim doctor``: what is installed, which known breakages apply, and are they fixed.

Versions come from metadata (fast, imports nothing). The live probes import
frameworks, so they run in a child process with a time limit
(:mod:`compatshim._doctor_probe`). The exit code is 0 only when every
breakage that applies to this install is fixed; otherwise 1 with a one-line
reason, so CI and scripts can gate on it.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from typing import Any

from . import _settings
from ._engine.versions import installed_version
from ._records import DoctorRow, PatchStatus

DISTRIBUTIONS = (
    "torch",
    "numpy",
    "colossalai",
    "nuscenes-devkit",
    "lightning",
    "lightning-fabric",
    "transformers",
    "accelerate",
)


def versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {"python": platform.python_version()}
    found.update({name: installed_version(name) for name in DISTRIBUTIONS})
    return found


def run_probes(timeout: float) -> dict[str, Any]:
    """Run the live probes in a child interpreter; never raises."""
    env = dict(os.environ)
    env.pop(_settings.AUTO, None)  # the child installs explicitly; COMPATSHIM_DISABLE is honoured
    try:
        done = subprocess.run(
            [sys.executable, "-m", "compatshim._doctor_probe"],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"live probes did not finish within {timeout:.0f}s"}
    try:
        report: dict[str, Any] = json.loads(done.stdout)
    except json.JSONDecodeError:
        tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
        return {"error": f"live probes exited {done.returncode}: " + " | ".join(tail)}
    return report


def _status(data: dict[str, Any]) -> PatchStatus:
    known = PatchStatus.__dataclass_fields__
    return PatchStatus(**{k: v for k, v in data.items() if k in known})


#: patches whose probe finds a defect only in hardened mode, and what stays unsafe without it
HARDENED_ONLY = {
    "torch-dcp-safe-metadata": (
        "torch.distributed.checkpoint reads a folder's .metadata with pickle.load, "
        "which runs any code in it"
    ),
    "numpy-load-hardened": (
        "numpy.load(allow_pickle=True) unpickles object arrays and pickle files with "
        "pickle.load, which runs any code in them"
    ),
}


def patch_row(patch: PatchStatus) -> DoctorRow:
    """The doctor's line for one patch, from its ``status()`` record."""
    version = patch.installed_version
    present = {"present": True, "absent": False}.get(patch.defect)
    where = f"{patch.distribution} {version}"
    if not patch.applies:
        detail = (
            f"{patch.distribution} not installed"
            if version is None
            else f"{where}: outside the releases the patch supports ({patch.requires})"
        )
    elif patch.disabled:
        state = {True: "present", False: "absent", None: "not probed"}[present]
        detail = f"{where}: defect {state}; disabled by {_settings.DISABLE}"
    elif present is None:
        detail = patch.error or "target not imported, not probed"
    elif not present and patch.name in HARDENED_ONLY and not _settings.safe_load():
        detail = f"{where}: off unless {_settings.SAFE_LOAD}=1 ({HARDENED_ONLY[patch.name]})"
    elif not present:
        detail = f"{where}: defect absent, nothing to do"
    else:
        note = ""
        if not patch.in_range and patch.tested:
            note = f" ({patch.version_note or 'outside the tested range ' + patch.tested}; "
            note += "the probe decided)"
        detail = f"{where}: {patch.description}{note}"
    if patch.error and present is not None:
        detail += f" [error: {patch.error}]"
    if patch.used:  # entries a process used (in the user's process: compatshim.status())
        detail += f"; used: {', '.join(patch.used)}"
    return DoctorRow(
        name=patch.name,
        kind="patch",
        applies=patch.applies,
        present=present,
        fixed=(bool(patch.fixed) and not patch.disabled) if present else None,
        detail=detail,
        extra={"used": list(patch.used)} if patch.used else {},
    )


def rows(report: dict[str, Any]) -> list[DoctorRow]:
    """One uniform row per patch and adapter check, then the removed names that apply."""
    out = [patch_row(_status(patch)) for patch in report.get("patches", [])]
    out.extend(DoctorRow.from_dict(row) for row in report.get("adapters", []))
    out.extend(removed_rows())
    return out


def removed_rows() -> list[DoctorRow]:
    """A row per removed name compatshim cannot provide (``aliases.table.REMOVED``) whose
    distribution is installed at a release without it: present, ``fixed`` None (nothing
    compatshim could provide), so it does not fail the verdict; read from metadata only."""
    from ._engine.versions import contains
    from .aliases.table import REMOVED

    out = []
    for entry in REMOVED:
        version = installed_version(entry.distribution)
        if version is None or not contains(entry.removed, version):
            continue
        out.append(
            DoctorRow(
                name=entry.name,
                kind="hazard",
                applies=True,
                present=True,
                fixed=None,
                detail=(
                    f"{entry.distribution} {version} removed it ({entry.distribution}"
                    f"{entry.removed}); code importing it fails and compatshim provides no alias "
                    f"(no replacement keeps its meaning): use {entry.instead}"
                ),
                extra={"evidence": entry.evidence},
            )
        )
    return out


def verdict(table: list[DoctorRow], report: dict[str, Any]) -> tuple[int, str]:
    if "error" in report:
        return 2, f"could not run the live probes: {report['error']}"
    # fixed None on a present row: a removed name compatshim cannot provide (reported only)
    unfixed = [r for r in table if r.applies and r.present and r.fixed is False]
    unknown = [r for r in table if r.applies and r.present is None and r.kind == "patch"]
    if unfixed:
        names = ", ".join(r.name for r in unfixed)
        return 1, f"{len(unfixed)} applicable breakage(s) not fixed: {names}"
    if unknown:
        names = ", ".join(r.name for r in unknown)
        return 1, f"could not probe: {names}"
    present = sum(1 for r in table if r.applies and r.present)
    if not present:
        return 0, "ok: no known breakage applies to this install"
    return 0, f"ok: {present} breakage(s) present in this install, all fixed by compatshim"


def _mark(value: Any) -> str:
    return {True: "yes", False: "no", None: "-"}.get(value, str(value))


def render(ver: dict[str, str | None], report: dict[str, Any], table: list[DoctorRow]) -> str:
    lines = ["compatshim doctor", "", "Installed (from metadata):"]
    width = max(len(k) for k in ver)
    lines += [f"  {name:<{width}}  {version or 'not installed'}" for name, version in ver.items()]
    devices = report.get("devices") or {}
    if devices:
        lines += ["", "Devices:"]
        lines += [f"  {key}: {value}" for key, value in devices.items()]
    header = ("check", "kind", "applies", "present", "fixed", "detail")
    body = [
        (r.name, r.kind, _mark(r.applies), _mark(r.present), _mark(r.fixed), r.detail)
        for r in table
    ]
    widths = [max(len(str(row[i])) for row in [header, *body]) for i in range(5)]
    lines += ["", "Breakages and adapters:"]
    for row in [header, *body]:
        cells = [str(cell).ljust(widths[i]) for i, cell in enumerate(row[:5])]
        lines.append("  " + "  ".join(cells) + "  " + str(row[5]))
    for problem in report.get("import_problems", []):
        lines.append(f"  note: importing {problem['target']} failed: {problem['error']}")
    return "\n".join(lines)


def main(as_json: bool = False, timeout: float | None = None, verbose: bool = False) -> int:
    try:
        timeout = _settings.doctor_timeout(timeout)
    except _settings.SettingError as exc:
        print(f"compatshim doctor: {exc}", file=sys.stderr)
        return 2
    ver = versions()
    report = run_probes(timeout)
    table = rows(report)
    code, reason = verdict(table, report)
    if as_json:
        payload = {
            "versions": ver,
            "report": report,
            "checks": [row.as_dict() for row in table],
            "exit": code,
            "reason": reason,
        }
        print(json.dumps(payload, indent=2, default=str))
    else:
        print(render(ver, report, table))
        print()
        print(reason)
    return code
