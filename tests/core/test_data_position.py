"""compatshim.data on one process: a real DataLoader + DistributedSampler per simulated rank.

DistributedSampler takes ``num_replicas`` and ``rank`` explicitly, so every rank's order at
any world size is built here without a process group; the gloo ranks' run (model, dropout,
compatshim.rng) is tests/core/test_data_position_dist.py.
"""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import (  # noqa: E402
    BatchSampler,
    DataLoader,
    DistributedSampler,
    IterableDataset,
    Sampler,
    TensorDataset,
)

import compatshim.data as cd  # noqa: E402
from compatshim.data import DataPositionError  # noqa: E402

EPOCH = 3


def loader(
    length: int,
    world_size: int,
    rank: int,
    batch_size: int | None = 3,
    *,
    sampler_drop_last: bool = False,
    drop_last: bool = False,
    seed: int = 7,
    epoch: int = EPOCH,
    **kwargs: Any,
) -> DataLoader[Any]:
    data = TensorDataset(torch.arange(length))
    sampler = DistributedSampler(
        data, num_replicas=world_size, rank=rank, seed=seed, drop_last=sampler_drop_last
    )
    sampler.set_epoch(epoch)
    return DataLoader(data, batch_size=batch_size, sampler=sampler, drop_last=drop_last, **kwargs)


def samples(batches: Any) -> list[int]:
    """Dataset indices of an iterable of batches (a batch is a 1-tuple of a tensor)."""
    return [int(i) for batch in batches for i in batch[0].reshape(-1).tolist()]


def first(load: DataLoader[Any], count: int) -> list[int]:
    return samples(itertools.islice(iter(load), count))


def epoch_order(length: int, seed: int = 7, epoch: int = EPOCH) -> list[int]:
    once = DistributedSampler(TensorDataset(torch.arange(length)), 1, 0, seed=seed)
    once.set_epoch(epoch)
    return list(once)


def saved(
    length: int, world_size: int, batches: int, **kw: Any
) -> tuple[dict[str, Any], list[int]]:
    """Every rank at ``world_size`` takes ``batches``: (the position, the samples consumed)."""
    states, consumed = [], []
    for rank in range(world_size):
        load = loader(length, world_size, rank, **kw)
        consumed += first(load, batches)
        states.append(cd.position(load, epoch=EPOCH, batches=batches))
    assert all(state == states[0] for state in states)  # one copy serves every rank (DCP)
    return states[0], consumed


# -- the same world size: the same samples in the same order ---------------------------------


@pytest.mark.parametrize("length", [23, 24, 36])
@pytest.mark.parametrize("batches", [0, 1, 3, 4])
def test_same_world_size_continues_the_samplers_own_batches(length: int, batches: int) -> None:
    state, _ = saved(length, 2, batches)
    for rank in range(2):
        uninterrupted = [b[0].tolist() for b in loader(length, 2, rank)]
        resumed = cd.resume(loader(length, 2, rank, epoch=0), state)  # resume sets the epoch
        assert [b[0].tolist() for b in resumed] == uninterrupted[batches:]
        assert resumed.same_order and resumed.skipped == batches
        assert resumed.repeated == resumed.dropped == ()


@pytest.mark.parametrize("world_size", [2, 3])
def test_a_negative_seed_resumes(world_size: int) -> None:
    """DistributedSampler takes any int seed (torch.Generator.manual_seed(-5) is legal): a
    position saved with one resumes, at the same world size and at another."""
    state, consumed = saved(24, 2, 2, seed=-5)
    assert state["seed"] == -5
    rest = []
    for rank in range(world_size):
        rest += samples(cd.resume(loader(24, world_size, rank, seed=-5, epoch=0), state))
    assert sorted(consumed + rest) == sorted(epoch_order(24, seed=-5))


