"""compatshim.data: where the data left off, saved with a checkpoint and resumed at any world size.

- :func:`position` - a plain dict (ints, bools, strings; the same on every rank, except in a
  pass ``resume(..., even=False)`` returned: keep rank 0's) saying which epoch a
  ``DataLoader`` is in and how much of it has been consumed.
- :func:`resume` - the rest of that epoch, as an iterator of batches; its samples are never
  loaded for the batches skipped (the sampler's indices are walked, not the dataset).
- :class:`Resumed`, :class:`DataPositionError`.

Guarantee. At the saving world size and batch size, the resumed iterator yields the batches
the uninterrupted one would have yielded: the same samples in the same order. At another
world size or per-rank batch size (a ``DistributedSampler`` only), the epoch's samples not
yet consumed are dealt to the new ranks as ``DistributedSampler`` deals an epoch (rank ``r``
takes every ``M``-th from ``r``): no sample of the epoch is repeated or skipped, except that
when their number is not a multiple of ``M`` and ``even=True`` (the default: every rank gets
as many batches, as DDP needs), up to ``M - 1`` are repeated (the sampler's
``drop_last=False``) or left out (``drop_last=True``), as ``DistributedSampler`` itself
does, and the loader's ``drop_last=True`` cuts each new rank's last partial batch;
:attr:`Resumed.repeated` and :attr:`Resumed.dropped` name them. ``even=False`` deals each
exactly once (ranks then differ by at most one sample).

RNG. :func:`resume` builds the loader's iterator itself and leaves torch's default generator
and the loader's ``generator`` as they were (except where a StatefulDataLoader's state sets
the ``generator`` its RandomSampler shuffles with): ``DataLoader.__iter__`` draws the
workers' base seed from one of them, so ``iter(loader)`` after ``compatshim.rng.load`` moved
the restored stream on (the first resumed step's dropout differed from the uninterrupted
run's). With :func:`resume`, calling it before or after ``compatshim.rng.load`` gives the same
streams.
Randomness inside DataLoader workers (augmentations drawn in ``Dataset.__getitem__`` with
``num_workers > 0``) is not reproduced: the workers' generators are seeded anew.

Not covered: an ``IterableDataset`` and samplers that draw their order from a generator when
the epoch starts (``RandomSampler``, ``DataLoader(shuffle=True)``, ``SubsetRandomSampler``,
``WeightedRandomSampler``): their order cannot be replayed from a position, so both functions
refuse them (use ``DistributedSampler(shuffle=True, seed=...)``, which also runs on one
process with ``num_replicas=1, rank=0``).

torchdata's ``StatefulDataLoader``: its position also holds ``loader.state_dict()`` (key
``"stateful"``) and the saving ``rank``. That state is this rank's (its sampler's iterator,
a ``RandomSampler``'s generator, each worker's dataset state), so save one position per rank.
At the saving world size, rank and ``num_workers``, :func:`resume` loads it (``load_state_dict``)
and builds the iterator without drawing from a generator: the same samples in the same order,
``shuffle=True`` and ``IterableDataset`` included. torchdata loads a state only into as many
workers: at another ``num_workers`` a sampler that replays its order over a dataset without
state of its own is walked as for a ``DataLoader`` (the same samples in the same order). At
another world size only torch's ``DistributedSampler`` over a dataset without state of its own
is dealt again, as above. A position of another rank, an order only the loader's state replays,
or a dataset's own state there is a DataPositionError.

Every check comes before any change: on :class:`DataPositionError` (or a TypeError for an
argument of the wrong type) the loader and its sampler are as they were.

Importing this module imports no framework; torch is imported on first use.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import math
import weakref
from typing import Any, Iterator, Mapping, Sequence

from ._text import short

__all__ = ["DataPositionError", "Resumed", "position", "resume"]

FORMAT = "compatshim.data.position"
VERSION = 1
_RANDOM_SAMPLERS = ("RandomSampler", "SubsetRandomSampler", "WeightedRandomSampler")


class DataPositionError(ValueError):
    """A position that cannot be saved or resumed as asked; nothing was changed."""


class _Pass:
    """A pass that :func:`resume` started (kept per loader, weakly): what :func:`position` adds.

    Same order: ``skipped`` batches were passed over. Dealt again: ``start`` samples of the
    epoch's order were consumed before it and ``limit`` more were dealt once each; ``length``
    is the most batches a rank got (the same on every rank). ``from_state``: a
    StatefulDataLoader's pass built by ``load_state_dict`` (else the sampler's indices were
    walked, and the loader's state does not describe the pass). ``taken`` is advanced by
    :class:`Resumed`; nothing here refers to the loader, so the loader can be collected.
    """

    __slots__ = (
        "batch_size",
        "epoch",
        "epoch_length",
        "from_state",
        "length",
        "limit",
        "same_order",
        "skipped",
        "start",
        "taken",
        "world_size",
    )

    def __init__(
        self, epoch: int, *, same_order: bool, skipped: int = 0, from_state: bool = False
    ) -> None:
        self.epoch = epoch
        self.same_order = same_order
        self.skipped = skipped
        self.from_state = from_state
        self.start = self.limit = self.epoch_length = self.length = 0
        self.world_size = self.batch_size = 1
        self.taken = 0


_PASSES: weakref.WeakKeyDictionary[Any, _Pass] = weakref.WeakKeyDictionary()


class Resumed(Iterator[Any]):
    """The rest of an epoch: iterate it as the ``DataLoader``'s own iterator.

    ``same_order``: True when it continues the sampler's own order (the uninterrupted run's
    batches); ``skipped``: this rank's batches passed over without loading them;
    ``repeated`` / ``dropped``: dataset indices served twice, or left out (so that every rank
    gets as many samples, ``even=True``, or cut by the loader's ``drop_last``), at another
    world size; empty otherwise. ``len()`` is the batches left; an empty rest is still true,
    as iterators are (``rest.epoch if rest else 0`` must not restart at epoch 0).
    """

    def __init__(
        self,
        iterator: Any,
        record: _Pass,
        *,
        same_order: bool,
        skipped: int,
        repeated: Sequence[int] = (),
        dropped: Sequence[int] = (),
        length: int | None,
    ) -> None:
        self.iterator = iterator
        self._length = length
        self.epoch = record.epoch
        self.same_order = same_order
        self.skipped = skipped
        self.repeated = tuple(repeated)
        self.dropped = tuple(dropped)
        self._record = record

    def __next__(self) -> Any:
        batch = next(self.iterator)
        self._record.taken += 1
        return batch

    def __len__(self) -> int:
        if self._length is None:  # a loader without a length (a batch sampler of the user's)
            raise TypeError("this rest of an epoch has no length: its loader has none")
        return self._length

    def __bool__(self) -> bool:
        return True


def _count(value: Any, name: str) -> int:
    """A wrong type is the caller's mistake (TypeError); a negative count a wrong value."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name}: expected an int >= 0, got {short(value)}")
    if value < 0:
        raise DataPositionError(f"{name}: expected an int >= 0, got {short(value)}")
    return value


def _check_loader(loader: Any) -> None:
    """A DataLoader (torchdata's StatefulDataLoader is one), before anything reads it."""
    import torch.utils.data as data

    if not isinstance(loader, data.DataLoader):
        raise TypeError(
            "loader: expected a torch DataLoader (or torchdata's StatefulDataLoader), got "
            + short(loader)
        )


class _Layout:
    """What decides a loader's order: its sampler, batch size and world size."""

    def __init__(self, loader: Any) -> None:
        import torch.utils.data as data

        if isinstance(loader.dataset, data.IterableDataset):
            raise DataPositionError(
                "loader: an IterableDataset has no sampler to walk; its position is the "
                "dataset's own state (torchdata's StatefulDataLoader keeps it)"
            )
        batcher = loader.batch_sampler
        self.batcher = batcher
        if batcher is None:  # batch_size=None: each item is one sample
            self.sampler, self.batch_size, self.drop_last = loader.sampler, 1, False
        elif type(batcher).__iter__ is data.BatchSampler.__iter__ or (
            type(batcher).__module__ == "torchdata.stateful_dataloader.sampler"
            and type(batcher).__name__ == "BatchSampler"
        ):  # torchdata's (a StatefulDataLoader's): the same batches, from a savable iterator
            self.sampler = batcher.sampler
            self.batch_size, self.drop_last = int(batcher.batch_size), bool(batcher.drop_last)
        else:  # a batch sampler of the user's: replayed as it is, never re-dealt
            self.sampler, self.batch_size, self.drop_last = batcher, 0, False
        for kind in (self.sampler, batcher):
            if type(kind).__name__ in _RANDOM_SAMPLERS or isinstance(
                kind, (data.RandomSampler, data.SubsetRandomSampler, data.WeightedRandomSampler)
            ):
                raise DataPositionError(
                    f"loader: its {type(kind).__name__} draws its order from a generator when "
                    "the epoch starts, so the order cannot be replayed from a position; use "
                    "DistributedSampler(dataset, shuffle=True, seed=...) (num_replicas=1, "
                    "rank=0 on one process)"
                )
        self.kind = f"{type(self.sampler).__module__}.{type(self.sampler).__qualname__}"
        self.distributed = (
            isinstance(self.sampler, data.DistributedSampler)
            and type(self.sampler).__iter__ is data.DistributedSampler.__iter__
            and self.batch_size > 0
        )
        self.length = len(loader.dataset)
        if self.distributed:
            self.world_size, self.rank = int(self.sampler.num_replicas), int(self.sampler.rank)
        else:
            import torch.distributed as dist

            initialised = dist.is_available() and dist.is_initialized()
            self.world_size = int(dist.get_world_size()) if initialised else 1
            self.rank = int(dist.get_rank()) if initialised else 0

    def epoch_length(self) -> int:
        """The samples one epoch holds once, as the sampler deals it (``DistributedSampler``)."""
        sampler = self.sampler
        return int(sampler.total_size) if sampler.drop_last else self.length

    def owners(self) -> list[Any]:
        """The batch sampler, the sampler, and the samplers a batch sampler of the user's holds
        as ``.sampler`` (torch's convention: a bucketing sampler over a DistributedSampler),
        each once: every one whose epoch decides the order."""
        found: list[Any] = []
        for start in (self.batcher, self.sampler):
            node = start
            for _ in range(4):  # a chain of wrappers, not a walk of the user's objects
                if node is None or any(node is seen for seen in found):
                    break
                found.append(node)
                node = getattr(node, "sampler", None)
        return found

    def set_epoch(self, epoch: int) -> None:
        for owner in self.owners():
            if hasattr(owner, "set_epoch"):
                owner.set_epoch(epoch)


def _native_consumed(layout: _Layout, batches: int, pass_length: int) -> int:
    """Samples of the epoch a pass in the sampler's own order consumed: a prefix of its order."""
    if batches >= pass_length:
        return layout.epoch_length()
    return min(layout.world_size * batches * layout.batch_size, layout.epoch_length())


def position(loader: Any, *, epoch: int, batches: int) -> dict[str, Any]:
    """Where ``loader`` is: ``batches`` taken from it in this pass of ``epoch``.

    ``batches`` counts the batches this rank has taken since ``iter(loader)`` or, in a pass
    that :func:`resume` returned, since that call (compatshim adds what it skipped). The
    result holds ints, bools and strings only, the same on every rank (in a pass that
    ``resume(..., even=False)`` returned, a rank dealt fewer samples can count fewer: keep
    rank 0's, as a DCP state dict does): keep it in a DCP state dict or any checkpoint.
    Raises :class:`DataPositionError` for a loader whose order cannot be replayed, or an
    epoch the sampler is not in; TypeError for an argument of the wrong type.
    """
    _check_loader(loader)
    epoch, batches = _count(epoch, "epoch"), _count(batches, "batches")
    if _is_torchdata(loader, "stateful_dataloader", "StatefulDataLoader"):
        return _stateful_position(loader, epoch, batches)
    return _position(loader, epoch, batches, _PASSES.get(loader))


def _fields(
    epoch: int,
    batches: int,
    kind: str,
    length: int,
    world_size: int,
    batch_size: int,
    drop_last: bool,
) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "version": VERSION,
        "epoch": epoch,
        "batches": batches,
        "sampler": kind,
        "dataset_length": length,
        "world_size": world_size,
        "batch_size": batch_size,
        "drop_last": drop_last,
        "same_order": True,
        "seed": None,
        "shuffle": None,
        "sampler_drop_last": None,
        "epoch_length": None,
        "consumed": None,
    }


