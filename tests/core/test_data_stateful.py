"""compatshim.data with torchdata's StatefulDataLoader (issue 39 item 2): one process, a real
StatefulDataLoader per simulated rank (DistributedSampler takes ``num_replicas`` and ``rank``).

A StatefulDataLoader keeps its own per-rank state (``state_dict()``: the sampler's iterator,
a RandomSampler's generator, each worker's dataset state), so its position holds that state
and is resumed by ``load_state_dict`` at the saving world size and rank; at another world size
only a plain ``DistributedSampler`` over a dataset without state of its own is dealt again,
anything else is refused with ``DataPositionError``.
"""

from __future__ import annotations

import copy
import itertools
from typing import Any

import pytest

torch = pytest.importorskip("torch")
stateful_dataloader = pytest.importorskip(
    "torchdata.stateful_dataloader", reason="torchdata (StatefulDataLoader) is not installed"
)

from torch.utils.data import DistributedSampler, IterableDataset, TensorDataset  # noqa: E402

import compatshim.data as cd  # noqa: E402
from compatshim.data import DataPositionError  # noqa: E402
from tests.core.test_data_position import Buckets  # noqa: E402

StatefulDataLoader = stateful_dataloader.StatefulDataLoader
pytestmark = pytest.mark.timeout(120)
EPOCH = 2


def samples(batches: Any) -> list[int]:
    return [int(i) for batch in batches for i in batch[0].reshape(-1).tolist()]


def shuffled(length: int = 30, workers: int = 0, seed: int = 5) -> Any:
    """``shuffle=True``: torchdata's own RandomSampler, seeded by the loader's generator."""
    return StatefulDataLoader(
        TensorDataset(torch.arange(length)),
        batch_size=4,
        shuffle=True,
        num_workers=workers,
        generator=torch.Generator().manual_seed(seed),
    )


def distributed(length: int, world_size: int, rank: int, batch_size: int = 3) -> Any:
    data = TensorDataset(torch.arange(length))
    sampler = DistributedSampler(data, num_replicas=world_size, rank=rank, seed=7)
    sampler.set_epoch(EPOCH)
    return StatefulDataLoader(data, batch_size=batch_size, sampler=sampler)


def taken(load: Any, count: int) -> tuple[list[list[int]], Any]:
    """``count`` batches of ``load``'s pass, and its iterator (kept open, as in training)."""
    it = iter(load)
    return [b[0].tolist() for b in itertools.islice(it, count)], it


# -- the same world size: the same samples in the same order ---------------------------------


@pytest.mark.parametrize("workers", [0, 2])
def test_a_shuffled_loader_resumes_its_own_order(workers: int) -> None:
    """shuffle=True, which a plain DataLoader's position refuses: the loader's state replays it."""
    uninterrupted = [b[0].tolist() for b in shuffled(workers=workers)]
    load = shuffled(workers=workers)
    before, _ = taken(load, 3)
    state = cd.position(load, epoch=0, batches=3)
    assert before == uninterrupted[:3]
    rng = torch.get_rng_state()
    rest = cd.resume(shuffled(workers=workers, seed=99), state)  # another run's generator
    assert torch.equal(torch.get_rng_state(), rng)  # building the iterator drew nothing
    assert [b[0].tolist() for b in rest] == uninterrupted[3:]
    assert rest.same_order and rest.skipped == 3


@pytest.mark.parametrize("seed", [5, 99])
def test_a_shuffled_loader_with_workers_shuffles_the_next_passes_as_before(seed: int) -> None:
    """The loader's generator is its RandomSampler's, set from the state when the iterator is
    built: resume put it back as it was, so the passes after the resumed one were shuffled
    otherwise than the uninterrupted run's (plain load_state_dict + iter kept them)."""
    load = shuffled(workers=2)
    uninterrupted = [[b[0].tolist() for b in load] for _ in range(3)]
    load = shuffled(workers=2)
    [b[0].tolist() for b in load]  # the first pass
    _, _open = taken(load, 3)  # the pass's iterator, kept open as in training
    state = cd.position(load, epoch=1, batches=3)
    resumed = shuffled(workers=2, seed=seed)
    rest = [b[0].tolist() for b in cd.resume(resumed, state)]
    assert rest == uninterrupted[1][3:]
    assert [b[0].tolist() for b in resumed] == uninterrupted[2]