def test_skipped_batches_are_never_loaded() -> None:
    class Counting(TensorDataset):
        loads: list[int] = []

        def __getitem__(self, index: int) -> Any:
            self.loads.append(index)
            return super().__getitem__(index)

    data = Counting(torch.arange(40))
    sampler = DistributedSampler(data, num_replicas=2, rank=1, seed=3)
    load = DataLoader(data, batch_size=4, sampler=sampler)
    plain = TensorDataset(torch.arange(40))  # the same order, saved after 3 batches
    saving = DataLoader(plain, batch_size=4, sampler=DistributedSampler(plain, 2, 1, seed=3))
    first(saving, 3)
    state = cd.position(saving, epoch=0, batches=3)
    resumed = cd.resume(load, state)
    assert Counting.loads == []
    rest = samples(resumed)
    assert sorted(Counting.loads) == sorted(rest) and len(rest) == 20 - 12


def test_a_sequential_loader_resumes_on_one_process() -> None:
    load = DataLoader(TensorDataset(torch.arange(10)), batch_size=4)
    state = cd.position(load, epoch=0, batches=1)
    assert state["consumed"] is None  # not a DistributedSampler: it replays, never re-deals
    assert samples(cd.resume(load, state)) == list(range(4, 10))


# -- another world size: no sample of the epoch repeated or skipped --------------------------


def dealt(
    length: int, saved_at: int, resumed_at: int, batch: int, taken: int, even: bool, **kw: Any
) -> tuple[list[int], list[int], list[Any]]:
    state, consumed = saved(length, saved_at, taken, batch_size=batch, **kw)
    resumed = [
        cd.resume(loader(length, resumed_at, rank, batch_size=batch, **kw), state, even=even)
        for rank in range(resumed_at)
    ]
    return consumed, [i for r in resumed for i in samples(r)], resumed


