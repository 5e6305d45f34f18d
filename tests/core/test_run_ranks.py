"""The test harness's ranks: forked from a zygote, they see what fresh ranks see, and nothing
outlives a call (tests.harness.dist.run_ranks)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("torch.distributed")

from tests.core import run_ranks_workers as workers
from tests.harness.dist import RanksFailed, run_ranks

pytestmark = pytest.mark.dist
# set by the harness for each call and rank
PER_CALL = {"MASTER_PORT", "PYTEST_CURRENT_TEST", "RANK", "LOCAL_RANK", "WORLD_SIZE"}


def test_forked_ranks_see_what_fresh_ranks_see(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The caller's environment (as changed by the test), the call's ``env``, directory, path."""
    monkeypatch.setenv("RUN_RANKS_PROBE", "from the test")
    monkeypatch.chdir(tmp_path)
    env = {"RUN_RANKS_EXTRA": "from the call"}
    forked = run_ranks(workers.describe, 2, env=env, timeout=60)
    (fresh,) = run_ranks(workers.describe, 1, env=env, timeout=120, fresh=True)  # one: slow
    assert fresh["ppid"] == os.getpid() and fresh["group"] == (0, 1)
    same = lambda env: {k: v for k, v in env.items() if k not in PER_CALL}  # noqa: E731
    for rank, mine in enumerate(forked):
        assert mine["group"] == (rank, 2) and mine["sum"] == 1.0
        assert mine["env"]["RUN_RANKS_PROBE"] == "from the test"
        assert mine["env"]["RUN_RANKS_EXTRA"] == "from the call"
        assert mine["env"]["RANK"] == str(rank) and mine["env"]["WORLD_SIZE"] == "2"
        assert "test_forked_ranks_see_what_fresh_ranks_see" in mine["env"]["PYTEST_CURRENT_TEST"]
        assert same(mine["env"]) == same(fresh["env"])
        assert mine["cwd"] == fresh["cwd"] == str(tmp_path)
        assert mine["path"] == fresh["path"]
    assert len({r["ppid"] for r in forked}) == 1 and forked[0]["ppid"] != os.getpid()


def test_calls_with_the_same_environment_share_one_zygote() -> None:
    first = run_ranks(workers.describe, 2, timeout=60)
    second = run_ranks(workers.describe, 2, timeout=60)
    assert len({r["ppid"] for r in first + second}) == 1


def test_a_stuck_rank_is_named_and_killed(tmp_path: Path) -> None:
    with pytest.raises(RanksFailed, match=r"^rank 1: timeout: still running after 5s$"):
        run_ranks(workers.rank_one_hangs, 2, args=(str(tmp_path),), init=False, timeout=5)
    pid = int((tmp_path / "pid").read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert run_ranks(workers.rank_one_hangs, 1, args=(str(tmp_path),), init=False) == [0]


def test_rank_output_reaches_the_calling_test(capfd: pytest.CaptureFixture[str]) -> None:
    run_ranks(workers.speak, 2, init=False, timeout=60)
    out, err = capfd.readouterr()
    assert "rank 0 says hello" in out and "rank 1 says hello" in out
    assert "rank 0 complains" in err and "rank 1 complains" in err


def test_exit_handlers_run_in_forked_ranks(tmp_path: Path) -> None:
    run_ranks(workers.exit_handler_writes, 2, args=(str(tmp_path),), init=False, timeout=60)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exit0", "exit1"]


def test_a_result_that_cannot_pickle_is_the_rank_error() -> None:
    with pytest.raises(RanksFailed, match=r"rank 0: error: .*(pickle|lambda)"):
        run_ranks(workers.unpicklable_result, 1, timeout=60)


def test_global_generators_differ_between_ranks_and_calls() -> None:
    """Like fresh interpreters: nothing drawn in one rank repeats in another (seeded at start)."""
    pytest.importorskip("numpy")
    first = run_ranks(workers.draws, 2, init=False, timeout=60)
    second = run_ranks(workers.draws, 2, init=False, timeout=60)
    numpy_draws = [d[0] for d in first + second]
    python_draws = [d[1] for d in first + second]
    assert len(set(numpy_draws)) == len(set(python_draws)) == 4, (first, second)