@pytest.mark.parametrize(("workers", "seed"), [(2, 5), (2, None), (0, None)])
def test_a_finished_shuffled_pass_carries_the_generator_to_the_next_passes(
    workers: int, seed: int | None
) -> None:
    """docs/resume.md said torchdata does not carry a finished pass's RandomSampler
    generator; it does (0.11.0), except with num_workers=0 and the loader's generator (not
    tested here: docs/resume.md says so)."""

    def build(run: int) -> Any:
        torch.manual_seed(run)  # without generator=, torchdata seeds its sampler from torch's
        generator = None if seed is None else torch.Generator().manual_seed(seed + run)
        return StatefulDataLoader(
            TensorDataset(torch.arange(30)),
            batch_size=4,
            shuffle=True,
            num_workers=workers,
            generator=generator,
        )

    load = build(0)
    [b[0].tolist() for b in load]
    state = cd.position(load, epoch=0, batches=len(load))
    uninterrupted = [[b[0].tolist() for b in load] for _ in range(2)]
    resumed = build(1)  # another run's seeds: only the state can give the order
    assert list(cd.resume(resumed, state)) == []
    assert [[b[0].tolist() for b in resumed] for _ in range(2)] == uninterrupted


class Stream(IterableDataset[Any]):
    """An IterableDataset that saves where it is: only the loader's state can resume it."""

    def __init__(self) -> None:
        self.next = 0

    def __iter__(self) -> Any:
        while self.next < 22:
            self.next += 1
            yield (torch.tensor(self.next - 1),)

    def state_dict(self) -> dict[str, int]:
        return {"next": self.next}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.next = state["next"]


def test_an_iterable_dataset_resumes_from_its_own_state() -> None:
    uninterrupted = [b[0].tolist() for b in StatefulDataLoader(Stream(), batch_size=4)]
    load = StatefulDataLoader(Stream(), batch_size=4)
    taken(load, 2)
    state = cd.position(load, epoch=0, batches=2)
    rest = cd.resume(StatefulDataLoader(Stream(), batch_size=4), state)
    assert [b[0].tolist() for b in rest] == uninterrupted[2:]
    assert samples(rest) == []  # finished


def test_each_rank_resumes_its_own_state() -> None:
    for rank in range(2):
        uninterrupted = [b[0].tolist() for b in distributed(25, 2, rank)]
        load = distributed(25, 2, rank)
        taken(load, 2)
        state = cd.position(load, epoch=EPOCH, batches=2)
        assert state["rank"] == rank and state["stateful"] is not None
        rest = cd.resume(distributed(25, 2, rank), state)
        assert [b[0].tolist() for b in rest] == uninterrupted[2:]


def test_a_resumed_pass_saved_again_composes() -> None:
    uninterrupted = [b[0].tolist() for b in shuffled()]
    load = shuffled()
    taken(load, 2)
    again = shuffled(seed=1)
    first = cd.resume(again, cd.position(load, epoch=0, batches=2))
    assert [b[0].tolist() for b in itertools.islice(first, 2)] == uninterrupted[2:4]
    second = cd.position(again, epoch=0, batches=2)  # the batches taken since resume
    assert second["batches"] == 4
    assert [b[0].tolist() for b in cd.resume(shuffled(seed=3), second)] == uninterrupted[4:]