@pytest.mark.parametrize("length", [23, 24, 37])
@pytest.mark.parametrize(("saved_at", "resumed_at"), [(2, 1), (2, 3), (3, 2), (1, 4), (4, 3)])
@pytest.mark.parametrize("sampler_drop_last", [False, True])
def test_another_world_size_serves_the_rest_of_the_epoch_once(
    length: int, saved_at: int, resumed_at: int, sampler_drop_last: bool
) -> None:
    epoch = epoch_order(length)
    if sampler_drop_last:
        epoch = epoch[: length // saved_at * saved_at]
    for taken in (0, 1, 2):
        consumed, rest, resumed = dealt(
            length, saved_at, resumed_at, 2, taken, False, sampler_drop_last=sampler_drop_last
        )
        assert Counter(consumed) + Counter(rest) == Counter(epoch), (taken, consumed, rest)
        assert all(not r.same_order and r.repeated == r.dropped == () for r in resumed)
        consumed, rest, resumed = dealt(
            length, saved_at, resumed_at, 2, taken, True, sampler_drop_last=sampler_drop_last
        )
        repeated, dropped = Counter(resumed[0].repeated), Counter(resumed[0].dropped)
        assert Counter(consumed) + Counter(rest) == Counter(epoch) + repeated - dropped
        assert len(resumed[0].repeated) + len(resumed[0].dropped) < resumed_at
        assert (dropped and sampler_drop_last) or not dropped
        assert len({len(r) for r in resumed}) == 1  # every rank as many batches (DDP's lockstep)


def test_another_per_rank_batch_size_is_dealt_too() -> None:
    state, consumed = saved(36, 2, 2, batch_size=3)
    rest = [samples(cd.resume(loader(36, 3, r, batch_size=2), state)) for r in range(3)]
    assert sorted(consumed + [i for part in rest for i in part]) == list(range(36))


def test_a_loader_without_batches_is_dealt_sample_by_sample() -> None:
    state, consumed = saved(22, 2, 3, batch_size=None)
    assert len(consumed) == 6
    rest = [samples(cd.resume(loader(22, 4, r, batch_size=None), state)) for r in range(4)]
    assert sorted(consumed + [i for part in rest for i in part]) == list(range(22))


def test_a_resumed_pass_saved_again_composes() -> None:
    """2 ranks take 2 batches; 3 ranks resume and take 1; 2 ranks finish the epoch.

    40 samples: 28 left for 3 ranks and 19 for 2, so ``even=False`` (each exactly once)."""
    state, consumed = saved(40, 2, 2)
    middle_states = []
    for rank in range(3):
        load = loader(40, 3, rank)
        resumed = cd.resume(load, state, even=False)
        consumed += samples(itertools.islice(resumed, 1))
        with pytest.raises(DataPositionError, match="batches=3, but only 1 batches were taken"):
            cd.position(load, epoch=EPOCH, batches=3)  # counted over the epoch: refused
        middle_states.append(cd.position(load, epoch=EPOCH, batches=1))
    assert all(s == middle_states[0] for s in middle_states)
    assert middle_states[0]["consumed"] == 12 + 9 and not middle_states[0]["same_order"]
    for rank in range(2):
        consumed += samples(cd.resume(loader(40, 2, rank), middle_states[0], even=False))
    assert sorted(consumed) == list(range(40))


def test_a_same_order_pass_saved_again_counts_the_skipped_batches() -> None:
    state, _ = saved(30, 2, 2)
    load = loader(30, 2, 0)
    resumed = cd.resume(load, state)
    next(resumed)
    assert cd.position(load, epoch=EPOCH, batches=1) == {**state, "batches": 3, "consumed": 18}


def test_a_finished_pass_resumes_as_finished() -> None:
    state, _ = saved(23, 2, 4, batch_size=3, drop_last=True)  # 12 each: 4 full batches
    assert state["consumed"] == 23  # the pass ended: what its drop_last left out stays out
    assert [len(cd.resume(loader(23, 3, r, drop_last=True), state)) for r in range(3)] == [0] * 3


# -- generators: resume draws from none ------------------------------------------------------


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers", [0, 2])
def test_resume_leaves_every_generator_as_it_was(workers: int) -> None:
    own = torch.Generator().manual_seed(11)
    kw = {"num_workers": workers, "generator": own}
    state, _ = saved(24, 2, 1, **kw)
    before, own_before = torch.get_rng_state(), own.get_state()
    resumed = cd.resume(loader(24, 2, 0, **kw), state)
    assert torch.equal(torch.get_rng_state(), before) and torch.equal(own.get_state(), own_before)
    assert samples(resumed) == first(loader(24, 2, 0), 4)[3:]
    # what it replaces: building the iterator draws the workers' base seed
    iter(loader(24, 2, 0, num_workers=workers))
    assert not torch.equal(torch.get_rng_state(), before)


# -- refusals: typed, naming the argument and the cause --------------------------------------


def test_a_random_sampler_is_refused() -> None:
    shuffled = DataLoader(TensorDataset(torch.arange(8)), batch_size=2, shuffle=True)
    with pytest.raises(DataPositionError, match="loader: its RandomSampler draws its order"):
        cd.position(shuffled, epoch=0, batches=1)
    state = cd.position(
        DataLoader(TensorDataset(torch.arange(8)), batch_size=2), epoch=0, batches=1
    )
    with pytest.raises(DataPositionError, match="RandomSampler"):
        cd.resume(shuffled, state)


def test_an_iterable_dataset_is_refused() -> None:
    class Stream(IterableDataset[int]):
        def __iter__(self) -> Any:
            return iter(range(4))

    with pytest.raises(DataPositionError, match="loader: an IterableDataset"):
        cd.position(DataLoader(Stream()), epoch=0, batches=0)


def test_an_epoch_the_sampler_is_not_in_is_refused() -> None:
    with pytest.raises(
        DataPositionError, match=r"epoch=2, but the DistributedSampler is in epoch 3"
    ):
        cd.position(loader(10, 2, 0), epoch=2, batches=0)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"seed": 8}, "seed=8, shuffle=True; the position's seed=7"),
        ({"length": 11}, "its dataset has 11 samples, the position's 10"),
    ],
)
def test_another_epoch_order_is_refused(change: dict[str, Any], match: str) -> None:
    state, _ = saved(10, 2, 1)
    length = change.pop("length", 10)
    with pytest.raises(DataPositionError, match=match):
        cd.resume(loader(length, 3, 0, **change), state)


