"""compatshim.rng: capture at world size N, restore at M, for N, M in {1, 7, 8, 32, 1024}.

Up to 32 ranks: thread ranks of a threaded group save through the real
``save`` (gather to rank 0, one file) and restore through ``load`` with real
generators; the generators are process-global, so each rank seeds, captures,
restores and draws while holding :data:`GLOBAL_LOCK`. 1024 ranks: this process
plays sampled ranks of a fake world (real generators, real ``restore``, rank
and world size from torch.distributed), and planning covers every rank.

What the design promises (``compatshim.rng`` docstring): a rank present in
the save continues its saved stream bit for bit (checked against an
uninterrupted run: seeded, then drawn with no save/restore between); any
other rank gets a deterministic stream derived from the saved material and
its rank number, never a saved rank's stream nor another derived rank's.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, Iterator

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

from compatshim import rng  # noqa: E402
from compatshim.rng.restore import Environment, build_plan  # noqa: E402
from compatshim.rng.state import make_file, parse_file  # noqa: E402
from tests.scale.worlds import GLOBAL_LOCK, fake_world, run_threaded  # noqa: E402

THREADED = (1, 7, 8, 32)
BIG = 1024
PARTS = {"python", "numpy", "torch_cpu"}
Draws = tuple[tuple[float, ...], ...]


def _seed(rank: int) -> None:
    random.seed(1000 + rank)
    np.random.seed(1000 + rank)
    torch.manual_seed(1000 + rank)


def _draws() -> Draws:
    return (
        tuple(random.random() for _ in range(3)),
        tuple(float(x) for x in np.random.random(3)),
        tuple(float(x) for x in torch.rand(3)),
    )


def _uninterrupted(rank: int) -> Draws:
    """What rank ``rank`` draws right after its state was captured, had it just gone on."""
    with GLOBAL_LOCK:
        _seed(rank)
        return _draws()


@pytest.fixture(autouse=True)
def _generators_put_back() -> Iterator[None]:
    saved = rng.capture()
    yield
    rng.restore(saved, warn=False)


def _save_rank(rank: int, world_size: int, path: str) -> int | None:
    with GLOBAL_LOCK:
        _seed(rank)
        state = rng.capture()
    rng.save(path, state=state)  # collective: gather to rank 0, one file, barrier
    meta_rank: int | None = state["meta"]["rank"]
    return meta_rank


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """One file per N in THREADED, written by N thread ranks through ``rng.save``."""
    files = {}
    for world in THREADED:
        path = tmp_path_factory.mktemp("rng") / f"rng_{world}.pt"
        assert run_threaded(_save_rank, world, args=(str(path),), timeout=60) == list(range(world))
        found = parse_file(rng.read(path))
        assert found.world_size == world and len(found.ranks) == world
        assert [p.meta["rank"] for p in found.ranks] == list(range(world))
        files[world] = path
    return files


def _load_rank(rank: int, world_size: int, path: str) -> tuple[Any, Draws, Draws]:
    with GLOBAL_LOCK:
        report = rng.load(path, warn=False)  # rank and world size from the threaded group
        first = _draws()
        rng.load(path, warn=False)
        again = _draws()
    return report, first, again


def _check_world(saved_world: int, world: int, outcomes: list[tuple[Any, Draws, Draws]]) -> None:
    saved_streams = {_uninterrupted(r) for r in range(saved_world)}
    for rank, (report, first, again) in enumerate(outcomes):
        assert (report.rank, report.world_size) == (rank, world)
        assert first == again, f"rank {rank}: the same file gave two different streams"
        if rank < saved_world:
            assert report.saved_rank == rank and set(report.restored) >= PARTS, report
            assert first == _uninterrupted(rank), f"rank {rank} did not continue its stream"
        else:
            assert report.saved_rank is None and set(report.derived) >= PARTS, report
            assert first not in saved_streams, f"rank {rank} replays a saved rank's stream"
        assert report.exact == (rank < saved_world), report  # nothing derived or skipped
        assert bool(report.notes) == (saved_world != world), report  # the resize is named
    firsts = [first for _, first, _ in outcomes]
    assert len(set(firsts)) == world, "two ranks got the same stream"


@pytest.mark.timeout(240)
@pytest.mark.parametrize("world", THREADED)
def test_threaded_restore_at_m_from_every_n(saved: dict[int, Path], world: int) -> None:
    for saved_world in THREADED:
        outcomes = run_threaded(_load_rank, world, args=(str(saved[saved_world]),), timeout=60)
        _check_world(saved_world, world, outcomes)


def _capture_big() -> dict[str, Any]:
    """Every rank of a 1024-rank job captured where it runs: rank r of a fake world."""
    states = []
    for rank in range(BIG):
        with fake_world(BIG, rank):
            _seed(rank)
            states.append(rng.capture())
    assert states[6]["meta"]["rank"] == 6 and states[6]["meta"]["world_size"] == BIG
    return make_file(states, source="compatshim", world_size=BIG)


@pytest.fixture(scope="module")
def big_file(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    path = tmp_path_factory.mktemp("rng") / "rng_1024.pt"
    torch.save(_capture_big(), path)
    return rng.read(path)  # the safe reader, as ``load`` uses it


def _restore_as(rank: int, world: int, state: Any) -> tuple[Any, Draws]:
    if world == 1:
        report = rng.restore(state, warn=False)
    else:
        with fake_world(world, rank):
            report = rng.restore(state, warn=False)  # rank and world size from the fake group
    return report, _draws()


def _sample(world: int) -> list[int]:
    return sorted({0, 6, 7, 31, 32, world - 1} & set(range(world)))


@pytest.mark.timeout(240)
@pytest.mark.parametrize("world", (*THREADED, BIG))
def test_saved_at_1024_restored_at_m(big_file: dict[str, Any], world: int) -> None:
    for rank in _sample(world):
        report, first = _restore_as(rank, world, big_file)
        assert (report.rank, report.world_size, report.saved_rank) == (rank, world, rank)
        assert set(report.restored) >= PARTS and not report.derived, report
        assert first == _uninterrupted(rank), f"rank {rank}/{world} did not continue its stream"
        assert report.exact and bool(report.notes) == (world != BIG), report


@pytest.mark.timeout(240)
@pytest.mark.parametrize("saved_world", THREADED)
def test_saved_at_n_restored_at_1024(saved: dict[int, Path], saved_world: int) -> None:
    file = rng.read(saved[saved_world])
    # every rank of the new world: planned (pure), no stream twice, saved ranks their own
    # (every rank for one file: each plan re-reads every saved state, ~9 ms for 8 of them)
    ranks = range(BIG) if saved_world == 8 else _sample(BIG)
    saved_cpu = {bytes(p.torch_cpu.numpy()) for p in parse_file(file).ranks}
    seen: set[bytes] = set()
    for rank in ranks:
        plan = build_plan(file, Environment(rank=rank, world_size=BIG, numpy=True))
        cpu = bytes(dict(plan.writes)["torch_cpu"].numpy())
        assert cpu not in seen, f"rank {rank} got another rank's torch stream"
        seen.add(cpu)
        assert (cpu in saved_cpu) == (rank < saved_world), rank
    # sampled ranks for real: this process as rank r of a fake 1024-rank world; a derived
    # stream depends on the file and the rank only, so ranks < 32 match a 32-thread world's
    threaded = run_threaded(_load_rank, 32, args=(str(saved[saved_world]),), timeout=60)
    for rank in _sample(BIG):
        report, first = _restore_as(rank, BIG, file)
        if rank < saved_world:
            assert report.saved_rank == rank and first == _uninterrupted(rank)
        else:
            assert report.saved_rank is None and set(report.derived) >= PARTS, report
        if rank < 32:
            assert first == threaded[rank][1], f"rank {rank}: another stream at world size 1024"