def test_a_finished_pass_resumes_as_finished() -> None:
    """iter() of a loader holding a finished pass's state starts a new pass; under the saved
    epoch's DistributedSampler order that would serve the epoch again."""
    load = distributed(25, 2, 0)
    everything = [b[0].tolist() for b in load]
    state = cd.position(load, epoch=EPOCH, batches=len(everything))
    again = distributed(25, 2, 0)
    rest = cd.resume(again, state)
    assert list(rest) == [] and len(rest) == 0
    again.sampler.set_epoch(EPOCH + 1)
    load.sampler.set_epoch(EPOCH + 1)
    assert [b[0].tolist() for b in again] == [b[0].tolist() for b in load]  # the next pass


def test_a_count_the_loader_did_not_yield_is_refused() -> None:
    load = shuffled()
    taken(load, 3)
    with pytest.raises(DataPositionError, match="batches=2, but the StatefulDataLoader yielded 3"):
        cd.position(load, epoch=0, batches=2)


# -- another rank or world size: per-rank state is never replayed elsewhere -------------------


def test_another_ranks_state_is_refused() -> None:
    load = distributed(25, 2, 0)
    taken(load, 2)
    state = cd.position(load, epoch=EPOCH, batches=2)
    with pytest.raises(DataPositionError, match="saved by rank 0 of 2; this is rank 1"):
        cd.resume(distributed(25, 2, 1), state)


def test_a_shuffled_loader_at_another_world_size_is_refused() -> None:
    load = shuffled()
    taken(load, 1)
    state = {**cd.position(load, epoch=0, batches=1), "world_size": 2}
    with pytest.raises(DataPositionError, match="per rank"):
        cd.resume(shuffled(), state)


def test_a_distributed_sampler_is_dealt_again_at_another_world_size() -> None:
    """torch's DistributedSampler over a dataset without state: the plain position's re-deal."""
    consumed: list[int] = []
    for rank in range(2):
        load = distributed(25, 2, rank)
        before, _ = taken(load, 2)
        consumed += [i for batch in before for i in batch]
        state = cd.position(load, epoch=EPOCH, batches=2)
    rest = [cd.resume(distributed(25, 3, rank), state) for rank in range(3)]
    assert not any(r.same_order for r in rest)
    served = [i for r in rest for i in samples(r)]
    repeated = list(rest[0].repeated)
    assert sorted(consumed + served) == sorted([*range(25), *repeated])


class Counted(TensorDataset):
    """A map-style dataset with state of its own: the loader's state holds it."""

    def state_dict(self) -> dict[str, int]:
        return {"seen": 1}

    def load_state_dict(self, state: dict[str, int]) -> None:
        pass


def test_a_stateful_dataset_at_another_world_size_is_refused() -> None:
    data = Counted(torch.arange(20))
    sampler = DistributedSampler(data, num_replicas=2, rank=0, seed=7)
    load = StatefulDataLoader(data, batch_size=2, sampler=sampler)
    taken(load, 1)
    state = cd.position(load, epoch=0, batches=1)
    other = StatefulDataLoader(
        data, batch_size=2, sampler=DistributedSampler(data, num_replicas=3, rank=0, seed=7)
    )
    with pytest.raises(DataPositionError, match="dataset's own state"):
        cd.resume(other, state)


# -- another number of workers: torchdata loads a state only into as many ---------------------


@pytest.mark.parametrize(("saved_with", "resumed_with"), [(0, 2), (2, 0)])
def test_another_number_of_workers_walks_the_samplers_order(
    saved_with: int, resumed_with: int
) -> None:
    """torchdata asserts (AssertionError from iter) that its state loads into as many workers;
    a sampler that replays its order is walked instead: the same batches, and it composes."""

    def build(workers: int, epoch: int = EPOCH) -> Any:
        data = TensorDataset(torch.arange(25))
        sampler = DistributedSampler(data, num_replicas=1, rank=0, seed=7)
        sampler.set_epoch(epoch)
        return StatefulDataLoader(data, batch_size=3, sampler=sampler, num_workers=workers)

    uninterrupted = [b[0].tolist() for b in build(0)]
    load = build(saved_with)
    taken(load, 3)
    state = cd.position(load, epoch=EPOCH, batches=3)
    again = build(resumed_with, epoch=0)
    rest = cd.resume(again, state)
    assert again.sampler.epoch == EPOCH and rest.same_order and rest.skipped == 3
    assert [b[0].tolist() for b in itertools.islice(rest, 2)] == uninterrupted[3:5]
    second = cd.position(again, epoch=EPOCH, batches=2)  # the pass resume built, saved again
    assert second["batches"] == 5 and second["stateful"] is None
    rest = cd.resume(build(saved_with, epoch=0), second)
    assert [b[0].tolist() for b in rest] == uninterrupted[5:]