def _length(loader: Any, batches: int) -> int:
    """Batches in the loader's epoch; ``batches`` for a batch sampler of the user's without a
    length (its epoch cannot be bounded: position and resume take the count as given)."""
    try:
        return len(loader)
    except TypeError:
        return batches


def _position(loader: Any, epoch: int, batches: int, record: _Pass | None) -> dict[str, Any]:
    """The position of a loader whose order a sampler replays; ``record``: the pass that
    :func:`resume` started, if any."""
    layout = _Layout(loader)
    state = _fields(
        epoch,
        batches,
        layout.kind,
        layout.length,
        layout.world_size,
        layout.batch_size,
        layout.drop_last,
    )
    import torch.utils.data as data

    for owner in layout.owners():  # a batch sampler of the user's may hold one
        sampler_epoch = getattr(owner, "epoch", epoch)
        if isinstance(owner, data.DistributedSampler) and sampler_epoch != epoch:
            raise DataPositionError(
                f"epoch={epoch}, but the DistributedSampler is in epoch {short(sampler_epoch)} "
                "(sampler.set_epoch(epoch) not called?): the position must name the epoch "
                "whose order the loader used"
            )
    if record is not None and record.epoch == epoch:  # a pass that resume() started
        if batches > record.taken:  # fewer: fetched, not yet trained on (served again)
            raise DataPositionError(
                f"batches={batches}, but only {record.taken} batches were taken from the "
                f"iterator compatshim.data.resume returned for epoch {epoch}: count the batches "
                "of this pass, not of the whole epoch"
            )
        if record.same_order:
            state["batches"] = record.skipped + batches
        else:
            state["same_order"] = False
    elif batches > (length := _length(loader, batches)):
        raise DataPositionError(f"batches={batches}, but the loader has only {length}")
    if not layout.distributed:
        return state
    sampler = layout.sampler
    state.update(
        seed=int(sampler.seed),
        shuffle=bool(sampler.shuffle),
        sampler_drop_last=bool(sampler.drop_last),
    )
    if state["same_order"]:
        state["epoch_length"] = layout.epoch_length()
        state["consumed"] = _native_consumed(layout, state["batches"], len(loader))
        return state
    assert record is not None  # a pass dealt again: its share of the epoch is a prefix too
    if batches >= record.length:
        consumed = record.epoch_length
    else:
        taken = record.world_size * batches * record.batch_size
        consumed = record.start + min(taken, record.limit)
    state.update(
        world_size=record.world_size,
        batch_size=record.batch_size,
        epoch_length=record.epoch_length,
        consumed=consumed,
    )
    return state


