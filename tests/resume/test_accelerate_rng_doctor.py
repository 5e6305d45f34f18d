"""The doctor reads the real accelerate release and reports its swallowed RNG restore.

accelerate's ``load_accelerator_state`` wraps every generator restore in
``except Exception: logger.info("Could not load random states")`` (1.15.0 and
0.34.2 alike), so a resume that restored nothing looks like one that restored
everything. compatshim does not patch accelerate; the doctor names the hazard
and the call that restores with a report.
"""

from __future__ import annotations

import pytest

pytest.importorskip("accelerate")

import compatshim.rng as rng


def test_the_installed_accelerate_swallows_and_the_doctor_says_so() -> None:
    row = next(r for r in rng.doctor_rows() if r.name == "rng.accelerate-swallowed-restore")
    assert row.present is True, row.detail
    assert row.fixed is None and "compatshim.rng.load" in row.detail