def test_an_order_only_the_state_replays_at_another_number_of_workers_is_refused() -> None:
    load = shuffled()
    taken(load, 1)
    state = cd.position(load, epoch=0, batches=1)
    with pytest.raises(
        DataPositionError, match="num_workers=2, the position's num_workers=0: torchdata"
    ):
        cd.resume(shuffled(workers=2), state)


def test_a_refused_stateful_resume_leaves_the_sampler_as_it_was() -> None:
    """Each refusal comes before set_epoch: DataPositionError says nothing was changed."""
    data = Counted(torch.arange(20))
    load = StatefulDataLoader(data, batch_size=2, sampler=DistributedSampler(data, 1, 0, seed=7))
    load.sampler.set_epoch(EPOCH)
    taken(load, 1)
    state = cd.position(load, epoch=EPOCH, batches=1)
    cases = [
        (state, 1, 2, 7, "dataset's own state, which torchdata keeps per worker"),
        ({**state, "stateful": {"bogus": 1}}, 1, 0, 7, r"state\['stateful'\]: not a"),
        (state, 3, 0, 7, "dataset's own state, which is per rank"),
    ]
    for position, world_size, workers, seed, match in cases:
        sampler = DistributedSampler(data, num_replicas=world_size, rank=0, seed=seed)
        again = StatefulDataLoader(data, batch_size=2, sampler=sampler, num_workers=workers)
        with pytest.raises(DataPositionError, match=match):
            cd.resume(again, position)
        assert sampler.epoch == 0 and again.next_iter_state is None
    # another world size, dealt again from the fields: the seed is checked before set_epoch
    load = distributed(25, 2, 0)
    taken(load, 1)
    state = cd.position(load, epoch=EPOCH, batches=1)
    data = TensorDataset(torch.arange(25))
    sampler = DistributedSampler(data, num_replicas=3, rank=0, seed=8)
    with pytest.raises(DataPositionError, match="seed=8, shuffle=True; the position's seed=7"):
        cd.resume(StatefulDataLoader(data, batch_size=3, sampler=sampler), state)
    assert sampler.epoch == 0


# -- found by an audit as a user would (2026-12-04): each failed before its fix ----------------


def test_the_rest_has_the_length_it_yields() -> None:
    load = distributed(24, 1, 0, batch_size=2)
    taken(load, 4)
    rest = cd.resume(distributed(24, 1, 0, batch_size=2), cd.position(load, epoch=EPOCH, batches=4))
    assert len(rest) == 8 == len(list(rest))


@pytest.mark.parametrize(
    ("length", "seed", "shuffle", "match"),
    [
        (26, 7, True, "its dataset has 26 samples, the position's 24"),
        (24, 8, True, "seed=8, shuffle=True; the position's seed=7"),
        (24, 7, False, "seed=7, shuffle=False; the position's seed=7, shuffle=True"),
    ],
)
def test_another_order_at_the_same_world_size_is_refused(
    length: int, seed: int, shuffle: bool, match: str
) -> None:
    """As for a plain DataLoader: the loader's state would replay the saved sampler's iterator
    over another order, silently."""
    load = distributed(24, 1, 0, batch_size=2)
    taken(load, 2)
    state = cd.position(load, epoch=EPOCH, batches=2)
    data = TensorDataset(torch.arange(length))
    sampler = DistributedSampler(data, num_replicas=1, rank=0, seed=seed, shuffle=shuffle)
    again = StatefulDataLoader(data, batch_size=2, sampler=sampler)
    with pytest.raises(DataPositionError, match=match):
        cd.resume(again, state)
    assert sampler.epoch == 0 and again.next_iter_state is None