def test_a_replay_only_sampler_at_another_world_size_is_refused() -> None:
    state = cd.position(
        DataLoader(TensorDataset(torch.arange(10)), batch_size=2), epoch=0, batches=1
    )
    with pytest.raises(DataPositionError, match="only a DistributedSampler's epoch"):
        cd.resume(loader(10, 2, 0, batch_size=2), state)


@pytest.mark.parametrize(
    ("state", "match"),
    [
        ({"format": "other"}, "state: format 'other' is not 'compatshim.data.position'"),
        ({"format": torch.zeros(2)}, "state: expected a dict .* without its format"),
        ({"format": "compatshim.data.position", "version": 2}, "state: version 2 is not 1"),
    ],
)
def test_a_state_of_another_kind_is_refused(state: Any, match: str) -> None:
    with pytest.raises(DataPositionError, match=match):
        cd.resume(loader(10, 2, 0), state)


@pytest.mark.parametrize(("field", "value"), [("batches", True), ("epoch", -1), ("epoch", "3")])
def test_a_state_with_a_bad_field_is_refused(field: str, value: Any) -> None:
    state, _ = saved(10, 2, 1)
    with pytest.raises(DataPositionError, match=rf"state\['{field}'\]"):
        cd.resume(loader(10, 2, 0), {**state, field: value})


@pytest.mark.parametrize(
    "field", ["seed", "shuffle", "sampler_drop_last", "epoch_length", "consumed"]
)
@pytest.mark.parametrize("world_size", [2, 3])
def test_a_state_missing_a_field_is_refused_and_changes_nothing(
    field: str, world_size: int
) -> None:
    """A position with a field removed was a bare KeyError (not a DataPositionError)."""
    state, _ = saved(10, 2, 1)
    load = loader(10, world_size, 0, epoch=0)
    with pytest.raises(DataPositionError, match=rf"state\['{field}'\]: missing"):
        cd.resume(load, {key: value for key, value in state.items() if key != field})
    assert load.sampler.epoch == 0  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("batches", 999, "state: batches=999, but the loader has only 2 batches in an epoch"),
        ("world_size", 0, r"state\['world_size'\]: expected an int >= 1, got 0"),
    ],
)
def test_a_position_no_save_could_write_is_refused_and_changes_nothing(
    field: str, value: Any, match: str
) -> None:
    """A tampered position named at resume: batches=999 at the same world size resumed an
    empty epoch (the rest of it skipped, silently); world_size=0 was dealt again."""
    state, _ = saved(10, 2, 1)
    load = loader(10, 2, 0, epoch=0)
    with pytest.raises(DataPositionError, match=match):
        cd.resume(load, {**state, field: value})
    assert load.sampler.epoch == 0  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("consumed", "match"),
    [
        (11, "state: consumed=11, epoch_length=10 do not fit a dataset of 10 samples"),
        (-1, r"state\['consumed'\]: expected an int >= 0, got -1"),
        (True, r"state\['consumed'\]: expected an int >= 0, got True"),
    ],
)
def test_a_state_that_does_not_fit_the_dataset_is_refused(consumed: Any, match: str) -> None:
    state, _ = saved(10, 2, 1)
    with pytest.raises(DataPositionError, match=match):
        cd.resume(loader(10, 3, 0), {**state, "consumed": consumed})


@pytest.mark.parametrize(("epoch", "batches"), [(-1, 0), (0, -2)])
def test_position_refuses_negative_counts(epoch: Any, batches: Any) -> None:
    with pytest.raises(DataPositionError, match=r"(epoch|batches): expected an int >= 0, got -"):
        cd.position(loader(10, 2, 0), epoch=epoch, batches=batches)


def _position_of(load: Any, epoch: Any = EPOCH, batches: Any = 0) -> Any:
    return cd.position(load, epoch=epoch, batches=batches)


