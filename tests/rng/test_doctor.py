"""doctor_rows(): the RNG adapter and its hazards, cheap and shaped as the CLI expects."""

from __future__ import annotations

import subprocess
import sys

import compatshim.rng as rng
from compatshim._records import DoctorRow


def test_rows_shape_and_content() -> None:
    rows = rng.doctor_rows()
    assert {row.name for row in rows} >= {
        "rng",
        "rng.device-count-change",
        "rng.weights-only-numpy",
    }
    for row in rows:
        assert isinstance(row, DoctorRow)
        assert row.kind in ("adapter", "hazard", "patch")
        assert isinstance(row.applies, bool) and isinstance(row.detail, str)
    adapter = next(r for r in rows if r.name == "rng")
    assert adapter.kind == "adapter" and adapter.applies


def test_weights_only_hazard_follows_the_installed_torch() -> None:
    import torch
    from packaging.version import Version

    row = next(r for r in rng.doctor_rows() if r.name == "rng.weights-only-numpy")
    assert row.present == (Version(torch.__version__.split("+")[0]) >= Version("2.6"))


def test_doctor_rows_import_no_framework() -> None:
    code = (
        "import sys, compatshim.rng as r; r.doctor_rows(); "
        "print('torch' in sys.modules, 'numpy' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
