"""A small pickle virtual machine (protocols 0-5) that decides nothing about globals itself.

It decodes opcodes and keeps the stack, the marks and the memo; everything that
could run code or reach an object the file did not create goes through hooks a
subclass implements: ``find_global``, ``call`` (REDUCE / INST / OBJ),
``new_object`` (NEWOBJ / NEWOBJ_EX), ``build`` (BUILD), ``persistent_load``, and
the container mutations ``set_items``, ``append_items``, ``add_items``.

Bounds that hold whatever the bytes: a length over ``SMALL_READ`` (64 KiB) is
checked against the bytes left before anything is read or allocated, a shorter
one when its read comes back short; mark nesting is bounded; the machine
is iterative (no Python recursion per level of nesting); tuples and frozensets
(the containers ``hash`` recurses into, in C, without a recursion check) are
refused beyond ``MAX_NESTING`` levels *when they are built*, so no value the file
makes can crash a dict key, a set or the caller's ``hash()``; copyreg extension
codes and out-of-band buffers are refused.

Hashing is charged by what it costs, not by the bytes that ask for it: a tuple's
hash is not cached and visits every element of its expansion (a memoized DAG
``T(i+1) = (Ti, Ti)`` of 40 levels is 701 bytes and 2**40 elements), so each
tuple/frozenset carries its expanded size (elements, plus the digits of ints
over 60 bits, whose hash is not cached either), one over ``hash_allowance`` is
refused when built, and every key the machine or a handler hashes is charged
its expanded size against that allowance (:meth:`Machine.charge_keys`), as is a
STACK_GLOBAL name built from memoized strings. Keys that can be made to share one
hash value (ints over 60 bits, tuples, frozensets, complex numbers; str and bytes
hashes are salted per process) are counted by hash: more than ``MAX_CLASHES``
different keys with one hash is a collision file (each insert would probe them all).
Errors other than the library's own are turned into :class:`CheckpointError` by
the caller (``run``).
"""

from __future__ import annotations

import _compat_pickle
import codecs
import io
import struct
import sys
import types
from typing import IO, Any, Callable

from ._limits import BUDGET_FLOOR, BUDGET_PER_BYTE, hash_allowance
from .errors import CUT_SHORT, CheckpointError, UndecodableTextError, UnsafeCheckpointError

MAX_MARK_DEPTH = 2000
MAX_NESTING = 1000
_DEPTH_BITS = 11  # a depth (at most MAX_NESTING) in the low bits of _depth's values
_DEPTH_MASK = (1 << _DEPTH_BITS) - 1
MAX_LINE = 1 << 20
MAX_CLASHES = 64  # different keys sharing one full hash value
_SHORT_TEXT = 64  # a str or bytes key this long or shorter is never counted (state-dict keys)
_SMALL_INT = 1 << 60  # ints below this (in magnitude) hash to themselves in O(1)
#: element types whose hash is O(1) or cached (str, bytes), or raises at once (list, dict)
_FLAT = frozenset({int, str, bytes, float, bool, type(None), complex, list, dict, set, bytearray})
MAX_OBJECT_NESTING = 100  # objects hashing objects (a Python __hash__ reading attributes)
HIGHEST_PROTOCOL = 5
SMALL_READ = 1 << 16  # a read this short is done first and its length checked after
_I32 = struct.Struct("<i")
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_F64 = struct.Struct(">d")


class Source:
    """Bounded reads from a seekable binary file: a long read is checked before it is made,
    a short one (at most ``SMALL_READ`` bytes, however large the file says) after."""

    def __init__(self, file: IO[bytes]) -> None:
        self.file = file
        here = file.tell()
        self.end = file.seek(0, io.SEEK_END)  # reads past it come back short (see ``read``)
        file.seek(here)
        self.read1 = file.read

    def remaining(self) -> int:
        return self.end - self.file.tell()

    def read(self, count: int) -> bytes:
        if 0 <= count <= SMALL_READ:  # allocates little whatever the file says: read, then check
            data = self.read1(count)
            if len(data) != count:
                raise _past_end(count, len(data))
            return data
        if count < 0 or count > self.remaining():
            raise _past_end(count, max(self.remaining(), 0))
        data = self.file.read(count)
        if len(data) != count:
            raise CUT_SHORT("the data ends early")
        return data

    def byte(self) -> int:
        data = self.read1(1)
        if not data:
            raise _past_end(1, 0)
        return data[0]

    def unpack(self, fmt: struct.Struct) -> Any:
        data = self.read1(fmt.size)
        if len(data) != fmt.size:
            raise _past_end(fmt.size, len(data))
        return fmt.unpack(data)[0]

    def readline(self) -> bytes:
        limit = min(self.remaining(), MAX_LINE) + 1
        line = self.file.readline(limit)
        if not line.endswith(b"\n"):
            if len(line) < limit:  # the data ended first
                raise CUT_SHORT("a text opcode's line has no end: the pickle is cut short")
            raise CheckpointError(f"a text opcode's line is longer than {MAX_LINE} bytes")
        return line[:-1]