# name -> (type, None allowed, least int): None only for what a DistributedSampler alone has;
# counts >= 0 (a batch size of 0: a user's batch sampler), a seed any int (manual_seed's)
_FIELDS: dict[str, tuple[type, bool, int | None]] = {
    "epoch": (int, False, 0),
    "batches": (int, False, 0),
    "sampler": (str, False, None),
    "dataset_length": (int, False, 0),
    "world_size": (int, False, 1),
    "batch_size": (int, False, 0),
    "drop_last": (bool, False, None),
    "same_order": (bool, False, None),
    "seed": (int, True, None),
    "shuffle": (bool, True, None),
    "sampler_drop_last": (bool, True, None),
    "epoch_length": (int, True, 0),
    "consumed": (int, True, 0),
    "rank": (int, True, 0),  # a StatefulDataLoader's position only: its state is this rank's
    "stateful": (dict, True, None),  # StatefulDataLoader.state_dict()
}


_STATEFUL_FIELDS = ("rank", "stateful")  # only a StatefulDataLoader's position has them

_SEED_MIN, _SEED_MAX = -(2**63), 2**64 - 1  # torch.Generator.manual_seed's range


def _checked(state: Any) -> Mapping[str, Any]:
    """``state`` if it is a position (typed, counts >= 0, an epoch torch can seed with);
    compared by type first, so a tensor or another object from a checkpoint never decides a
    comparison."""
    if not isinstance(state, Mapping):  # not a position at all: the caller's mistake
        raise TypeError(f"state: expected a dict from compatshim.data.position, got {short(state)}")
    if type(state.get("format")) is not str:
        raise DataPositionError(
            "state: expected a dict from compatshim.data.position, got a dict without its format"
        )
    if state["format"] != FORMAT:
        raise DataPositionError(f"state: format {short(state['format'])} is not {FORMAT!r}")
    if type(state.get("version")) is not int or state["version"] != VERSION:
        raise DataPositionError(f"state: version {short(state.get('version'))} is not {VERSION}")
    for name, (kind, optional, least) in _FIELDS.items():
        if name not in state and name not in _STATEFUL_FIELDS:  # later read as state[name]
            raise DataPositionError(
                f"state[{name!r}]: missing; position() writes every field (an edited position?)"
            )
        value = state.get(name)
        if value is None and optional:
            continue
        below = least is not None and type(value) is int and value < least
        if type(value) is not kind or below:
            what = kind.__name__ if least is None else f"an int >= {least}"
            raise DataPositionError(f"state[{name!r}]: expected {what}, got {short(value)}")
    epoch, seed = state["epoch"], state["seed"]
    if epoch > _SEED_MAX:  # torch seeds a generator with seed + epoch: a raw ValueError past it
        raise DataPositionError(
            f"state['epoch']: expected an int <= 2**64 - 1 (torch's seed range), got {short(epoch)}"
        )
    if seed is not None and state["shuffle"] and not _SEED_MIN <= seed + epoch <= _SEED_MAX:
        raise DataPositionError(
            f"state['seed'] + state['epoch']: {short(seed)} + {short(epoch)} is outside torch's "
            "seed range [-2**63, 2**64 - 1]: DistributedSampler seeds its shuffle with it"
        )
    return state


