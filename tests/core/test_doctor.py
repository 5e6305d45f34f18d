"""``compatshim doctor`` against the real torch of this env: versions from metadata, live
probes in a child process, and an exit code that says whether every applicable breakage
is fixed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest


def _doctor(*args: str, **env: str) -> tuple[int, str]:
    full_env = {k: v for k, v in os.environ.items() if k != "COMPATSHIM_DISABLE"}
    full_env.update(env)
    done = subprocess.run(
        [sys.executable, "-m", "compatshim", "doctor", *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=300,
    )
    return done.returncode, done.stdout


def _check(payload: dict[str, Any], name: str) -> dict[str, Any]:
    return next(row for row in payload["checks"] if row["name"] == name)


def test_versions_come_from_metadata_without_imports() -> None:
    code = (
        "import sys; from compatshim import doctor; v = doctor.versions(); "
        "assert v['torch'], v; assert 'torch' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_json_report_on_this_install() -> None:
    import torch

    code, out = _doctor("--json")
    payload = json.loads(out)
    # metadata may omit the local label torch.__version__ carries (2.4.1 vs 2.4.1+cu121)
    assert torch.__version__.startswith(payload["versions"]["torch"])
    assert payload["report"]["devices"]["cuda_devices"] == (
        torch.cuda.device_count() if torch.cuda.is_available() else 0
    )
    row = _check(payload, "torch-processgroup-copy")
    assert row["applies"] and row["present"] is True and row["fixed"] is True, row
    assert code == payload["exit"] == (0 if "ok:" in payload["reason"] else 1)


def test_terminal_table_and_exit_zero_when_fixed() -> None:
    code, out = _doctor()
    assert "torch-processgroup-copy" in out
    assert out.strip().splitlines()[-1].startswith("ok:"), out
    assert code == 0


def test_disabled_patch_is_reported_present_and_unfixed() -> None:
    code, out = _doctor("--json", COMPATSHIM_DISABLE="torch-processgroup-copy")
    payload = json.loads(out)
    row = _check(payload, "torch-processgroup-copy")
    assert row["present"] is True and not row["fixed"]
    assert "disabled" in row["detail"]
    assert code == 1 and "torch-processgroup-copy" in payload["reason"]


@pytest.mark.parametrize("argv", [["doctor", "--help"], ["--help"]])
def test_cli_help(argv: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "compatshim", *argv], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and "doctor" in done.stdout


def test_doctor_lists_the_checkpoint_patches_and_adapter() -> None:
    _, out = _doctor("--json")
    payload = json.loads(out)
    names = {row["name"] for row in payload["checks"]}
    assert {"torch-load-safe-globals", "numpy-core-names", "checkpoint"} <= names, names
    adapter = _check(payload, "checkpoint")
    assert adapter["applies"] and "allow-listed globals" in adapter["detail"], adapter
    loader = _check(payload, "torch-load-safe-globals")
    # weights-only by default from torch 2.6: there the patch has something to fix
    assert loader["present"] in (True, False) and (loader["fixed"] is True or not loader["present"])


@pytest.mark.parametrize("version,reported", [("5.24.0", True), ("5.23.0", False)])
def test_a_removed_name_without_alias_is_a_row_that_does_not_fail_the_verdict(
    tmp_path: Any, version: str, reported: bool
) -> None:
    """transformers 5.24 removed ``modeling_attn_mask_utils`` and nothing keeps its meaning:
    the doctor names the break from metadata (a distribution's dist-info, nothing imported)."""
    info = tmp_path / f"transformers-{version}.dist-info"
    info.mkdir()
    metadata = f"Metadata-Version: 2.1\nName: transformers\nVersion: {version}\n"
    (info / "METADATA").write_text(metadata)
    code = (
        f"import sys, json; sys.path.insert(0, {str(tmp_path)!r})\n"
        "from compatshim import doctor\n"
        "rows = doctor.removed_rows()\n"
        "print(json.dumps([r.as_dict() for r in rows]))\n"
        "print(json.dumps(doctor.verdict(rows, {})))\n"
        "assert 'transformers' not in sys.modules\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    rows_line, verdict_line = done.stdout.splitlines()
    rows = json.loads(rows_line)
    assert json.loads(verdict_line)[0] == 0
    if not reported:
        assert rows == []
        return
    (row,) = rows
    assert row["name"] == "transformers.modeling_attn_mask_utils" and row["kind"] == "hazard"
    assert row["present"] is True and row["fixed"] is None
    assert f"transformers {version} removed it" in row["detail"]
    assert "transformers.masking_utils" in row["detail"]
    assert "5.24.0 wheel" in row["extra"]["evidence"]
