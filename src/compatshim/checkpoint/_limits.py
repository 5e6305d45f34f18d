"""The bounds every reader shares: the work budget, what an item costs, shapes.

One place for each number, so a reader cannot drift from the others: the
budget a load draws from (bytes that calls may allocate, a small multiple of the
file's size), the load machine's hashing allowance, the bytes each container item
is charged, the most dimensions and items any array may claim, and a count of
costly objects that is not bytes (:class:`Quota`). Imports nothing but the errors
and ``_text``.
"""

from __future__ import annotations

import collections
from typing import Any

from .._text import short
from .errors import CheckpointError

BUDGET_PER_BYTE = 8
BUDGET_FLOOR = 1 << 25  # small files may still build a few MB (a metrics dict, an RNG state)
MAX_DIMS = 64  # torch's own limit; numpy's is 64 from 2.0 (32 before)
MAX_ITEMS = 2**62  # per dimension and in all: more than any array holds, far under int64

# the load machine's work allowance (hashing, characters copied): elements per byte of the
# pickle, plus the floor (~0.3 s of tuple hashing at worst); see ``_machine``
HASH_PER_BYTE = 16
HASH_FLOOR = 1 << 24

# bytes a DCP item written through a stream transform (zstd, 2.8+) may expand to: this many
# per stored byte, plus, for a tensor's item, the bytes .metadata declares for it (what the
# template already holds): a 33 KB zstd frame of zeros is 1 GiB, which torch reads whole
EXPANSION_PER_BYTE = 64

# tensors one load may make: one per TENSOR_BYTES of the file, plus TENSOR_FLOOR. A tensor
# costs 0.5-1 KB (its Python object, TensorImpl, sizes and strides) whatever made it, and
# memo references made one per 5 bytes of a file (96x its size in memory). torch.save
# spends 31+ bytes on one (protocol 4, views of one element), 48+ on a Parameter with its data
TENSOR_BYTES = 24
TENSOR_FLOOR = 1 << 16

HEADER_BYTES = 16  # charged once per call or container, whatever its length
VISIT_BYTES = 64  # an element of a list walked after the load, at each use (:class:`Walks`)
CHUNK_BYTES = 32  # the bytes of a DCP .metadata each chunk use must be paid by (:class:`Walks`)
#: bytes one item may cost once copied: a character, a pointer, a hash slot
ITEM_BYTES: dict[type, int] = {
    str: 1,
    bytes: 1,
    bytearray: 1,
    tuple: 8,
    list: 8,
    dict: 50,
    set: 50,
    frozenset: 50,
}
# built by calls, charged sys.getsizeof of what was built (C sizes: no code of the file runs)
SIZED = frozenset(
    {
        str,
        bytes,
        bytearray,
        tuple,
        list,
        dict,
        set,
        frozenset,
        collections.OrderedDict,
        collections.Counter,
        collections.defaultdict,
        collections.deque,
    }
)


class Budget:
    """Bytes a load may still allocate through calls (estimated; see :func:`weight`).

    ``BUDGET_PER_BYTE`` times the file's size, plus ``BUDGET_FLOOR``; nested loads
    (storages pickled inside a pickle) draw from the same budget. What the opcodes
    build directly is bounded by the file already; the budget bounds what calls add
    on top, which memo references could otherwise repeat without limit.
    """

    def __init__(self, file_size: int, floor: int = BUDGET_FLOOR) -> None:
        self.total = BUDGET_PER_BYTE * max(file_size, 0) + floor
        self.left = self.total
        self.file_size = file_size
        #: tensor objects, counted apart from bytes (see TENSOR_BYTES); nested loads share it
        self.tensors = Quota(
            max(file_size, 0) // TENSOR_BYTES + TENSOR_FLOOR,
            f"tensors (one per {TENSOR_BYTES} bytes of the file, plus {TENSOR_FLOOR}; "
            "shared references are counted at every use)",
        )

    def charge(self, units: int, what: str) -> None:
        self.left -= units
        if self.left < 0:
            raise CheckpointError(
                f"{what} goes over the work budget of {self.total} bytes for a file of "
                f"{self.file_size} bytes (shared references are counted at every use): "
                "the file asks for far more work or memory than it holds"
            )


