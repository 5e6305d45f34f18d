"""Hypothesis fuzz over real files, in a fresh interpreter: only library errors, bounded memory.

``COMPATSHIM_TEST_FUZZ_EXAMPLES`` (default 150) sets the number of mutants; CI keeps
it modest, a longer local run is ``COMPATSHIM_TEST_FUZZ_EXAMPLES=5000 pytest ...``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from tests.checkpoint.helpers import ROOT, peak_rss_mb

EXAMPLES = int(os.environ.get("COMPATSHIM_TEST_FUZZ_EXAMPLES", "150"))


@pytest.mark.slow
def test_mutated_real_files_raise_only_library_errors(tmp_path: Path) -> None:
    baseline, _ = peak_rss_mb("import tests.checkpoint.fuzz_child", timeout=600)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    done = subprocess.run(
        [sys.executable, "-m", "tests.checkpoint.fuzz_child", str(tmp_path), str(EXAMPLES)],
        capture_output=True,
        text=True,
        timeout=1800,
        env=env,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-5000:]
    peak = float(done.stdout.rpartition("PEAK")[2])
    assert not (tmp_path / "PWNED").exists()
    assert peak - baseline < 200, f"fuzz peak {peak:.0f} MB, baseline {baseline:.0f} MB"