def _past_end(count: int, left: int) -> CheckpointError:
    message = f"a length of {count} bytes runs past the end of the data ({left} bytes left)"
    return CUT_SHORT(message) if count >= 0 else CheckpointError(message)


class Stop(Exception):
    """Raised by STOP to leave the opcode loop with the result."""

    def __init__(self, value: Any) -> None:
        self.value = value


def _unquote(line: bytes) -> bytes:
    if len(line) >= 2 and line[0] == line[-1] and line[:1] in (b"'", b'"'):
        return line[1:-1]
    raise CheckpointError("STRING opcode argument is not quoted")


_NONE = object()
# what an empty container takes (sys.getsizeof); its items are the file's own opcodes
_SIZES = {kind: sys.getsizeof(kind()) for kind in (list, dict, set, frozenset, tuple)}


def py2_str_encoding(encoding: Any) -> str:
    """How Python 2 ``str`` is read for ``encoding=`` (``torch.load``'s, ``numpy.load``'s):
    a codec's name, ``"bytes"`` (kept as bytes), or None (UTF-8). LookupError for an
    unknown codec, as pickle's."""
    if encoding is None:
        return "utf-8"
    if not isinstance(encoding, str):
        raise LookupError(f"encoding must be a str, not {type(encoding).__name__}")
    return encoding if encoding == "bytes" else codecs.lookup(encoding).name


Handler = Callable[["Machine"], None]