class Walks:
    """The lists torch walks once a DCP ``.metadata`` is read, charged at each use by both
    readers of the file (a file may share one list, or one ``torch.Size``, among every
    entry by memo reads): each chunk :data:`CHUNK_BYTES` of the file's size, no floor
    (torch's load planner makes a ~720-byte read item of it; a chunk torch writes takes
    120+ bytes with its storage entry), each planner_data route part to the read's own
    budget (a real part is a 2-byte memo read)."""

    def __init__(self, budget: Budget) -> None:
        self.budget = budget
        self.chunks = Budget(budget.file_size, floor=0)

    def chunk_list(self, length: int, where: str) -> None:
        """``where``: the file and the entry's fqn."""
        units = BUDGET_PER_BYTE * CHUNK_BYTES * length
        self.chunks.charge(units, f"{where}: walking its chunk list")

    def route(self, length: int, where: str) -> None:
        """``where``: the file."""
        self.visit(length, f"{where}: walking planner_data's routes")

    def visit(self, length: int, what: str) -> None:
        """Any other list or tuple checked at each use, ``length`` items (a memo-shared
        ``transform_descriptors`` list, one ``TensorProperties`` behind every entry)."""
        self.budget.charge(VISIT_BYTES * length, what)


class Quota:
    """A count of costly objects one load may make, apart from the byte budget (tensors,
    numpy's bit generators: KBs and tens of microseconds each, made from a few bytes)."""

    def __init__(self, limit: int, what: str) -> None:
        self.limit = limit
        self.left = limit
        self.what = what

    def take(self, units: int = 1) -> None:
        self.left -= units
        if self.left < 0:
            raise CheckpointError(f"more {self.what} than one file may hold ({self.limit} units)")


def hash_allowance(pickle_size: int) -> int:
    """Elements the load machine may hash (or characters copy) for a pickle of this size."""
    return HASH_PER_BYTE * max(pickle_size, 0) + HASH_FLOOR


def cost(kind: type, items: int) -> int:
    """Bytes charged for a container of ``kind`` (a key of :data:`ITEM_BYTES`) holding
    ``items`` items."""
    return HEADER_BYTES + ITEM_BYTES[kind] * items


def weight(args: Any) -> int:
    """Bytes a call handed ``args`` may allocate by copying them: per character or byte, per
    list/tuple item (a pointer) and per set/dict entry (a hash slot), an int by its size (a
    constructor does arithmetic on it: one memo-shared pair of 180 KB ints handed to
    ``timedelta`` 100,000 times took 29 s), one level inside tuples too (numpy's array state
    holds its bytes there). Iterates nothing but those tuples."""
    total = HEADER_BYTES
    for arg in args if type(args) is tuple else (args,):
        per_item = ITEM_BYTES.get(type(arg))
        if per_item is not None:
            total += per_item * len(arg)
            if type(arg) is tuple:
                for item in arg:
                    inner = ITEM_BYTES.get(type(item))
                    if inner is not None:
                        total += inner * len(item)
                    elif type(item) is int:
                        total += item.bit_length() >> 3
        elif type(arg) is int:
            total += arg.bit_length() >> 3
    return total


def check_shape(
    value: Any, what: str, name: str = "shape", kinds: tuple[type, ...] = (tuple,)
) -> tuple[int, ...]:
    """``value`` as a shape (or strides): one of ``kinds``, at most :data:`MAX_DIMS` ints, each
    in ``0..MAX_ITEMS`` (checked before any product: a huge int multiplies slowly)."""
    if type(value) not in kinds or len(value) > MAX_DIMS:
        raise CheckpointError(f"{what}: {name} is {short(value)}, expected up to {MAX_DIMS} ints")
    for dim in value:
        if type(dim) is not int or not 0 <= dim <= MAX_ITEMS:
            raise CheckpointError(f"{what}: {name} holds {short(dim)}")
    return tuple(value)


def count(dims: tuple[int, ...], what: str) -> int:
    """Items of a checked shape; more than :data:`MAX_ITEMS` is refused."""
    total = 1
    for dim in dims:
        total *= dim
    if total > MAX_ITEMS:
        raise CheckpointError(f"{what}: {total} items is more than any array holds")
    return total
