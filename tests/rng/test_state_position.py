"""``restore(state)`` of one captured state decides rank and world size as ``load`` does.

A state from ``capture()`` records the rank and world size it was captured on. A common
checkpoint keeps rank 0's only (rank 0 alone writes it) and every rank restores from it:
restoring it verbatim everywhere gave every rank rank 0's stream (the same dropout masks),
with ``exact=True`` and no warning. Positions are passed explicitly here; the same decision
inside a real process group is in ``test_distributed.py``.
"""

from __future__ import annotations

import importlib
import json
import warnings
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

pytest.importorskip("torch")

import torch

import compatshim.rng as rng
from tests.rng.workers import draws


def captured_on(rank: int | None, world_size: int | None) -> dict[str, Any]:
    """This process's state, as ``capture()`` records it on ``rank`` of ``world_size``."""
    module = importlib.import_module("compatshim.rng.capture")  # rng.capture is the function
    with mock.patch.object(module, "distributed_position", return_value=(rank, world_size)):
        return rng.capture()


def restore_quietly(state: Any, **kwargs: Any) -> tuple[rng.RestoreReport, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = rng.restore(state, **kwargs)
    return report, [str(w.message) for w in caught if issubclass(w.category, rng.RNGStateWarning)]


def test_rank_0_state_restored_on_rank_1_is_derived_never_replayed() -> None:
    state = captured_on(0, 2)
    rank0, warned0 = restore_quietly(state, rank=0, world_size=2)
    stream0 = draws()
    assert rank0.exact and rank0.saved_rank == 0 and not warned0
    rank1, warned1 = restore_quietly(state, rank=1, world_size=2)
    stream1 = draws()
    assert not rank1.exact and {"python", "numpy", "torch_cpu"} <= set(rank1.derived)
    assert len(warned1) == 1 and "saved rank 0's state; rank 1 derived" in warned1[0]
    assert rank0.summary().startswith("rank 0/2: restored compatshim state of saved rank 0/2")
    assert rank1.summary().startswith("rank 1/2: derived from compatshim state/2")  # "restored"
    assert stream1 != stream0
    restore_quietly(state, rank=1, world_size=2)
    assert draws() == stream1  # derived deterministically from the saved material


def test_another_ranks_state_under_the_error_policy_raises() -> None:
    with pytest.raises(rng.RNGStateError, match="saved rank 1's state and this is rank 0"):
        rng.restore(captured_on(1, 2), rank=0, world_size=2, on_world_size_mismatch="error")


def test_a_state_mixed_from_two_ranks_captures_is_derived_on_both() -> None:
    """Every rank's capture() under one key of a DCP checkpoint: DCP keeps one rank's copy of
    each value, so rank 1 loaded rank 1's meta and python state beside rank 0's numpy and torch
    states, and restored them as its own, exact (rank 0's dropout masks on rank 1)."""
    torch.manual_seed(0)
    zero = captured_on(0, 2)
    torch.manual_seed(1)
    mixed = {**captured_on(1, 2), "numpy": zero["numpy"], "torch_cpu": zero["torch_cpu"]}
    streams = []
    for rank in (0, 1):
        report, warned = restore_quietly(mixed, rank=rank, world_size=2)
        assert not report.exact and report.saved_rank is None
        assert {"python", "numpy", "torch_cpu"} <= set(report.derived)
        assert len(warned) == 1 and "more than one capture()" in warned[0]
        streams.append(draws())
    rng.restore(zero, rank=0, world_size=2)
    assert draws() not in streams and streams[0] != streams[1]
    with pytest.raises(rng.RNGStateError, match=r"more than one capture\(\).*rank 1 \("):
        rng.restore(mixed, rank=1, world_size=2, on_world_size_mismatch="error")


def test_a_state_from_another_world_size_is_a_mismatch() -> None:
    state = captured_on(0, 2)
    with pytest.raises(rng.RNGStateError, match=r"job of 2 rank\(s\).*this job has 4"):
        rng.restore(state, rank=0, world_size=4, on_world_size_mismatch="error")
    report, warned = restore_quietly(state, rank=0, world_size=4)
    assert report.exact and report.saved_world_size == 2  # rank 0's own stream, continued
    assert len(warned) == 1 and "world size changed 2 -> 4" in warned[0]
    report, warned = restore_quietly(
        state, rank=0, world_size=4, on_world_size_mismatch="derive_all"
    )
    assert "torch_cpu" in report.derived and len(warned) == 1


@pytest.mark.parametrize("meta_rank", [None, 5])
def test_a_rank_outside_the_world_size_raises(meta_rank: int | None, tmp_path: Path) -> None:
    state = captured_on(meta_rank, None if meta_rank is None else 8)
    with pytest.raises(rng.RNGStateError, match="rank 5 is outside world size 2"):
        rng.restore(state, rank=5, world_size=2)
    torch.save({"rng": state}, tmp_path / "ckpt.pt")
    with pytest.raises(rng.RNGStateError, match="rank 5 is outside world size 2"):
        rng.load(tmp_path / "ckpt.pt", rank=5, world_size=2)


def quietly(call: Any, target: Any, **kwargs: Any) -> str:
    """What ``call(target, **kwargs)`` decided, or its error: comparable across calls."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            report = call(target, **kwargs)
        except rng.RNGStateError as exc:
            return f"error: {exc}"
    warned = [w for w in caught if issubclass(w.category, rng.RNGStateWarning)]
    picked = {k: v for k, v in vars(report).items() if k not in ("source", "fingerprints")}
    return json.dumps({**picked, "warnings": len(warned)}, default=str)


@pytest.mark.parametrize("saved", [(None, None), (0, 1), (0, 2), (1, 2), (3, 4)])
@pytest.mark.parametrize("policy", ["derive", "derive_all", "error"])
def test_restore_of_a_state_and_load_of_a_checkpoint_holding_it_decide_alike(
    saved: tuple[int | None, int | None], policy: str, tmp_path: Path
) -> None:
    state = captured_on(*saved)
    path = tmp_path / "ckpt.pt"
    torch.save({"step": 10, "rng": state}, path)
    for rank, world_size in [(0, 1), (0, 2), (1, 2), (3, 4), (2, 3)]:
        position = {"rank": rank, "world_size": world_size, "on_world_size_mismatch": policy}
        assert quietly(rng.restore, state, **position) == quietly(rng.load, path, **position)