class Machine:
    """Opcode decoding; subclasses supply the policy hooks."""

    _last_size = 1  # expanded size found by the latest ``nesting`` call
    # opcode -> handler taking the machine, one table per class (see :func:`_dispatch_table`)
    _dispatch: dict[bytes, Handler] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._dispatch = _dispatch_table(cls)

    def __init__(self, source: Source, encoding: str = "utf-8") -> None:
        self.source = source
        self.encoding = encoding  # Python 2 str: see py2_str_encoding
        self.stack: list[Any] = []
        self.metastack: list[list[Any]] = []
        # the memo by index: a list where the writer numbers entries in order (every writer:
        # a pointer an entry, where a dict took ~80 bytes), a dict for indices past its end
        # (only ever >= len(memo): a put that reaches one in order drops it, as stale)
        self.memo: list[Any] = []
        self._memo_past: dict[int, Any] = {}
        self.proto = 0
        # tuples and frozensets deeper than one level or dearer to hash than their length:
        # id -> its depth and expanded size in one int (depth | size << _DEPTH_BITS), each
        # kept alive by a list (a pointer, where a second dict took ~40 bytes) so its id names
        # it alone for the whole load
        self._kept: list[Any] = []
        self._depth: dict[int, int] = {}
        self.hash_left = self._hash_cap = hash_allowance(source.end)
        self._first_of_hash: dict[int, Any] = {}  # hash -> the first counted key with it
        self._clashes: dict[int, int] = {}  # hash -> different keys seen with it
        self._compared: dict[int, tuple[Any, int]] = {}  # id -> (tuple, what == on it visits)
        # id -> (object, what hashing it visits): instances whose class hashes in Python from
        # their attributes (a frozen dataclass: DCP's MetadataIndex hashes (fqn, offset)),
        # measured once; such an object takes no more state after (SafeMachine.build)
        self._objects: dict[int, tuple[Any, int]] = {}
        # bytes the opcodes' own containers may take: an empty set is 216 bytes for one byte
        # of file, so they are counted as the load's calls are (BUDGET_PER_BYTE x + floor)
        self.built_left = BUDGET_PER_BYTE * source.end + BUDGET_FLOOR

    # ------------------------------------------------------------------ hooks
    def built(self, value: Any) -> Any:
        """``value``, a container an opcode made, counted by what it takes in memory."""
        self.built_left -= _SIZES[type(value)]
        if self.built_left < 0:
            raise CheckpointError(
                "the pickle's own opcodes build more containers than the file's size allows "
                f"({BUDGET_PER_BYTE} bytes a byte of file, plus {BUDGET_FLOOR >> 20} MiB)"
            )
        return value

    def find_global(self, module: str, name: str) -> Any:
        raise NotImplementedError

    def call(self, func: Any, args: tuple[Any, ...]) -> Any:
        raise NotImplementedError

    def new_object(self, cls: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        raise NotImplementedError

    def build(self, inst: Any, state: Any) -> None:
        raise NotImplementedError

    def persistent_load(self, pid: Any) -> Any:
        raise NotImplementedError

    def set_items(self, target: Any, pairs: list[Any]) -> None:
        raise NotImplementedError

    def append_items(self, target: Any, items: list[Any]) -> None:
        raise NotImplementedError

    def add_items(self, target: Any, items: list[Any]) -> None:
        raise NotImplementedError

    # ------------------------------------------------------------------ loop
    def run(self) -> Any:
        """Execute opcodes up to STOP and return the object; the source stays after STOP."""
        read1 = self.source.read1
        dispatch = self._dispatch
        try:
            while True:
                op = read1(1)
                handler = dispatch.get(op)
                if handler is None:
                    if not op:
                        raise CUT_SHORT("the pickle ends before its STOP opcode")
                    raise CheckpointError(f"unknown pickle opcode 0x{op[0]:02x}")
                handler(self)
        except Stop as stop:
            return stop.value

    def release(self) -> None:
        """Drop what only the opcodes needed (the memo, the hashing and nesting tables) once
        :meth:`run` has made the result: the walk of it that follows peaks without them."""
        self.stack, self.metastack, self.memo, self._kept = [], [], [], []
        self._memo_past, self._depth, self._objects = {}, {}, {}
        self._first_of_hash, self._clashes, self._compared = {}, {}, {}

    # ------------------------------------------------------------------ helpers
    def _pop(self) -> Any:
        if not self.stack:
            raise CheckpointError("pickle stack underflow")
        return self.stack.pop()

    def _top(self) -> Any:
        if not self.stack:
            raise CheckpointError("pickle stack underflow")
        return self.stack[-1]

    def nesting(self, items: Any) -> int:
        """Depth of a tuple/frozenset made of ``items``; refused beyond :data:`MAX_NESTING`,
        or when hashing it once would cost more than the whole hashing allowance. Its
        expanded size is kept for :meth:`hashable` (one attribute: no tuple per call)."""
        deepest = 0
        size = 1
        depths = self._depth
        for item in items:
            kind = type(item)
            if kind is tuple or kind is frozenset:
                packed = depths.get(id(item))
                if packed is not None:
                    depth = packed & _DEPTH_MASK
                    size += packed >> _DEPTH_BITS
                else:
                    depth = 1
                    size += len(item) + 1
                if depth > deepest:
                    deepest = depth
            elif kind is int and not -_SMALL_INT < item < _SMALL_INT:
                size += 1 + (item.bit_length() >> 5)
            elif kind in _FLAT:
                size += 1
            else:  # an object whose own __hash__ may walk what its attributes hold
                size += self.object_cost(item)
        if deepest >= MAX_NESTING:
            raise CheckpointError(f"tuples or frozensets nested deeper than {MAX_NESTING} levels")
        if size > self._hash_cap:  # hash_allowance(), without a call per tuple
            raise CheckpointError(
                f"a tuple or frozenset of {size} elements once its shared parts are expanded "
                f"(hashing it visits each): over the {self.hash_allowance()} this file allows"
            )
        self._last_size = size
        return deepest + 1

    def hash_allowance(self) -> int:
        return self._hash_cap  # hash_allowance(source.end), worked out once

    def hashable(self, value: Any, depth: int) -> Any:
        """Remember a tuple/frozenset deeper than one level or dearer to hash than its length
        (keeps it alive for ``id``); ``depth`` from :meth:`nesting` of its items, just before."""
        size = self._last_size
        if depth > 1 or size > len(value) + 1:
            self._kept.append(value)
            self._depth[id(value)] = depth | size << _DEPTH_BITS
        return value

    def expanded(self, value: Any) -> int:
        """Elements hashing ``value`` visits (a tuple or frozenset this machine saw built)."""
        packed = self._depth.get(id(value))
        return len(value) + 1 if packed is None else int(packed >> _DEPTH_BITS)

    def charge_keys(self, keys: Any) -> None:
        """Charge hashing ``keys`` (each use of a shared tuple costs its expanded size) and
        count keys that share one hash value, whatever their type (a ``torch.Size``, a
        ``numpy.complex128``, DCP's ``MetadataIndex``: each a 4-12 s quadratic file before);
        str and bytes cache their (salted) hash."""
        for key in keys:
            kind = type(key)
            if kind is str or kind is bytes:
                if len(key) > _SHORT_TEXT:  # an equal copy is compared character by character
                    self._count_clash(key)
                continue
            if kind is int:
                if -_SMALL_INT < key < _SMALL_INT:
                    continue
                cost = 1 + (key.bit_length() >> 5)
            elif kind is tuple or kind is frozenset or isinstance(key, (tuple, frozenset)):
                cost = self.expanded(key)  # torch.Size too: a tuple's hash, and ==
            else:  # complex, its subclasses, an allowed class's own __hash__ (MetadataIndex):
                # what its hash visits (1 for a C hash); keys sharing a hash are counted
                # whatever their type
                cost = self.object_cost(key)
            self.charge(cost, "hashing the file's keys")
            self._count_clash(key)

    def charge(self, units: int, what: str) -> None:
        """Draw ``units`` (elements hashed, characters copied) from the work allowance."""
        self.hash_left -= units
        if self.hash_left < 0:
            raise CheckpointError(
                f"{what} visits more than {self.hash_allowance()} elements or characters "
                "(a shared tuple, long int or string costs its full size at every use): "
                "the file asks for far more work than it holds"
            )

    def _count_clash(self, key: Any) -> None:
        try:
            value = hash(key)
        except TypeError:
            return  # the container's own insert raises it
        first = self._first_of_hash.get(value, _NONE)
        if first is _NONE:
            self._first_of_hash[value] = key
            return
        if first is key:
            return
        # another object with this hash: == walks both (two equal trees of distinct 100 KB
        # strings, memo-shared 2**22 times: 200 KB of file, 15 s of CPU), here and in each
        # insert, against every key of this hash the container holds
        clashes = self._clashes.get(value, 0)
        self.charge(self._compare_cost(key) * (2 + clashes), "comparing the file's keys")
        try:
            if type(first) is type(key) and bool(first == key):
                return
            # numpy's str_/bytes_ keys equal to plain ones: one key, compared by C code only
            if isinstance(first, str) and isinstance(key, str) and str.__eq__(first, key):
                return
            if isinstance(first, bytes) and isinstance(key, bytes) and bytes.__eq__(first, key):
                return
        except Exception:  # an element's own comparison failed: count it as different
            pass
        clashes += 1
        self._clashes[value] = clashes
        if clashes > MAX_CLASHES:
            raise CheckpointError(
                f"more than {MAX_CLASHES} different keys share one hash value: a hash-collision "
                "file (every insert would compare it with all of them)"
            )

    def _compare_cost(self, root: Any) -> int:
        """Elements and characters ``==`` of ``root`` with an equal copy visits: each use of
        a shared tuple or frozenset at its full size, a str or bytes by its length. Each
        distinct container is summed once (kept by id), so this walk costs what the file
        holds."""
        if type(root) is not tuple and type(root) is not frozenset:
            if type(root) is str or type(root) is bytes:
                return len(root)
            return self.object_cost(root)  # a dataclass's == compares its fields
        known = self._compared
        todo = [root]
        while todo:
            node = todo[-1]
            if (seen := known.get(id(node))) is not None and seen[0] is node:
                todo.pop()
                continue
            inner = [
                item
                for item in node
                if (type(item) is tuple or type(item) is frozenset)
                and ((seen := known.get(id(item))) is None or seen[0] is not item)
            ]
            if inner:
                todo += inner
                continue
            todo.pop()
            cost = 1
            for item in node:
                kind = type(item)
                if kind is tuple or kind is frozenset:
                    cost += known[id(item)][1]
                elif kind is str or kind is bytes:
                    cost += len(item)
                elif kind in _FLAT:
                    cost += 1
                else:
                    cost += self.object_cost(item)
            known[id(node)] = (node, cost)
        return known[id(root)][1]

    def object_cost(self, obj: Any, depth: int = 0) -> int:
        """Elements hashing ``obj`` visits, where its class hashes in Python (``__hash__`` a
        function, as a frozen dataclass's or omegaconf's ``ValueNode``'s: they hash what
        their attributes hold, at every use, uncached): one, plus each attribute's cost (a
        shared tuple's expanded size, a long int's digits, a string's length: ``==`` with an
        equal copy reads it all, such an object's own cost).
        Any other object costs one (a C hash: a dtype, a device), but a str or bytes
        subclass its length (numpy's ``str_``/``bytes_``: ``==`` compares every character,
        while a plain str is counted by the caller). Measured once per object
        (:meth:`measured`); a chain of such objects deeper than
        :data:`MAX_OBJECT_NESTING` is refused."""
        if isinstance(obj, str):  # a subclass (numpy's str_): == compares every character
            return 1 + str.__len__(obj)
        if isinstance(obj, bytes):  # numpy's bytes_ (scalar(dtype("S<n>"), raw)), as str_
            return 1 + bytes.__len__(obj)
        key = id(obj)
        known = self._objects.get(key)
        if known is not None and known[0] is obj:  # measured, or priced when made (price)
            return known[1]
        hasher = getattr(type(obj), "__hash__", None)
        if type(hasher) is not types.FunctionType:
            return 1
        if depth >= MAX_OBJECT_NESTING:
            raise CheckpointError(
                f"objects whose hash reads their attributes nested deeper than "
                f"{MAX_OBJECT_NESTING} levels"
            )
        try:
            state = object.__getattribute__(obj, "__dict__")
        except Exception:  # no instance dict (slots): nothing of the file's to walk
            state = None
        cost = 1
        if type(state) is dict:
            for value in state.values():
                kind = type(value)
                if kind is tuple or kind is frozenset or isinstance(value, (tuple, frozenset)):
                    cost += self.expanded(value)
                elif kind is int:
                    cost += 1 if -_SMALL_INT < value < _SMALL_INT else 1 + (value.bit_length() >> 5)
                elif kind is str or kind is bytes:  # == of an equal copy reads every character
                    cost += 1 + len(value)
                elif kind in _FLAT:
                    cost += 1
                else:
                    cost += self.object_cost(value, depth + 1)
        self._objects[key] = (obj, cost)
        return cost

    def price(self, obj: Any, cost: int) -> None:
        """Count ``obj`` at ``cost`` wherever it is hashed or compared: an object whose ``==``
        walks text its slots hide from :meth:`object_cost` (a pathlib path compares its
        case-folded text, a fresh string per path), priced by what it was made from."""
        self._objects[id(obj)] = (obj, cost)

    def measured(self, obj: Any) -> bool:
        """Whether ``obj``'s hashing cost was measured (:meth:`object_cost` of an object whose
        class hashes in Python): it is then counted at that cost wherever it is used, so
        it may take no more state."""
        known = self._objects.get(id(obj))
        return known is not None and known[0] is obj

    def _pop_mark(self) -> list[Any]:
        if not self.metastack:
            raise CheckpointError("pickle MARK missing")
        items = self.stack
        self.stack = self.metastack.pop()
        return items

    def _text(self, raw: bytes, encoding: str = "utf-8") -> str:
        try:
            return raw.decode(encoding, "surrogatepass" if encoding == "utf-8" else "strict")
        except UnicodeDecodeError as exc:  # pickle's own type, as torch raises it
            raise UndecodableTextError(
                exc, f"undecodable text in the pickle ({exc.encoding}): {exc.reason}"
            ) from None

    def _global_names(self, module: str, name: str) -> tuple[str, str]:
        if self.proto < 3:  # Python 2 names, as protocol 0-2 pickles write them
            if (module, name) in _compat_pickle.NAME_MAPPING:
                return _compat_pickle.NAME_MAPPING[(module, name)]  # type: ignore[no-any-return]
            module = _compat_pickle.IMPORT_MAPPING.get(module, module)
        return module, name

    # ------------------------------------------------------------------ opcodes
    def _proto(self) -> None:
        proto = self.source.byte()
        if proto > HIGHEST_PROTOCOL:
            raise CheckpointError(f"pickle protocol {proto} is newer than 5")
        self.proto = proto

    def _frame(self) -> None:
        size = self.source.unpack(_U64)
        if size > self.source.remaining():
            raise CheckpointError(f"a pickle frame of {size} bytes runs past the end of the data")

    def _stop(self) -> None:
        raise Stop(self._pop())

    def _mark(self) -> None:
        if len(self.metastack) >= MAX_MARK_DEPTH:
            raise CheckpointError(f"pickle MARKs nested deeper than {MAX_MARK_DEPTH}")
        self.metastack.append(self.stack)
        self.stack = []

    def _pop_op(self) -> None:
        if self.stack:
            self.stack.pop()
        else:
            self._pop_mark()

    def _pop_mark_op(self) -> None:
        self._pop_mark()

    def _dup(self) -> None:
        self.stack.append(self._top())

    def _line_int(self) -> int:
        try:
            return int(self.source.readline())
        except ValueError:
            raise CheckpointError("a text opcode holds no valid integer") from None

    def _int(self) -> None:
        line = self.source.readline()
        if line == b"00":
            self.stack.append(False)
        elif line == b"01":
            self.stack.append(True)
        else:
            try:
                self.stack.append(int(line))
            except ValueError:
                raise CheckpointError("INT opcode holds no valid integer") from None

    def _long(self) -> None:
        line = self.source.readline()
        if line.endswith(b"L"):
            line = line[:-1]
        try:
            self.stack.append(int(line))
        except ValueError:
            raise CheckpointError("LONG opcode holds no valid integer") from None

    def _long_bytes(self, count: int) -> None:
        self.stack.append(int.from_bytes(self.source.read(count), "little", signed=True))

    def _float(self) -> None:
        try:
            self.stack.append(float(self.source.readline()))
        except ValueError:
            raise CheckpointError("FLOAT opcode holds no valid number") from None

    def _string(self) -> None:
        try:
            raw = codecs.escape_decode(_unquote(self.source.readline()))[0]
        except ValueError as exc:
            raise CheckpointError(f"bad STRING opcode: {exc}") from None
        self.stack.append(self._py2_text(raw))

    def _binstring(self, count: int) -> None:
        self.stack.append(self._py2_text(self.source.read(count)))

    def _py2_text(self, raw: bytes) -> str | bytes:
        """A Python 2 ``str`` (STRING, BINSTRING, SHORT_BINSTRING), read as the caller asked
        (``encoding``, see :func:`py2_str_encoding`): decoded with a text codec
        (``bytes.decode`` takes no other, so no codec decompresses), or kept as bytes.
        Linear in its size either way."""
        asked = self.encoding
        return raw if asked == "bytes" else self._text(raw, asked)

    def _unicode(self, count: int) -> None:
        self.stack.append(self._text(self.source.read(count)))

    def _buffer(self) -> None:
        raise CheckpointError("out-of-band pickle buffers (protocol 5) are not supported")

    def _push_marked(self, kind: Callable[[list[Any]], Any]) -> None:
        value = kind(self._pop_mark())  # pops first: the stack changes
        self.stack.append(self.built(value))

    def _push_hashable(self, kind: Callable[[list[Any]], Any]) -> None:
        items = self._pop_mark()
        depth = self.nesting(items)  # before frozenset() hashes the items
        if kind is frozenset:
            self.charge_keys(items)
        self.stack.append(self.hashable(self.built(kind(items)), depth))

    def _tuple(self, count: int) -> None:
        if len(self.stack) < count:
            raise CheckpointError("pickle stack underflow")
        items = self.built(tuple(self.stack[-count:]))
        del self.stack[-count:]
        self.stack.append(self.hashable(items, self.nesting(items)))

    def _append(self) -> None:
        item = self._pop()
        self.append_items(self._top(), [item])

    def _appends(self) -> None:
        items = self._pop_mark()
        self.append_items(self._top(), items)

    def _dict(self) -> None:
        items = self._pop_mark()
        if len(items) % 2:
            raise CheckpointError("DICT opcode with an odd number of items")
        self.charge_keys(items[::2])
        target: dict[Any, Any] = self.built({})
        self.set_items(target, items)
        self.stack.append(target)

    def _setitem(self) -> None:
        value = self._pop()
        key = self._pop()
        if type(key) is not str or len(key) > _SHORT_TEXT:  # a state dict's keys: no call
            self.charge_keys((key,))
        self.set_items(self._top(), [key, value])

    def _setitems(self) -> None:
        items = self._pop_mark()
        if len(items) % 2:
            raise CheckpointError("SETITEMS opcode with an odd number of items")
        self.charge_keys(items[::2])
        self.set_items(self._top(), items)

    def _additems(self) -> None:
        items = self._pop_mark()
        self.charge_keys(items)
        self.add_items(self._top(), items)

    def _put(self, index: int) -> None:
        if index < 0:
            raise CheckpointError("negative memo index")
        if not self.stack:
            raise CheckpointError("pickle stack underflow")
        memo = self.memo
        if index < len(memo):
            memo[index] = self.stack[-1]
        elif index == len(memo):
            memo.append(self.stack[-1])
            if self._memo_past:
                self._memo_past.pop(index, None)
        else:
            self._memo_past[index] = self.stack[-1]

    def _memoize(self) -> None:
        """MEMOIZE: the next index is the count of entries, as pickle's own dict memo has."""
        self._put(len(self.memo) + len(self._memo_past))

    def _get(self, index: int) -> None:
        if 0 <= index < len(self.memo):
            self.stack.append(self.memo[index])
            return
        try:
            self.stack.append(self._memo_past[index])
        except KeyError:
            raise CheckpointError(f"memo entry {index} is used before it is set") from None

    def _global(self) -> None:
        module = self._text(self.source.readline())
        name = self._text(self.source.readline())
        self.stack.append(self.find_global(*self._global_names(module, name)))

    def _stack_global(self) -> None:
        name = self._pop()
        module = self._pop()
        if type(module) is not str or type(name) is not str:
            raise CheckpointError("STACK_GLOBAL needs two strings")
        self.charge(len(module) + len(name), "naming globals")  # memoized text, used again
        self.stack.append(self.find_global(module, name))

    def _reduce(self) -> None:
        args = self._pop()
        func = self._top()
        if type(args) is not tuple:
            raise CheckpointError("REDUCE arguments are not a tuple")
        self.stack[-1] = self.call(func, args)

    def _build(self) -> None:
        state = self._pop()
        self.build(self._top(), state)

    def _newobj(self) -> None:
        args = self._pop()
        cls = self._pop()
        if type(args) is not tuple:
            raise CheckpointError("NEWOBJ arguments are not a tuple")
        self.stack.append(self.new_object(cls, args, {}))

    def _newobj_ex(self) -> None:
        kwargs = self._pop()
        args = self._pop()
        cls = self._pop()
        if type(args) is not tuple or type(kwargs) is not dict:
            raise CheckpointError("NEWOBJ_EX arguments are not a tuple and a dict")
        self.stack.append(self.new_object(cls, args, kwargs))

    def _inst(self) -> None:
        module = self._text(self.source.readline(), "ascii")
        name = self._text(self.source.readline(), "ascii")
        args = tuple(self._pop_mark())
        cls = self.find_global(*self._global_names(module, name))
        self.stack.append(self.call(cls, args))

    def _obj(self) -> None:
        items = self._pop_mark()
        if not items:
            raise CheckpointError("OBJ opcode without a class")
        self.stack.append(self.call(items[0], tuple(items[1:])))

    def _persid(self, pid: Any) -> None:
        self.stack.append(self.persistent_load(pid))

    def _ext(self, code: int) -> None:
        raise UnsafeCheckpointError(
            f"copyreg extension code {code} refused: it names a global through this "
            "process's extension registry, which compatshim does not consult",
            (f"<extension {code}>",),
        )


# The commonest opcodes of a large pickle read their argument in place, one call per
# opcode (a lambda calling ``source.byte``/``source.unpack`` made one more). A one-byte
# argument is indexed: ``struct`` would cost more than the call it saves.
def _pusher(fmt: struct.Struct) -> Handler:
    """The handler of BININT, BININT2 or BINFLOAT: push one fixed-size number."""
    size, unpack = fmt.size, fmt.unpack

    def push(machine: Machine) -> None:
        data = machine.source.read1(size)
        if len(data) != size:
            raise _past_end(size, len(data))
        machine.stack.append(unpack(data)[0])

    return push


def _long_memo(put: bool) -> Handler:
    """The handler of LONG_BINPUT or LONG_BINGET: ``_put``/``_get`` (which a subclass may
    override) of a four-byte index."""

    def memo(machine: Machine) -> None:
        data = machine.source.read1(4)
        if len(data) != 4:
            raise _past_end(4, len(data))
        if put:
            machine._put(_U32.unpack(data)[0])
        else:
            machine._get(_U32.unpack(data)[0])

    return memo


def _binint1(machine: Machine) -> None:
    data = machine.source.read1(1)
    if not data:
        raise _past_end(1, 0)
    machine.stack.append(data[0])


def _binput(machine: Machine) -> None:
    data = machine.source.read1(1)
    if not data:
        raise _past_end(1, 0)
    machine._put(data[0])


def _binget(machine: Machine) -> None:
    data = machine.source.read1(1)
    if not data:
        raise _past_end(1, 0)
    machine._get(data[0])


# ---------------------------------------------------------------------- dispatch table
# opcode -> the name of a Machine method, or a function of the machine. Unbound, so one
# table serves every run of a class: a table of bound methods would be rebuilt per run
# (~6 us) and, if stored, would tie the machine, and every object of its load, in a cycle.
_OPCODES: dict[bytes, str | Handler] = {
    b"\x80": "_proto",
    b"\x95": "_frame",
    b".": "_stop",
    b"(": "_mark",
    b"0": "_pop_op",
    b"1": "_pop_mark_op",
    b"2": "_dup",
    b"I": "_int",
    b"J": _pusher(_I32),
    b"K": _binint1,
    b"M": _pusher(_U16),
    b"L": "_long",
    b"\x8a": lambda s: s._long_bytes(s.source.byte()),
    b"\x8b": lambda s: s._long_bytes(s.source.unpack(_I32)),
    b"N": lambda s: s.stack.append(None),
    b"\x88": lambda s: s.stack.append(True),
    b"\x89": lambda s: s.stack.append(False),
    b"F": "_float",
    b"G": _pusher(_F64),
    b"S": "_string",
    b"T": lambda s: s._binstring(s.source.unpack(_I32)),
    b"U": lambda s: s._binstring(s.source.byte()),
    b"V": lambda s: s.stack.append(s._text(s.source.readline(), "raw-unicode-escape")),
    b"X": lambda s: s._unicode(s.source.unpack(_U32)),
    b"\x8c": lambda s: s._unicode(s.source.byte()),
    b"\x8d": lambda s: s._unicode(s.source.unpack(_U64)),
    b"B": lambda s: s.stack.append(s.source.read(s.source.unpack(_U32))),
    b"C": lambda s: s.stack.append(s.source.read(s.source.byte())),
    b"\x8e": lambda s: s.stack.append(s.source.read(s.source.unpack(_U64))),
    b"\x96": lambda s: s.stack.append(bytearray(s.source.read(s.source.unpack(_U64)))),
    b"\x97": "_buffer",
    b"\x98": "_buffer",
    b")": lambda s: s.stack.append(()),
    b"t": lambda s: s._push_hashable(tuple),
    b"\x85": lambda s: s._tuple(1),
    b"\x86": lambda s: s._tuple(2),
    b"\x87": lambda s: s._tuple(3),
    b"]": lambda s: s.stack.append(s.built([])),
    b"l": lambda s: s._push_marked(list),
    b"a": "_append",
    b"e": "_appends",
    b"}": lambda s: s.stack.append(s.built({})),
    b"d": "_dict",
    b"s": "_setitem",
    b"u": "_setitems",
    b"\x8f": lambda s: s.stack.append(s.built(set())),
    b"\x90": "_additems",
    b"\x91": lambda s: s._push_hashable(frozenset),
    b"p": lambda s: s._put(s._line_int()),
    b"q": _binput,
    b"r": _long_memo(put=True),
    b"\x94": "_memoize",
    b"g": lambda s: s._get(s._line_int()),
    b"h": _binget,
    b"j": _long_memo(put=False),
    b"c": "_global",
    b"\x93": "_stack_global",
    b"R": "_reduce",
    b"b": "_build",
    b"\x81": "_newobj",
    b"\x92": "_newobj_ex",
    b"i": "_inst",
    b"o": "_obj",
    b"P": lambda s: s._persid(s._text(s.source.readline(), "ascii")),
    b"Q": lambda s: s._persid(s._pop()),
    b"\x82": lambda s: s._ext(s.source.byte()),
    b"\x83": lambda s: s._ext(s.source.unpack(_U16)),
    b"\x84": lambda s: s._ext(s.source.unpack(_I32)),
}


def _dispatch_table(cls: type[Machine]) -> dict[bytes, Handler]:
    """``cls``'s opcode table: named handlers as ``cls`` defines them (a subclass's override
    counts); the functions call the machine's methods, so they follow overrides too."""
    return {op: getattr(cls, h) if isinstance(h, str) else h for op, h in _OPCODES.items()}


Machine._dispatch = _dispatch_table(Machine)