def test_a_state_torchdata_cannot_load_is_refused_and_changes_nothing() -> None:
    load = distributed(24, 1, 0, batch_size=2)
    taken(load, 2)
    state = cd.position(load, epoch=EPOCH, batches=2)
    again = distributed(24, 1, 0, batch_size=2)
    again.sampler.set_epoch(0)
    broken = {k: v for k, v in state["stateful"].items() if k != "_shared_seed"}
    with pytest.raises(DataPositionError, match=r"state\['stateful'\]: torchdata could not load"):
        cd.resume(again, {**state, "stateful": broken})
    assert again.sampler.epoch == 0 and again.next_iter_state is None


def test_a_count_before_the_step_says_to_save_after_it() -> None:
    load = distributed(24, 1, 0, batch_size=2)
    for count, _batch in enumerate(load):
        if count == 3:
            with pytest.raises(DataPositionError, match="save after the training step"):
                cd.position(load, epoch=EPOCH, batches=count)
            break


def test_a_batch_sampler_over_a_distributed_sampler_gets_the_epoch() -> None:
    """As for a DataLoader: the loader's state replays the batch sampler, whose order is the
    epoch of the DistributedSampler it holds as ``.sampler``."""

    def build() -> tuple[Any, Any]:
        data = TensorDataset(torch.arange(12))
        sampler = DistributedSampler(data, num_replicas=1, rank=0, seed=0)
        return sampler, StatefulDataLoader(data, batch_sampler=Buckets(sampler))

    sampler, load = build()
    sampler.set_epoch(1)
    uninterrupted = [b[0].tolist() for b in load]
    before, _ = taken(load, 2)
    state = cd.position(load, epoch=1, batches=2)
    sampler, load = build()
    rest = cd.resume(load, state)
    assert sampler.epoch == 1
    assert before + [b[0].tolist() for b in rest] == uninterrupted


# -- found by an attacker audit (auditB): each failed before its fix ---------------------------


def _forty(workers: int, epoch: int) -> Any:
    """The audit's loader: 40 samples, batches of 4, a DistributedSampler on one rank."""
    data = TensorDataset(torch.arange(40))
    sampler = DistributedSampler(data, 1, 0, seed=1)
    sampler.set_epoch(epoch)
    return StatefulDataLoader(data, batch_size=4, sampler=sampler, num_workers=workers)


def _saved_mid_epoch(workers: int) -> dict[str, Any]:
    load = _forty(workers, 1)
    taken(load, 3)
    return cd.position(load, epoch=1, batches=3)