def _num_samples(length: int, world_size: int, drop_last: bool) -> int:
    """A DistributedSampler's samples per rank, as torch counts them (``num_samples``)."""
    if drop_last and length % world_size:
        return -((world_size - length) // world_size)  # ceil((length - world_size) / world_size)
    return -(-length // world_size)


def _check_consumed(state: Mapping[str, Any]) -> None:
    """``consumed`` and ``epoch_length`` as :func:`position` derives them from the other fields:
    the re-deal trusts them, so a contradiction would repeat or skip samples silently.

    A pass in the sampler's own order: ``epoch_length`` is the sampler's ``total_size``
    (``drop_last``) or the dataset's length, ``consumed`` the whole epoch once the pass is over,
    else ``world_size * batches * batch_size`` (at most ``epoch_length``). A pass dealt again
    (``same_order`` False) started anywhere in the epoch: only the bounds are known.
    """
    consumed, epoch_length, length = (
        state["consumed"],
        state["epoch_length"],
        state["dataset_length"],
    )
    if consumed is None:  # not a DistributedSampler's: never dealt again (resume says so)
        return
    if epoch_length is None or not 0 <= consumed <= epoch_length <= length:
        raise DataPositionError(
            f"state: consumed={short(consumed)}, epoch_length={short(epoch_length)} do not fit "
            f"a dataset of {short(length)} samples"
        )
    if not state["same_order"]:
        return
    world, size, cut = state["world_size"], state["batch_size"], state["drop_last"]
    sampler_drop_last, batches = state["sampler_drop_last"], state["batches"]
    if sampler_drop_last is None or state["seed"] is None or state["shuffle"] is None or size == 0:
        raise DataPositionError(
            f"state: consumed={short(consumed)} names a DistributedSampler's epoch, but "
            f"seed={short(state['seed'])}, shuffle={short(state['shuffle'])}, "
            f"sampler_drop_last={short(sampler_drop_last)}, batch_size={short(size)}: "
            "position() writes them together, with a batch size >= 1"
        )
    per_rank = _num_samples(length, world, sampler_drop_last)
    expected_length = per_rank * world if sampler_drop_last else length
    pass_length = per_rank // size if cut else -(-per_rank // size)
    if batches > pass_length:
        raise DataPositionError(
            f"state: batches={short(batches)}, but the loader has only {short(pass_length)} "
            f"batches in an epoch of dataset_length={short(length)} at world_size={short(world)}, "
            f"batch_size={short(size)}, drop_last={cut}, sampler_drop_last={sampler_drop_last}"
        )
    if batches >= pass_length:
        expected = expected_length
    else:
        expected = min(world * batches * size, expected_length)
    if (consumed, epoch_length) != (expected, expected_length):
        raise DataPositionError(
            f"state: consumed={short(consumed)}, epoch_length={short(epoch_length)} contradict "
            f"batches={short(batches)}, world_size={short(world)}, batch_size={short(size)}, "
            f"drop_last={cut}, sampler_drop_last={sampler_drop_last}, dataset_length="
            f"{short(length)}: those give consumed={short(expected)}, "
            f"epoch_length={short(expected_length)} (an edited position repeats or skips samples)"
        )


def _deal(
    remaining: list[int], world_size: int, even: bool, drop_last: bool, batch_size: int, cut: bool
) -> tuple[list[list[int]], list[int], list[int]]:
    """Every rank's share of ``remaining``, dealt as DistributedSampler deals an epoch (rank
    ``r`` takes every ``world_size``-th from ``r``; ``even``: padded with repeats, or cut
    with the sampler's ``drop_last``), less each rank's last partial batch where the loader's
    ``drop_last`` (``cut``) leaves it out. Returns (shares, repeated, dropped): the copies
    served more than once, and the samples no rank serves, in the epoch's order.
    """
    padding: list[int] = []
    dealt = remaining
    extra = len(remaining) % world_size
    if even and extra and drop_last:
        dealt = remaining[: len(remaining) - extra]
    elif even and extra:
        need = world_size - extra
        padding = (remaining * math.ceil(need / len(remaining)))[:need]
        dealt = remaining + padding
    shares = [dealt[rank::world_size] for rank in range(world_size)]
    if cut:
        shares = [share[: len(share) // batch_size * batch_size] for share in shares]
    served = collections.Counter(i for share in shares for i in share)
    dropped = [i for i in remaining if not served[i]]
    repeated = []
    for i in padding:  # a copy the loader cut is not served twice
        if served[i] > 1:
            repeated.append(i)
            served[i] -= 1
    return shares, repeated, dropped


def _check_dataset(length: int, saved: Mapping[str, Any]) -> None:
    if saved["dataset_length"] != length:
        raise DataPositionError(
            f"loader: its dataset has {length} samples, the position's "
            f"{saved['dataset_length']}: an epoch of another dataset cannot be resumed"
        )


def _check_seed(sampler: Any, saved: Mapping[str, Any]) -> None:
    """A DistributedSampler's order is its seed's and shuffle's: the saved ones, or another."""
    if (saved["seed"], saved["shuffle"]) != (sampler.seed, sampler.shuffle):
        raise DataPositionError(
            f"loader: its DistributedSampler has seed={sampler.seed}, shuffle={sampler.shuffle}; "
            f"the position's seed={short(saved['seed'])}, shuffle={short(saved['shuffle'])}: "
            "the epoch's order would differ"
        )


def _batches(indices: list[int], batch_size: int, drop_last: bool) -> list[list[int]]:
    full = len(indices) // batch_size * batch_size
    end = full if drop_last else len(indices)
    return [indices[i : i + batch_size] for i in range(0, end, batch_size)]


class _LoaderView:
    """The loader as its iterator reads it, with this pass's indices; the loader is unchanged."""

    def __init__(self, loader: Any, index_sampler: list[Any]) -> None:
        self._compatshim_loader = loader
        self._index_sampler = index_sampler

    def __getattr__(self, name: str) -> Any:
        if name == "_compatshim_loader":  # not set yet (a copy or unpickle): no recursion
            raise AttributeError(name)
        return getattr(self._compatshim_loader, name)


@contextlib.contextmanager
def _generators_kept(loader: Any, *, own_too: bool = True) -> Iterator[None]:
    """Put torch's default generator and ``loader.generator`` back as they were on leaving.

    ``_BaseDataLoaderIter.__init__`` draws the workers' base seed from one of them.
    ``own_too=False`` leaves ``loader.generator`` as the block left it.
    """
    import torch

    default = torch.get_rng_state()
    own = loader.generator if own_too else None
    own_state = own.get_state() if own is not None else None
    try:
        yield
    finally:
        torch.set_rng_state(default)
        if own is not None:
            own.set_state(own_state)


def _iterator(loader: Any, index_sampler: list[Any]) -> Any:
    """``loader``'s own iterator class over ``index_sampler`` (call under _generators_kept).

    With ``persistent_workers`` the loader keeps it, as it keeps the iterator of every pass:
    its next ``iter(loader)`` resets it over the loader's own sampler (no new workers, no
    base seed drawn), as in the uninterrupted run. This pass reads ``index_sampler`` already.
    """
    iterator = type(loader)._get_iterator(_LoaderView(loader, index_sampler))
    if loader.persistent_workers and loader.num_workers > 0:
        iterator._index_sampler = loader._index_sampler
        loader._iterator = iterator
    return iterator


def resume(loader: Any, state: Mapping[str, Any], *, even: bool = True) -> Resumed:
    """The rest of ``state``'s epoch from ``loader``, built for this rank and world size.

    Sets the sampler's epoch. Same world size, batch size and sampler as at the save: the
    sampler's own order continues after the ``batches`` already taken (their samples are not
    loaded). Otherwise (a ``DistributedSampler`` at both ends, same seed and shuffle) the
    epoch's samples not yet consumed are dealt to the ranks now present; ``even`` as in the
    module's guarantee. Draws from no generator, so it may come before or after
    ``compatshim.rng.load``. Every check comes first: on :class:`DataPositionError` (or a
    TypeError for an argument of the wrong type) the loader and its sampler are unchanged.
    """
    import torch.utils.data as data

    _check_loader(loader)
    saved = _checked(state)
    if type(even) is not bool:
        raise TypeError(f"even: expected True or False, got {short(even)}")
    _check_consumed(saved)
    if saved.get("stateful") is not None and _is_torchdata(
        loader, "stateful_dataloader", "StatefulDataLoader"
    ):
        resumed = _stateful_resume(loader, saved)
        if resumed is not None:
            return resumed
        # another world size (dealt again) or number of workers (replayed): the fields say
        saved = {**saved, "stateful": None}
    layout = _Layout(loader)
    epoch = int(saved["epoch"])
    _check_dataset(layout.length, saved)
    same = (
        saved["same_order"]
        and saved["sampler"] == layout.kind
        and (saved["world_size"], saved["batch_size"], saved["drop_last"])
        == (layout.world_size, layout.batch_size, layout.drop_last)
    )
    if same and layout.distributed:
        sampler = layout.sampler
        same = (saved["seed"], saved["shuffle"], saved["sampler_drop_last"]) == (
            sampler.seed,
            sampler.shuffle,
            sampler.drop_last,
        )
    if same:
        skip = int(saved["batches"])
        length = _length(loader, skip)
        if skip > length:  # position() never writes this: an epoch skipped, silently
            raise DataPositionError(
                f"state: batches={skip}, but the loader has only {length} batches in an epoch"
            )
        layout.set_epoch(epoch)  # checked: the sampler's order is this epoch's from here
        with _generators_kept(loader):  # a sampler of the user's may draw too
            own = list(itertools.islice(iter(loader._index_sampler), skip, None))
            iterator = _iterator(loader, own)
        record = _Pass(epoch, same_order=True, skipped=skip)
        resumed = Resumed(iterator, record, same_order=True, skipped=skip, length=len(own))
        _PASSES[loader] = record
        return resumed
    if not (layout.distributed and isinstance(saved.get("consumed"), int)):
        raise DataPositionError(
            f"loader: saved with {saved['sampler']} at world size {saved['world_size']}, batch "
            f"size {saved['batch_size']}, drop_last={saved['drop_last']}; here {layout.kind} at "
            f"world size {layout.world_size}, batch size {layout.batch_size}, "
            f"drop_last={layout.drop_last}: only a DistributedSampler's epoch (with torch's "
            "BatchSampler) is dealt again at another world size, batch size or drop_last"
        )
    sampler = layout.sampler
    _check_seed(sampler, saved)
    epoch_length, consumed = saved["epoch_length"], saved["consumed"]
    if not isinstance(epoch_length, int) or not 0 <= consumed <= epoch_length <= layout.length:
        raise DataPositionError(
            f"state: consumed={short(consumed)}, epoch_length={short(epoch_length)} do not fit "
            f"a dataset of {layout.length} samples"
        )
    layout.set_epoch(epoch)  # checked: the next epochs are the sampler's own
    order = data.DistributedSampler(
        loader.dataset, num_replicas=1, rank=0, shuffle=sampler.shuffle, seed=sampler.seed
    )
    order.set_epoch(epoch)  # the epoch's order once, without padding: torch's own shuffle
    remaining = list(order)[consumed:epoch_length]
    shares, repeated, dropped = _deal(
        remaining,
        layout.world_size,
        even,
        bool(sampler.drop_last),
        layout.batch_size,
        layout.drop_last,  # False without a batch sampler (batch_size=None): _Layout's
    )
    share = shares[layout.rank]
    batches = _batches(share, layout.batch_size, layout.drop_last)
    indices: list[Any] = batches if loader.batch_sampler is not None else share
    record = _Pass(epoch, same_order=False)
    record.start, record.limit = consumed, len(remaining) - len(dropped)
    record.epoch_length, record.world_size, record.batch_size = (
        epoch_length,
        layout.world_size,
        layout.batch_size,
    )
    record.length = max(-(-len(one) // layout.batch_size) for one in shares)  # cut: whole
    with _generators_kept(loader):
        iterator = _iterator(loader, indices)
    resumed = Resumed(
        iterator,
        record,
        same_order=False,
        skipped=0,
        repeated=repeated,
        dropped=dropped,
        length=len(indices),
    )
    _PASSES[loader] = record
    return resumed


# -- torchdata's StatefulDataLoader: its own state, per rank ------------------------------------


def _is_torchdata(obj: Any, module: str, name: str) -> bool:
    """Whether ``obj`` is (a subclass of) torchdata's ``module.name``, without importing it."""
    return any(
        cls.__name__ == name and cls.__module__.startswith(f"torchdata.{module}")
        for cls in type(obj).__mro__
    )


def _where(loader: Any) -> tuple[_Layout | None, int, int]:
    """(the layout where a sampler replays the order, else None; world size; rank)."""
    try:
        layout = _Layout(loader)
    except DataPositionError:  # an order only the loader's own state replays
        import torch.distributed as dist

        initialised = dist.is_available() and dist.is_initialized()
        world = int(dist.get_world_size()) if initialised else 1
        return None, world, int(dist.get_rank()) if initialised else 0
    return layout, layout.world_size, layout.rank


def _stateful_position(loader: Any, epoch: int, batches: int) -> dict[str, Any]:
    """A StatefulDataLoader's position: the fields of :func:`position` (where a sampler
    replays the order) and ``loader.state_dict()``, which is this rank's (``rank``)."""
    layout, world, rank = _where(loader)
    record = _PASSES.get(loader)
    if record is not None and record.epoch == epoch and not record.from_state:
        # a pass compatshim built from the sampler (dealt again at another world size, or
        # replayed at another number of workers): the loader's state does not describe it,
        # the position's fields do
        return {**_position(loader, epoch, batches, record), "rank": rank, "stateful": None}
    iterator = loader._iterator
    yielded = 0 if iterator is None else int(iterator._num_yielded)
    total = batches
    if record is not None and record.epoch == epoch and yielded == record.skipped + record.taken:
        if batches != record.taken:  # a pass resume() started: batches counts from there
            raise DataPositionError(
                f"batches={batches}, but {record.taken} batches were taken from the iterator "
                f"compatshim.data.resume returned for epoch {epoch}: count the batches of "
                "this pass, not of the whole epoch"
            )
        total = record.skipped + batches
    if yielded != total:
        raise DataPositionError(
            f"batches={batches}, but the StatefulDataLoader yielded {yielded} batches in this "
            "pass: count the batches taken from iter(loader) (or from compatshim.data.resume); "
            "its state counts every batch yielded, so save after the training step"
        )
    if layout is not None:
        state = _position(loader, epoch, total, None)
    else:
        dataset = loader.dataset
        import torch.utils.data as data

        length = 0 if isinstance(dataset, data.IterableDataset) else len(dataset)
        kind = type(loader.sampler)
        state = _fields(
            epoch,
            total,
            f"{kind.__module__}.{kind.__qualname__}",
            length,
            world,
            int(loader.batch_size or 0),
            bool(loader.drop_last),
        )
    with _generators_kept(loader):  # before iter(loader), state_dict() builds the iterator
        own = loader.state_dict()
    return {**state, "rank": rank, "stateful": own}


class _Finished(Iterator[Any]):
    """The rest of a finished pass: nothing (the loader's next ``iter`` starts the next)."""

    def __next__(self) -> Any:
        raise StopIteration

    def __len__(self) -> int:
        return 0


def _holds_dataset_state(value: Any) -> bool:
    """Whether a StatefulDataLoader state holds a dataset's (or a dataset iterator's) own
    state, in the main process or any worker's snapshot."""
    if isinstance(value, Mapping):
        for key, inner in value.items():
            if key in ("dataset_state", "dataset_iter_state") and inner is not None:
                return True
            if _holds_dataset_state(inner):
                return True
    return False


def _saved_workers(stateful: Mapping[str, Any]) -> int | None:
    """The ``num_workers`` of the loader whose ``state_dict()`` this is; None if it is none.

    torchdata asserts (a raw AssertionError, from ``iter(loader)``) that a state loads into as
    many workers: ``_num_yielded`` for none, a ``_snapshot`` of each worker's for some.
    """
    snapshot = stateful.get("_snapshot")
    if isinstance(snapshot, Mapping):
        main, workers = snapshot.get("_main_snapshot"), snapshot.get("_worker_snapshots")
        count = main.get("_num_workers") if isinstance(main, Mapping) else None
        if type(count) is int and count > 0:
            return count
        return len(workers) if isinstance(workers, Mapping) and workers else None
    return 0 if type(stateful.get("_num_yielded")) is int else None


# what torchdata raises loading a state it cannot use: its own checks (AssertionError,
# ValueError), a missing or mistyped entry, a count past the pass's end (StopIteration; in a
# generator, RuntimeError)
_TORCHDATA_ERRORS = (
    KeyError,
    IndexError,
    TypeError,
    ValueError,
    AssertionError,
    AttributeError,
    ArithmeticError,
    StopIteration,
    RuntimeError,
)


def _check_counts(loader: Any, saved: Mapping[str, Any]) -> None:
    """The loader's state counts the position's ``batches`` (before any change).

    torchdata trusts the counts in a state: ``_num_yielded`` (``_snapshot_step`` plus
    ``_steps_since_snapshot`` with workers), the batches its sampler's iterator yielded, and
    torchdata's BatchSampler's ``samples_yielded`` (its RandomSampler's ``yielded``). A missing
    or negative one restarted the pass (the epoch served again), a huge one ran it out (a bare
    StopIteration), a mistyped one failed at the first batch. The relations are those of
    torchdata's own ``state_dict()``: its main-process state is the snapshot's, at
    ``_snapshot_step`` batches, and a pass's last batch may have fewer samples (or, with
    ``drop_last``, the samples left out are counted once the pass is over).
    """
    import torch.utils.data as data

    stateful, batches = saved["stateful"], saved["batches"]

    def number(value: Any, where: str) -> int:
        if type(value) is not int or value < 0:
            raise DataPositionError(
                f"state['stateful']{where}: expected an int >= 0, got {short(value)}"
            )
        return value

    def refuse(where: str, value: int, why: str) -> DataPositionError:
        return DataPositionError(
            f"state['stateful']{where}={short(value)}, but {why}: the loader's state and the "
            "position's fields must describe the same pass (an edited state repeats or skips "
            "samples)"
        )

    finished = stateful.get("_iterator_finished")
    if type(finished) is not bool:
        raise DataPositionError(
            "state['stateful']['_iterator_finished']: expected True or False, got "
            + short(finished)
        )
    snapshot = stateful.get("_snapshot")
    if isinstance(snapshot, Mapping):  # with workers: the main process's state at a snapshot
        main, inside = snapshot.get("_main_snapshot"), "['_snapshot']['_main_snapshot']"
        if not isinstance(main, Mapping):
            raise DataPositionError(
                f"state['stateful']{inside}: expected a dict, got {short(main)}"
            )
        at = number(snapshot.get("_snapshot_step"), "['_snapshot']['_snapshot_step']")
        since = number(stateful.get("_steps_since_snapshot"), "['_steps_since_snapshot']")
        worker = snapshot.get("_last_yielded_worker_id")
        if type(worker) is not int or not 0 <= worker < int(loader.num_workers):
            raise DataPositionError(
                "state['stateful']['_snapshot']['_last_yielded_worker_id']: expected an int "
                f"from 0 to {int(loader.num_workers) - 1}, got {short(worker)}"
            )
        if at + since != batches:
            raise refuse(
                "['_steps_since_snapshot']",
                since,
                f"with _snapshot_step={at} that is {at + since} batches, batches={batches}",
            )
    else:
        main, inside = stateful, ""
        at = number(stateful.get("_num_yielded"), "['_num_yielded']")
        if at != batches:
            raise refuse("['_num_yielded']", at, f"state['batches']={batches}")
    drawn = number(main.get("_sampler_iter_yielded"), inside + "['_sampler_iter_yielded']")
    if isinstance(loader.dataset, data.IterableDataset):
        return  # an endless index sampler: the dataset's own state (or a fast-forward) decides
    if drawn != at:
        raise refuse(
            inside + "['_sampler_iter_yielded']", drawn, f"{at} batches were yielded at the save"
        )
    try:
        length: int | None = len(loader)
    except TypeError:  # a batch sampler of the user's without a length
        length = None
    if length is not None and batches > length:  # an epoch skipped, silently
        raise DataPositionError(
            f"state: batches={batches}, but the loader has only {length} batches in an epoch"
        )
    if length is not None and finished and batches != length:  # the rest skipped, silently
        raise refuse(
            "['_iterator_finished']", finished, f"state['batches']={batches} of {length} batches"
        )
    batcher, sampler = loader.batch_sampler, loader.sampler
    random = _is_torchdata(sampler, "stateful_dataloader", "RandomSampler")
    where = inside + "['_sampler_iter_state']"
    state = main.get("_sampler_iter_state")
    if _is_torchdata(batcher, "stateful_dataloader", "BatchSampler"):
        if not isinstance(state, Mapping):
            raise DataPositionError(
                f"state['stateful']{where}: expected torchdata's BatchSampler's state (a dict "
                f"with 'samples_yielded'), got {short(state)}"
            )
        samples = number(state.get("samples_yielded"), where + "['samples_yielded']")
        size, cut = int(batcher.batch_size), bool(batcher.drop_last)
        try:
            total: int | None = len(sampler)
        except TypeError:
            total = None
        full = at * size if total is None else min(at * size, total)
        fits = samples == full or (  # the last batch is partial, or (drop_last) the end counted
            (total is None and at > 0 and (at - 1) * size < samples < full)
            or (cut and total is not None and at == total // size and samples == total)
        )
        if not fits:
            raise refuse(
                where + "['samples_yielded']",
                samples,
                f"{at} batches of {size} were yielded at the save",
            )
        where, state = where + "['sampler_iter_state']", state.get("sampler_iter_state")
    elif batcher is None:  # batch_size=None: the sampler's own iterator, one sample a batch
        samples = at
    else:
        return
    if random:  # torchdata's RandomSampler replays from its own count
        if not isinstance(state, Mapping):
            raise DataPositionError(
                f"state['stateful']{where}: expected torchdata's RandomSampler's state (a dict "
                f"with 'yielded'), got {short(state)}"
            )
        drawn = number(state.get("yielded"), where + "['yielded']")
        if drawn != samples:
            raise refuse(where + "['yielded']", drawn, f"{samples} samples were drawn at the save")


def _stateful_resume(loader: Any, saved: Mapping[str, Any]) -> Resumed | None:
    """The rest of the pass from the loader's own state at the saving world size, rank and
    number of workers; None where compatshim walks the sampler instead (another world size:
    torch's DistributedSampler over a dataset without state of its own, dealt again; another
    number of workers: a sampler that replays its order, over such a dataset); else
    DataPositionError, with the loader and sampler unchanged."""
    import copy

    import torch.utils.data as data

    layout, world, rank = _where(loader)
    if saved["world_size"] != world:
        if _holds_dataset_state(saved["stateful"]):
            raise DataPositionError(
                f"state: saved at world size {saved['world_size']}, here {world}: the "
                "StatefulDataLoader's state holds the dataset's own state, which is per rank "
                "and cannot be dealt to another number of ranks"
            )
        if layout is None or not layout.distributed or saved["consumed"] is None:
            raise DataPositionError(
                f"state: saved at world size {saved['world_size']}, here {world}: a "
                "StatefulDataLoader's state is per rank, and its "
                f"{short(saved['sampler'])} order cannot be dealt to another number of ranks "
                "(only torch's DistributedSampler, with a BatchSampler, is dealt again)"
            )
        return None
    if saved.get("rank") != rank:
        raise DataPositionError(
            f"state: saved by rank {short(saved.get('rank'))} of {world}; this is rank {rank}: "
            "a StatefulDataLoader's state is per rank (keep each rank's position under its "
            "own key)"
        )
    here = (
        (layout.kind, layout.batch_size, layout.drop_last)
        if layout is not None
        else (
            f"{type(loader.sampler).__module__}.{type(loader.sampler).__qualname__}",
            int(loader.batch_size or 0),
            bool(loader.drop_last),
        )
    )
    there = (saved["sampler"], saved["batch_size"], saved["drop_last"])
    if here != there:
        raise DataPositionError(
            f"loader: {here[0]} with batch size {here[1]}, drop_last={here[2]}; the position's "
            f"{there[0]} with batch size {there[1]}, drop_last={there[2]}: its state would "
            "replay another order"
        )
    if layout is not None:  # the state replays the saved sampler's iterator: the same order?
        _check_dataset(layout.length, saved)
        if layout.distributed:
            _check_seed(layout.sampler, saved)
    elif not isinstance(loader.dataset, data.IterableDataset):  # a permutation of its length
        _check_dataset(len(loader.dataset), saved)
    workers, now = _saved_workers(saved["stateful"]), int(loader.num_workers)
    if workers is None:
        raise DataPositionError(
            "state['stateful']: not a StatefulDataLoader's state_dict() (it has neither "
            "'_num_yielded' nor a '_snapshot' of its workers)"
        )
    if workers != now:
        if layout is None:
            why = (
                f"its {short(saved['sampler'])} order is in the loader's state only (a sampler "
                "drawing from a generator, or an IterableDataset)"
            )
        elif _holds_dataset_state(saved["stateful"]):
            why = "its state holds the dataset's own state, which torchdata keeps per worker"
        else:
            return None  # the sampler replays the order: its indices are walked below
        raise DataPositionError(
            f"loader: num_workers={now}, the position's num_workers={workers}: torchdata loads a "
            f"StatefulDataLoader's state only into as many workers, and {why}"
        )
    _check_counts(loader, saved)
    epoch = int(saved["epoch"])
    chain = layout.owners() if layout is not None else [loader.sampler, loader.batch_sampler]
    owners = [owner for owner in chain if hasattr(owner, "set_epoch")]
    before = [(owner, getattr(owner, "epoch", None)) for owner in owners]
    kept = (loader.next_iter_state, loader._iterator)
    for owner in owners:
        owner.set_epoch(epoch)
    own = copy.deepcopy(dict(saved["stateful"]))
    try:  # torchdata checks the state's inside only here: a failure puts everything back
        loader.load_state_dict(own)
        if own.get("_iterator_finished") is True:
            # a finished pass: iter(loader) would start the next one under the saved epoch
            iterator: Any = _Finished()
        else:
            # the loader's generator, where its sampler shuffles with it (torchdata's
            # RandomSampler), is set from the state here: putting it back as it was would
            # shuffle the next passes otherwise than the uninterrupted run
            shared = loader.generator is not None and any(
                getattr(one, "generator", None) is loader.generator
                for one in (loader.sampler, getattr(loader.batch_sampler, "sampler", None))
            )
            with _generators_kept(loader, own_too=not shared):
                iterator = iter(loader)
    except _TORCHDATA_ERRORS as exc:
        loader.next_iter_state, loader._iterator = kept
        for owner, was in before:
            if was is not None:
                owner.set_epoch(was)
        raise DataPositionError(
            f"state['stateful']: torchdata could not load it ({type(exc).__name__}: "
            f"{short(str(exc))}); the loader is as it was"
        ) from None
    skipped = int(saved["batches"])
    record = _Pass(epoch, same_order=True, skipped=skipped, from_state=True)
    _PASSES[loader] = record
    left: int | None = 0
    if not isinstance(iterator, _Finished):
        try:
            left = max(len(loader) - skipped, 0)
        except TypeError:  # an IterableDataset without a length
            left = None
    return Resumed(iterator, record, same_order=True, skipped=skipped, length=left)
