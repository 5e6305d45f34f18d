"""``compatshim.dist`` stays the public name after its code moved to ``compatshim.desync``.

The folder was renamed because tools skip a folder called ``dist`` as build output; users'
imports, tracebacks and pickled errors still say ``compatshim.dist``.
"""

from __future__ import annotations

import pickle
import subprocess
import sys

import compatshim.dist
from compatshim.desync import consistency, desync_report, doctor, sync, watchdog
from compatshim.dist import DesyncError

# pickle.dumps(DesyncError("compatshim.dist.DesyncError: ranks are out of step at sync point
# #1"), protocol=2), written by compatshim before the rename (src/compatshim/dist/ a folder)
SAVED_BEFORE_THE_RENAME = (
    b"\x80\x02ccompatshim.dist\nDesyncError\nq\x00X&\x00\x00\x00ranks are out of step at "
    b"sync point #1q\x01\x85q\x02Rq\x03}q\x04(X\x06\x00\x00\x00reportq\x05XC\x00\x00\x00"
    b"compatshim.dist.DesyncError: ranks are out of step at sync point #1q\x06X\x05\x00\x00"
    b"\x00ranksq\x07}q\x08ub."
)


def test_the_public_names_are_the_desync_objects() -> None:
    assert compatshim.dist.__all__ == [
        "DesyncError",
        "check_module_consistency",
        "doctor_rows",
        "sync_point",
        "watchdog",
    ]
    assert compatshim.dist.sync_point is sync.sync_point
    assert compatshim.dist.check_module_consistency is consistency.check_module_consistency
    assert compatshim.dist.watchdog is watchdog.watchdog
    assert compatshim.dist.DesyncError is desync_report.DesyncError
    assert compatshim.dist.doctor_rows is doctor.doctor_rows


def test_desync_error_keeps_its_public_name_in_tracebacks_and_pickles() -> None:
    assert DesyncError.__module__ == "compatshim.dist"
    assert DesyncError.__qualname__ == "DesyncError"
    error = DesyncError(desync_report.HEADLINE + "ranks are out of step at sync point #1")
    data = pickle.dumps(error)
    assert b"compatshim.dist" in data and b"compatshim.desync" not in data
    again = pickle.loads(data)
    assert type(again) is DesyncError
    assert (str(again), again.report) == (str(error), error.report)


def test_an_error_pickled_before_the_rename_still_loads() -> None:
    loaded = pickle.loads(SAVED_BEFORE_THE_RENAME)
    assert type(loaded) is DesyncError
    assert str(loaded) == "ranks are out of step at sync point #1"
    assert loaded.report.startswith("compatshim.dist.DesyncError: ")


def test_importing_the_public_name_imports_no_framework() -> None:
    code = (
        "import sys, compatshim.dist; from compatshim.dist import sync_point; "
        "print(sorted(m for m in ('torch', 'numpy', 'lightning') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == "[]", done.stderr