def _lie(state: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    """``state`` with the loader state's entry at ``path`` (under a worker snapshot's main
    state where there is one) set to ``value``."""
    lied = copy.deepcopy(state)
    inner = lied["stateful"]
    if "_snapshot" in inner and path[0] not in ("_iterator_finished", "_steps_since_snapshot"):
        inner = inner["_snapshot"]
        if path[0] != "_snapshot_step" and path[0] != "_last_yielded_worker_id":
            inner = inner["_main_snapshot"]
    for key in path[:-1]:
        inner = inner[key]
    inner[path[-1]] = value
    return lied


_LIES = [
    (("_iterator_finished",), "no", "_iterator_finished'\\]: expected True or False, got 'no'"),
    (("_iterator_finished",), True, "_iterator_finished'\\]=True, but state\\['batches'\\]=3"),
    (("_sampler_iter_state",), None, "_sampler_iter_state'\\]: expected torchdata's BatchSampler"),
    (("_sampler_iter_state", "samples_yielded"), -5, "samples_yielded'\\]: expected an int >= 0"),
    (("_sampler_iter_state", "samples_yielded"), 10**30, "samples_yielded'\\]=1000000000000"),
    (("_sampler_iter_state", "samples_yielded"), 4, "samples_yielded'\\]=4, but 3 batches"),
    (("_sampler_iter_yielded",), None, "_sampler_iter_yielded'\\]: expected an int >= 0, got None"),
    (("_sampler_iter_yielded",), 1, "_sampler_iter_yielded'\\]=1, but"),
]


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize(
    ("path", "value", "match"), _LIES, ids=[f"{p[-1]}={v!r}" for p, v, _ in _LIES]
)
def test_a_loader_state_that_lies_is_refused_and_changes_nothing(
    workers: int, path: tuple[str, ...], value: Any, match: str
) -> None:
    """``_iterator_finished='no'``, ``_sampler_iter_state=None`` or ``samples_yielded=-5``
    served the whole epoch again (and a wrong ``len``); ``samples_yielded=10**30`` let a bare
    StopIteration out of resume() after set_epoch; ``_sampler_iter_yielded=None`` a TypeError
    at the first batch. Each is refused before any change, naming the entry."""
    state = _saved_mid_epoch(workers)
    again = _forty(workers, 7)
    with pytest.raises(DataPositionError, match=match):
        cd.resume(again, _lie(state, path, value))
    assert again.sampler.epoch == 7 and again.next_iter_state is None


@pytest.mark.parametrize(
    ("path", "value", "match"),
    [
        (("_num_yielded",), 2, "_num_yielded'\\]=2, but state\\['batches'\\]=3"),
        (("_num_yielded",), -1, "_num_yielded'\\]: expected an int >= 0, got -1"),
    ],
)
def test_a_loader_state_counting_other_batches_is_refused(
    path: tuple[str, ...], value: Any, match: str
) -> None:
    state = _saved_mid_epoch(0)
    again = _forty(0, 7)
    with pytest.raises(DataPositionError, match=match):
        cd.resume(again, _lie(state, path, value))
    assert again.sampler.epoch == 7 and again.next_iter_state is None


@pytest.mark.parametrize(
    ("path", "value", "match"),
    [
        (("_steps_since_snapshot",), 10**6, "_steps_since_snapshot'\\]=1000000"),
        (("_snapshot_step",), -1, "_snapshot_step'\\]: expected an int >= 0, got -1"),
        (("_last_yielded_worker_id",), 10**9, "_last_yielded_worker_id'\\]: expected an int"),
    ],
)
def test_a_worker_snapshot_that_lies_is_refused(
    path: tuple[str, ...], value: Any, match: str
) -> None:
    """torchdata steps its iterator ``_steps_since_snapshot`` times and its worker cycle
    ``_last_yielded_worker_id + 1`` times: a huge one ran the epoch out, or for ever."""
    state = _saved_mid_epoch(2)
    again = _forty(2, 7)
    with pytest.raises(DataPositionError, match=match):
        cd.resume(again, _lie(state, path, value))
    assert again.sampler.epoch == 7 and again.next_iter_state is None


def test_a_shuffled_state_of_another_dataset_length_is_refused() -> None:
    """The RandomSampler's generator replays a permutation of the dataset it is given: 31
    samples where 30 were saved is another order, silently."""
    load = shuffled(30)
    taken(load, 2)
    state = cd.position(load, epoch=0, batches=2)
    with pytest.raises(DataPositionError, match="its dataset has 31 samples, the position's 30"):
        cd.resume(shuffled(31), state)


def test_a_shuffled_state_whose_sampler_count_lies_is_refused() -> None:
    """torchdata's RandomSampler replays from its own ``yielded``: 0 served the epoch again."""
    load = shuffled()
    taken(load, 2)
    state = cd.position(load, epoch=0, batches=2)
    lied = _lie(state, ("_sampler_iter_state", "sampler_iter_state", "yielded"), 0)
    with pytest.raises(DataPositionError, match="\\['yielded'\\]=0, but"):
        cd.resume(shuffled(seed=3), lied)


def _builds() -> list[tuple[str, Any]]:
    data = TensorDataset(torch.arange(23))

    def dist(**kw: Any) -> Any:
        def build() -> Any:
            sampler = DistributedSampler(data, num_replicas=2, rank=1, seed=7)
            sampler.set_epoch(EPOCH)
            return StatefulDataLoader(data, sampler=sampler, **kw)

        return build

    def plain(**kw: Any) -> Any:
        return lambda: StatefulDataLoader(data, generator=torch.Generator().manual_seed(5), **kw)

    return [
        ("dist", dist(batch_size=3)),
        ("dist-drop-last", dist(batch_size=3, drop_last=True)),
        ("dist-no-batch", dist(batch_size=None)),
        ("dist-buckets", lambda: _buckets(data)),
        ("sequential", plain(batch_size=4)),
        ("shuffled", plain(batch_size=4, shuffle=True)),
        ("shuffled-drop-last", plain(batch_size=4, shuffle=True, drop_last=True)),
        ("shuffled-no-batch", plain(batch_size=None, shuffle=True)),
        ("dist-2-workers", dist(batch_size=3, num_workers=2)),
        ("dist-2-workers-every-3", dist(batch_size=3, num_workers=2, snapshot_every_n_steps=3)),
        ("shuffled-2-workers", plain(batch_size=4, shuffle=True, num_workers=2)),
    ]


def _buckets(data: Any) -> Any:
    sampler = DistributedSampler(data, num_replicas=1, rank=0, seed=0)
    sampler.set_epoch(EPOCH)
    return StatefulDataLoader(data, batch_sampler=Buckets(sampler))


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("name", "build"), _builds(), ids=[name for name, _ in _builds()])
def test_every_state_torchdata_writes_resumes(name: str, build: Any) -> None:
    """The checks above take what torchdata's own state_dict() holds: at each batch of a pass,
    at its end and in a resumed pass saved again, the rest is the uninterrupted one's."""
    uninterrupted = [b[0].reshape(-1).tolist() for b in build()]
    counts = sorted({0, 1, 2, len(uninterrupted) - 1, len(uninterrupted)})
    for count in counts:
        load = build()
        it = iter(load)
        before = [b[0].reshape(-1).tolist() for b in itertools.islice(it, count)]
        if count == len(uninterrupted):
            assert list(it) == []  # the pass has ended: _iterator_finished
        state = cd.position(load, epoch=EPOCH, batches=count)
        again = build()
        rest = cd.resume(again, state)
        assert len(rest) == len(uninterrupted) - count
        following = [b[0].reshape(-1).tolist() for b in itertools.islice(rest, 1)]
        assert before + following == uninterrupted[: count + len(following)]
        if following:  # the pass resume started, saved again
            state = cd.position(again, epoch=EPOCH, batches=1)
            rest = cd.resume(build(), state)
            assert [b[0].reshape(-1).tolist() for b in rest] == uninterrupted[count + 1 :]


def test_a_state_past_the_end_of_the_pass_is_refused() -> None:
    """Every count edited alike past the pass's 8 batches: resumed an empty pass, silently."""
    load = shuffled()
    taken(load, 2)
    state = copy.deepcopy(cd.position(load, epoch=0, batches=2))
    own = state["stateful"]
    own["_num_yielded"] = own["_sampler_iter_yielded"] = state["batches"] = 10
    own["_sampler_iter_state"]["samples_yielded"] = 30
    own["_sampler_iter_state"]["sampler_iter_state"]["yielded"] = 30
    with pytest.raises(DataPositionError, match="batches=10, but the loader has only 8 batches"):
        cd.resume(shuffled(seed=3), state)
