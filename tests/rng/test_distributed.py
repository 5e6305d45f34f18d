"""3 real gloo ranks save; resume under 3, 2 and 4 ranks (each rank a real process).

Four ``run_ranks`` calls in all (12 processes): the machine has 2 cores, so
policies are compared inside one resume run rather than in one run each.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from tests.harness.dist import run_ranks
from tests.rng.workers import (
    dcp_capture_round_trip,
    load_once,
    load_then_draw,
    restore_rank_0_checkpoint,
    save_then_draw,
    save_to_a_path_per_rank,
    save_where_rank_0_cannot_write,
)

pytestmark = pytest.mark.dist
TIMEOUT = 240.0
Saved = tuple[Path, list[dict[str, Any]]]


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Saved:
    path = tmp_path_factory.mktemp("rng") / "rng.pt"
    continuation = run_ranks(save_then_draw, 3, args=(str(path),), timeout=TIMEOUT)
    return path, continuation


def resume(path: Path, world_size: int, *policies: str) -> list[list[dict[str, Any]]]:
    return run_ranks(load_then_draw, world_size, args=(str(path), list(policies)), timeout=TIMEOUT)


def test_same_world_size_is_bit_identical(saved: Saved) -> None:
    path, continuation = saved
    for rank, (result,) in enumerate(resume(path, 3, "derive")):
        assert result["draws"] == continuation[rank]
        assert result["exact"] and result["saved_rank"] == rank and not result["warnings"]


def test_two_ranks_under_each_policy(saved: Saved) -> None:
    path, continuation = saved
    results = resume(path, 2, "derive", "derive_all", "error")
    fresh = []
    for rank, (derive, derive_all, error) in enumerate(results):
        assert derive["draws"] == continuation[rank]  # rank r exists in the file: exact
        assert len(derive["warnings"]) == 1 and "world size changed 3 -> 2" in derive["warnings"][0]
        assert derive_all["saved_rank"] is None and "torch_cpu" in derive_all["derived"]
        fresh.append(json.dumps(derive_all["draws"]))
        assert "3 rank(s) but the job has 2" in error["error"]
    assert len(set(fresh)) == 2
    assert not set(fresh) & {json.dumps(c) for c in continuation}


def test_four_ranks_deterministic_and_uncorrelated(saved: Saved) -> None:
    path, continuation = saved
    results = [r for (r,) in resume(path, 4, "derive")]
    for rank in range(3):
        assert results[rank]["draws"] == continuation[rank]
    assert results[3]["saved_rank"] is None and "torch_cpu" in results[3]["derived"]
    assert all(len(r["warnings"]) == 1 for r in results)
    streams = {json.dumps(r["draws"]) for r in results} | {json.dumps(c) for c in continuation}
    assert len(streams) == 4  # the derived rank replays none of the saved ranks
    # A second, separate run (this process) derives the same state for rank 3.
    again = load_once(str(path), "derive", rank=3, world_size=4)
    assert again["draws"] == results[3]["draws"]


def test_a_save_rank_0_cannot_write_fails_on_every_rank(tmp_path: Path) -> None:
    """Rank 0 writes the file; where it cannot, the other ranks waited at a barrier until the
    process group's timeout (30 min by default). Each rank now raises, naming rank 0's error."""
    results = run_ranks(
        save_where_rank_0_cannot_write, 2, args=(str(tmp_path),), timeout=60, expect_failure=True
    )
    (kind0, first), (kind1, second) = results
    assert (kind0, kind1) == ("ok", "ok"), results  # each rank returned its error, none hung
    assert first["type"] == "FileNotFoundError" and "no folder" in first["error"], first
    assert second["type"] == "RNGStateError", second
    assert "rank 0 could not write" in second["error"] and "no folder" in second["error"]


def test_ranks_saving_to_different_paths_are_told_before_anything_is_written(
    tmp_path: Path,
) -> None:
    """save(f"rng_{rank}.pt"): rank 0 wrote every rank's state into rng_0.pt and rank 1 returned
    as if rng_1.pt were written; the resume then failed on rank 1, missing its file."""
    results = run_ranks(
        save_to_a_path_per_rank, 2, args=(str(tmp_path),), timeout=60, expect_failure=True
    )
    assert [kind for kind, _ in results] == ["ok", "ok"], results  # none hung
    for _, result in results:
        assert result["type"] == "RNGStateError", result
        assert "ranks passed different paths" in result["error"], result
        assert "rank 0: " in result["error"] and "rng_1.pt" in result["error"], result
        assert result["files"] == [], result


def test_rank_0s_captured_state_is_derived_on_the_other_rank(tmp_path: Path) -> None:
    """Rank 0 alone writes the checkpoint with its capture(); restoring it on rank 1 gave
    rank 1 rank 0's stream (identical dropout masks), reported exact and unwarned."""
    path = tmp_path / "ckpt.pt"
    zero, one = run_ranks(restore_rank_0_checkpoint, 2, args=(str(path),), timeout=TIMEOUT)
    assert zero["exact"] and not zero["warnings"]
    assert not one["exact"] and "torch_cpu" in one["derived"] and len(one["warnings"]) == 1
    assert one["draws"] != zero["draws"]


def test_every_ranks_capture_under_one_dcp_key_is_never_restored_as_another_ranks(
    tmp_path: Path,
) -> None:
    """DCP keeps one rank's copy of each value that every rank saves under one key: rank 1 got
    its own meta and python state beside rank 0's numpy and torch states (torch 2.13) and
    restored them, exact, continuing rank 0's dropout masks."""
    results = run_ranks(dcp_capture_round_trip, 2, args=(str(tmp_path),), timeout=TIMEOUT)
    for result in results:
        assert not result["exact"] or result["draws"] == result["continuation"]
    assert results[0]["draws"] != results[1]["draws"]