def _resume_into(load: Any, state: Any = None, even: Any = True) -> Any:
    return cd.resume(load, saved(10, 2, 1)[0] if state is None else state, even=even)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: _position_of(None), "loader: expected a torch DataLoader .*, got None"),
        (
            lambda: _position_of(TensorDataset(torch.arange(4))),
            "loader: expected a torch DataLoader .*, got a TensorDataset",
        ),
        (lambda: _position_of([1, 2]), "loader: expected a torch DataLoader .*, got a list"),
        (lambda: _position_of(loader(10, 2, 0), epoch="3"), "epoch: expected an int >= 0"),
        (lambda: _position_of(loader(10, 2, 0), epoch=True), "epoch: expected an int >= 0"),
        (lambda: _position_of(loader(10, 2, 0), batches=1.0), "batches: expected an int >= 0"),
        (lambda: _resume_into(None), "loader: expected a torch DataLoader .*, got None"),
        (
            lambda: _resume_into(TensorDataset(torch.arange(10))),
            "loader: expected a torch DataLoader .*, got a TensorDataset",
        ),
        (lambda: _resume_into(loader(10, 2, 0), [1, 2]), "state: expected a dict .* got a list"),
        (lambda: _resume_into(loader(10, 2, 0), "bad"), "state: expected a dict .* got 'bad'"),
        (lambda: _resume_into(loader(10, 2, 0), even="no"), "even: expected True or False"),
    ],
    ids=[
        "position-None",
        "position-dataset",
        "position-list",
        "position-epoch-str",
        "position-epoch-bool",
        "position-batches-float",
        "resume-None",
        "resume-dataset",
        "resume-state-list",
        "resume-state-str",
        "resume-even-str",
    ],
)
def test_an_argument_of_the_wrong_type_is_a_type_error(call: Any, match: str) -> None:
    """Not an internal error (no weak reference to None, no attribute 'dataset'): the
    argument and what was expected."""
    with pytest.raises(TypeError, match=match):
        call()


@pytest.mark.parametrize(
    ("change", "state_change", "match"),
    [
        ({"seed": 8, "world_size": 3}, {}, "seed=8, shuffle=True; the position's seed=7"),
        ({"length": 11}, {}, "its dataset has 11 samples"),
        ({"world_size": 3}, {"consumed": 11}, "consumed=11, epoch_length=10 do not fit"),
        ({"world_size": 3}, {"consumed": None}, "only a DistributedSampler's epoch"),
    ],
)
def test_a_refused_resume_leaves_the_sampler_as_it_was(
    change: dict[str, Any], state_change: dict[str, Any], match: str
) -> None:
    """DataPositionError says nothing was changed: every check comes before set_epoch."""
    state, _ = saved(10, 2, 1)
    load = loader(change.pop("length", 10), change.pop("world_size", 2), 0, epoch=0, **change)
    with pytest.raises(DataPositionError, match=match):
        cd.resume(load, {**state, **state_change})
    assert load.sampler.epoch == 0  # type: ignore[attr-defined]


def test_more_batches_than_the_loader_has_is_refused() -> None:
    with pytest.raises(DataPositionError, match="batches=3, but the loader has only 2"):
        cd.position(loader(10, 2, 0), epoch=EPOCH, batches=3)


class _Pairs:
    """A batch sampler of the user's without ``__len__`` (a streaming or bucketing one)."""

    def __iter__(self) -> Any:
        for start in range(0, 10, 2):
            yield [start, start + 1]


def test_a_batch_sampler_without_a_length_is_saved_and_resumed_as_given() -> None:
    """position() raised a bare ``TypeError: object of type ... has no len()`` where resume()
    took the same loader: its epoch cannot be bounded, so both take the count as given."""
    data = TensorDataset(torch.arange(10))
    state = cd.position(DataLoader(data, batch_sampler=_Pairs()), epoch=0, batches=2)
    resumed = cd.resume(DataLoader(data, batch_sampler=_Pairs()), state)
    assert samples(resumed) == [4, 5, 6, 7, 8, 9]


