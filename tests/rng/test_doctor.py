"""doctor_rows(): the RNG adapter and its hazards, cheap and shaped as the CLI expects."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import compatshim.rng as rng
from compatshim._records import DoctorRow


def test_rows_shape_and_content() -> None:
    pytest.importorskip("torch")  # the rows apply only where torch is installed
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
    torch = pytest.importorskip("torch")
    from packaging.version import Version

    row = next(r for r in rng.doctor_rows() if r.name == "rng.weights-only-numpy")
    assert row.present == (Version(torch.__version__.split("+")[0]) >= Version("2.6"))


def test_weights_only_hazard_does_not_apply_without_numpy(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch 2.6+ without numpy: no numpy RNG state loads there (torch needs numpy to build
    it, as compatshim does), so the row said a hazard was present that nothing can meet."""
    import compatshim.rng.doctor as doctor

    real = doctor.installed_version
    monkeypatch.setattr(
        doctor, "installed_version", lambda name: None if name == "numpy" else real(name)
    )
    monkeypatch.setattr(doctor, "version_at_least", lambda version, minimum: True)
    row = next(r for r in doctor.doctor_rows() if r.name == "rng.weights-only-numpy")
    assert (row.applies, row.present, row.fixed) == (False, None, None)
    assert "numpy not installed" in row.detail


def test_doctor_rows_import_no_framework() -> None:
    code = (
        "import sys, compatshim.rng as r; r.doctor_rows(); "
        "print('torch' in sys.modules, 'numpy' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def _accelerate_row(tmp_path: Path, handler: str) -> dict[str, object] | None:
    """The row for a fake accelerate 1.15.0 (dist-info + checkpointing.py), in a fresh
    interpreter: versions are read from metadata once per process."""
    info = tmp_path / "accelerate-1.15.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: accelerate\nVersion: 1.15.0\n")
    (tmp_path / "accelerate").mkdir()
    (tmp_path / "accelerate" / "checkpointing.py").write_text(
        f"def load_accelerator_state():\n    try:\n        pass\n{handler}"
    )
    code = (
        f"import sys, json; sys.path.insert(0, {str(tmp_path)!r})\n"
        "import compatshim.rng as r\n"
        "rows = [x.as_dict() for x in r.doctor_rows()]\n"
        "assert 'accelerate' not in sys.modules\n"
        "print(json.dumps([x for x in rows if x['name'] == 'rng.accelerate-swallowed-restore']))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    found = json.loads(done.stdout)
    return found[0] if found else None


def test_a_swallowing_accelerate_is_reported_without_failing_the_verdict(tmp_path: Path) -> None:
    swallowing = "    except Exception:\n        logger.info('Could not load random states')\n"
    row = _accelerate_row(tmp_path, swallowing)
    assert row is not None and row["present"] is True and row["fixed"] is None
    assert "compatshim.rng.load" in str(row["detail"])
    assert "accelerate 1.15.0" in str(row["detail"])


def test_an_accelerate_that_raises_is_not_reported(tmp_path: Path) -> None:
    row = _accelerate_row(tmp_path, "    except Exception:\n        raise\n")
    assert row is not None and row["present"] is False
