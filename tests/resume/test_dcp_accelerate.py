"""Hardened mode through accelerate's ``merge_fsdp_weights`` (``accelerate merge-weights``):
a genuine DCP folder gives the saved state; a poisoned ``.metadata`` is refused and never runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch.distributed.checkpoint")
pytest.importorskip("accelerate")

from tests.checkpoint.dcp_kit import digest, poison_metadata, run_hardened, save, state

pytestmark = pytest.mark.timeout(700)


def test_hardened_accelerate_genuine_equal_poisoned_refused(
    tmp_path: Path,
) -> None:
    genuine = tmp_path / "genuine"
    save(genuine, state())
    result = run_hardened(tmp_path, "accelerate", genuine, tmp_path / "out")
    assert result["ok"], result
    assert result["values"] == json.loads(json.dumps(digest(state())))
    marker = tmp_path / "ran"
    poison_metadata(genuine, tmp_path / "bad", marker)
    result = run_hardened(tmp_path, "accelerate", tmp_path / "bad", tmp_path / "out")
    assert not marker.exists()
    assert not result["ok"] and "system refused" in result["error"], result