# -- found by an audit as a user would (2026-12-04): each failed before its fix ----------------


def test_an_empty_rest_is_still_a_resume() -> None:
    """A position saved at the end of a pass resumes as an empty iterator that is truthy, as
    iterators are: ``rest.epoch if rest else 0`` must not restart the run at epoch 0."""
    state, _ = saved(12, 1, 4)
    rest = cd.resume(loader(12, 1, 0, epoch=0), state)
    assert len(rest) == 0 and list(rest) == []
    assert rest and rest.epoch == EPOCH


class Buckets(Sampler[list[int]]):
    """A batch sampler of the user's over a DistributedSampler (bucketing), held as .sampler."""

    def __init__(self, sampler: Any) -> None:
        self.sampler = sampler

    def __iter__(self) -> Any:
        it = iter(self.sampler)
        while chunk := list(itertools.islice(it, 3)):
            yield chunk

    def __len__(self) -> int:
        return -(-len(self.sampler) // 3)


class Wrapped(BatchSampler):
    """torch's BatchSampler with its own __iter__ (only wrapping super's)."""

    def __iter__(self) -> Any:
        yield from super().__iter__()


@pytest.mark.parametrize("make", [Buckets, lambda s: Wrapped(s, 3, False)], ids=["own", "sub"])
def test_a_batch_sampler_over_a_distributed_sampler_gets_the_epoch(make: Any) -> None:
    """resume sets the epoch of the samplers a batch sampler holds (torch's ``.sampler``), so
    the replayed order is the saved epoch's, not epoch 0's."""

    def build() -> tuple[Any, DataLoader[Any]]:
        data = TensorDataset(torch.arange(12))
        sampler = DistributedSampler(data, num_replicas=1, rank=0, seed=0)
        return sampler, DataLoader(data, batch_sampler=make(sampler))

    sampler, load = build()
    sampler.set_epoch(1)
    uninterrupted = [b[0].tolist() for b in load]
    state = cd.position(load, epoch=1, batches=2)
    sampler, load = build()
    rest = cd.resume(load, state)
    assert sampler.epoch == 1
    assert [b[0].tolist() for b in rest] == uninterrupted[2:]
    with pytest.raises(DataPositionError, match="DistributedSampler is in epoch 1"):
        cd.position(load, epoch=2, batches=0)  # the inner sampler's epoch is checked too


def test_a_resumed_pass_saved_before_the_step_composes() -> None:
    """The docs' loop saves ``taken`` inside ``enumerate(batches)``: the batch fetched, not yet
    trained. In a pass resume returned that is one fewer than fetched; the fetched batch is
    served again after the next resume."""
    state, _ = saved(24, 1, 3)
    load = loader(24, 1, 0, epoch=0)
    rest = cd.resume(load, state)
    for taken_, _batch in enumerate(rest):
        if taken_ == 2:
            position = cd.position(load, epoch=EPOCH, batches=taken_)
            break
    assert position["batches"] == 3 + 2
    with pytest.raises(DataPositionError, match="only 3 batches were taken"):
        cd.position(load, epoch=EPOCH, batches=4)
    uninterrupted = [b[0].tolist() for b in loader(24, 1, 0)]
    again = cd.resume(loader(24, 1, 0, epoch=0), position)
    assert [b[0].tolist() for b in again] == uninterrupted[5:]


@pytest.mark.parametrize("even", [True, False])
def test_a_loaders_drop_last_at_another_world_size_names_what_it_leaves_out(even: bool) -> None:
    """The loader's drop_last cuts each new rank's last partial batch: those samples are named
    in ``dropped``, and ``repeated`` names only copies that are served."""
    state, consumed = saved(40, 2, 3, batch_size=4, drop_last=True)
    served: list[int] = []
    rests = []
    for rank in range(3):
        rest = cd.resume(
            loader(40, 3, rank, batch_size=4, drop_last=True, epoch=0), state, even=even
        )
        served += samples(rest)
        rests.append(rest)
    assert all(r.dropped == rests[0].dropped and r.repeated == rests[0].repeated for r in rests)
    rest = rests[0]
    left = [i for i in epoch_order(40) if i not in consumed]
    assert sorted(served + list(rest.dropped)) == sorted(left + list(rest.repeated))
    assert not set(rest.dropped) & set(served)
    assert all(served.count(i) >= 2 for i in rest.repeated)


def test_another_drop_last_is_named_in_the_refusal() -> None:
    data = TensorDataset(torch.arange(12))
    state = cd.position(DataLoader(data, batch_size=5), epoch=0, batches=1)
    with pytest.raises(DataPositionError, match=r"drop_last=False.*drop_last=True"):
        cd.resume(DataLoader(data, batch_size=5, drop_last=True), state)


def test_persistent_workers_keep_the_streams_of_the_next_epochs() -> None:
    """With persistent_workers the uninterrupted loader draws the workers' base seed once and
    reuses its iterator: the resumed loader keeps the one resume built, so the next epoch's
    ``iter(loader)`` draws nothing either, and no second set of workers is started."""

    def build() -> tuple[Any, DataLoader[Any]]:
        data = TensorDataset(torch.arange(8))
        sampler = DistributedSampler(data, num_replicas=1, rank=0, seed=0)
        return sampler, DataLoader(
            data, batch_size=2, sampler=sampler, num_workers=1, persistent_workers=True
        )

    def run(sampler: Any, load: Any, rest: Any = None, save_at: Any = None) -> Any:
        draws, found = [], None
        for epoch in range(rest.epoch if rest is not None else 0, 3):
            sampler.set_epoch(epoch)
            batches = rest if rest is not None and epoch == rest.epoch else iter(load)
            for count, batch in enumerate(batches):
                if (epoch, count) == save_at:
                    found = cd.position(load, epoch=epoch, batches=count), torch.get_rng_state()
                    draws.clear()
                draws.append((samples([batch]), torch.rand(()).item()))  # stands for dropout
        return draws, found

    torch.manual_seed(0)
    uninterrupted, (state, rng) = run(*build(), save_at=(1, 1))
    sampler, load = build()
    torch.set_rng_state(rng)  # what compatshim.rng.load does
    rest = cd.resume(load, state)
    assert load._iterator is rest.iterator
    assert run(sampler, load, rest)[0] == uninterrupted
    assert load._iterator is rest.iterator  # every later epoch reset it: one set of workers


# -- found by an attacker audit (auditB): each failed before its fix ---------------------------


@pytest.mark.parametrize("world_size", [2, 3], ids=["same-size", "other-size"])
@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"epoch": 2**64}, r"state\['epoch'\]: expected an int <= 2\*\*64 - 1"),
        ({"epoch": 2**64 - 1}, r"state\['seed'\] \+ state\['epoch'\]: 7 \+ 1844"),
        ({"epoch": 2**63, "seed": 2**63}, r"state\['seed'\] \+ state\['epoch'\]"),
    ],
    ids=["epoch-2**64", "seed+epoch", "seed-2**63"],
)
def test_an_epoch_torch_cannot_seed_is_refused_and_changes_nothing(
    world_size: int, change: dict[str, Any], match: str
) -> None:
    """epoch=2**64 raised torch's raw ``ValueError: Overflow when unpacking long long`` from
    the shuffle's manual_seed(seed + epoch), after set_epoch had left the sampler there."""
    state, _ = saved(10, 2, 1)
    load = loader(10, world_size, 0, epoch=0)
    with pytest.raises(DataPositionError, match=match):
        cd.resume(load, {**state, **change})
    assert load.sampler.epoch == 0  # type: ignore[attr-defined]


