"""The part of ``compatshim doctor`` that imports frameworks, run in a child process.

It installs every patch, imports each patch's target modules whose distribution
is installed (so the probes run against the live code), asks each adapter for
its rows, and prints one JSON document on stdout. Running it in a child keeps
the doctor's own process clean and lets a slow or crashing framework import
time out instead of taking the doctor down.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import time
import traceback
from importlib import import_module
from typing import Any

from ._engine import registry
from ._engine.versions import installed_version
from ._records import DoctorRow

#: adapters with a ``doctor_rows()``; breakage 1 is reported by its patch row.
ADAPTER_PROVIDERS = (
    "compatshim.checkpoint",
    "compatshim.rng",
    "compatshim.master",
    "compatshim.dist",
)


def _devices() -> dict[str, Any]:
    if installed_version("torch") is None:
        return {}
    import torch

    info: dict[str, Any] = {
        "cuda_available": bool(torch.cuda.is_available()),
        "cuda_devices": torch.cuda.device_count() if torch.cuda.is_available() else 0,
        "torch_cuda_build": torch.version.cuda,
    }
    mps = getattr(torch.backends, "mps", None)
    info["mps_available"] = bool(mps and mps.is_available())
    xpu = getattr(torch, "xpu", None)
    info["xpu_devices"] = xpu.device_count() if xpu is not None and xpu.is_available() else 0
    return info


def _import_targets() -> list[dict[str, str]]:
    """Import each target whose distribution applies, so the probes meet the live code; a
    target whose top-level package is not installed is no problem (``removed-names`` applies
    everywhere and targets numpy and torch.distributed)."""
    problems = []
    for row in registry.status():
        if not row.applies:
            continue
        for target in row.targets:
            try:
                with contextlib.redirect_stdout(io.StringIO()):
                    import_module(target)
            except ModuleNotFoundError as exc:
                if exc.name == target.partition(".")[0]:
                    continue  # its package is not installed (removed-names' numpy, torch)
                problems.append({"patch": row.name, "target": target, "error": repr(exc)})
            except Exception as exc:
                problems.append({"patch": row.name, "target": target, "error": repr(exc)})
    return problems


def _adapter_rows() -> list[DoctorRow]:
    rows: list[DoctorRow] = []
    for provider in ADAPTER_PROVIDERS:
        started = time.perf_counter()
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                module = import_module(provider)
                doctor_rows = getattr(module, "doctor_rows", None)
                found = list(doctor_rows()) if doctor_rows is not None else []
        except ModuleNotFoundError as exc:
            if exc.name == provider:
                continue
            found = [_error_row(provider, exc)]
        except Exception as exc:
            found = [_error_row(provider, exc)]
        for item in found:
            row = item if isinstance(item, DoctorRow) else DoctorRow.from_dict(dict(item))
            row.provider = row.provider or provider
            if row.seconds is None:
                row.seconds = round(time.perf_counter() - started, 2)
            rows.append(row)
    return rows


def _error_row(provider: str, exc: BaseException) -> DoctorRow:
    return DoctorRow(
        name=provider,
        kind="adapter",
        applies=True,
        present=None,
        fixed=False,
        detail=f"doctor check crashed: {type(exc).__name__}: {exc}",
        extra={"traceback": traceback.format_exc(limit=5)},
    )


def main() -> int:
    registry.install()
    import_problems = _import_targets()
    registry.probe_unarmed()
    report = {
        "missing": registry.missing_dependency(),
        "devices": _safe(_devices, {}),
        "import_problems": import_problems,
        "patches": [row.as_dict() for row in registry.status()],
        "adapters": [row.as_dict() for row in _safe(_adapter_rows, [])],
    }
    json.dump(report, sys.stdout, default=str)
    return 0


def _safe(fn: Any, default: Any) -> Any:
    try:
        return fn()
    except Exception as exc:
        return {"error": repr(exc)} if isinstance(default, dict) else default


if __name__ == "__main__":
    raise SystemExit(main())