def test_the_largest_epoch_torch_seeds_with_resumes() -> None:
    """The bound is torch's own: seed + epoch = 2**64 - 1 seeds, so it resumes."""
    last, taken = 2**64 - 1 - 7, []  # seed 7
    for rank in range(2):
        load = loader(10, 2, rank, epoch=last)
        taken += first(load, 1)
        state = cd.position(load, epoch=last, batches=1)
    for world_size in (2, 3):
        rest = [
            samples(cd.resume(loader(10, world_size, r), state, even=False))
            for r in range(world_size)
        ]
        assert sorted(taken + [i for part in rest for i in part]) == list(range(10))


@pytest.mark.parametrize("world_size", [1, 2], ids=["same-size", "other-size"])
@pytest.mark.parametrize(
    ("lie", "match"),
    [
        ({"consumed": 0}, "consumed=0, epoch_length=40 contradict batches=3"),
        ({"consumed": 16}, "consumed=16, epoch_length=40 contradict"),
        ({"epoch_length": 12}, "consumed=12, epoch_length=12 contradict"),
        ({"epoch_length": 20}, "consumed=12, epoch_length=20 contradict"),
        ({"batches": 4}, "consumed=12, epoch_length=40 contradict batches=4"),
        ({"batch_size": 2}, "contradict batches=3, world_size=1, batch_size=2"),
        ({"sampler_drop_last": True, "epoch_length": 39}, "sampler_drop_last=True"),
        ({"batches": 11}, "state: batches=11, but the loader has only 10 batches"),
        ({"seed": None}, "seed=None, .* position\\(\\) writes them together"),
    ],
)
def test_fields_that_contradict_each_other_are_refused_and_change_nothing(
    world_size: int, lie: dict[str, Any], match: str
) -> None:
    """3 batches of 4 on 1 rank consumed 12 of 40: consumed=0 resumed on 2 ranks served all
    40, epoch_length=12 none, epoch_length=20 only 8 of the 28 left, without an error."""
    state, _ = saved(40, 1, 3, batch_size=4)
    assert (state["consumed"], state["epoch_length"]) == (12, 40)
    load = loader(40, world_size, 0, batch_size=4, epoch=0)
    with pytest.raises(DataPositionError, match=match):
        cd.resume(load, {**state, **lie})
    assert load.sampler.epoch == 0  # type: ignore[attr-defined]


@pytest.mark.parametrize("length", [7, 23, 24])
@pytest.mark.parametrize("saved_at", [1, 2, 3])
@pytest.mark.parametrize(
    ("batch_size", "sampler_drop_last", "drop_last"),
    [(3, False, False), (3, True, False), (3, False, True), (3, True, True), (None, True, False)],
)
def test_every_position_a_save_writes_resumes_at_another_world_size(
    length: int, saved_at: int, batch_size: int | None, sampler_drop_last: bool, drop_last: bool
) -> None:
    """The checks above derive consumed and epoch_length as position() does: every count of
    batches a pass can have, in each layout (uneven last batch, either drop_last, no batch
    size), is taken at another world size, each remaining sample once (``even=False``)."""
    kw: dict[str, Any] = {"batch_size": batch_size, "sampler_drop_last": sampler_drop_last}
    if batch_size is not None:
        kw["drop_last"] = drop_last
    epoch = epoch_order(length)
    if sampler_drop_last:
        epoch = epoch[: length // saved_at * saved_at]
    for taken in range(len(loader(length, saved_at, 0, **kw)) + 1):
        state, consumed = saved(length, saved_at, taken, **kw)
        assert cd.resume(loader(length, saved_at, 0, epoch=0, **kw), state).skipped == taken
        resumed_at = 3 if saved_at != 3 else 2
        rest = [
            cd.resume(loader(length, resumed_at, r, **kw), state, even=False)
            for r in range(resumed_at)
        ]
        served = [i for r in rest for i in samples(r)]
        dropped = list(rest[0].dropped)  # the loader's drop_last cuts each rank's last batch
        left = [i for i in epoch if i not in consumed]
        if taken == len(loader(length, saved_at, 0, **kw)):
            left = []  # the pass is over: what a drop_last left out stays out
        assert sorted(served + dropped) == sorted(left), (taken, consumed, served)
