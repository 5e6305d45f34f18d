"""numpy arrays, dtypes and scalars rebuilt from checked arguments, under either core name.

numpy 1.x pickles name ``numpy.core.*``, numpy 2 ``numpy._core.*``; both map to
the running numpy's objects (``allowlist`` resolves them). Only plain ndarrays
of simple dtypes are built: no object dtype, no structured dtype, no subclass,
and the byte count of the data is compared with shape x itemsize before numpy
sees it, so a few-byte file cannot ask for a huge array.

Object arrays (dtype ``O``) only where the read's request admits them
(``Request.object_arrays``: the hardened ``numpy.load(allow_pickle=True)``, patch
``numpy-load-hardened``; the machine passes ``objects``): their
items were read by the same machine (allowlist, budget) and ``check_result``
walks them; the count of items must equal the shape's. Structured dtypes stay
refused.

``numpy.random`` objects (Generator, RandomState, the five bit generators,
SeedSequence) are rebuilt from either major's pickle as the running numpy's
own objects: numpy 1 pickles name the bit generator (``"PCG64"``) and BUILD a
state dict, numpy 2 pickle the class and BUILD ``(state, SeedSequence)``.
numpy's ctor functions are never called (they call any class they are given,
and ``__generator_ctor`` any callable); only the five classes, by name or
identity, are constructed, and every state field is checked before numpy's own
setter sees it.
"""

from __future__ import annotations

import functools
import re
import sys
from importlib import import_module
from typing import Any, Callable

from .._text import cut, named, short
from ._dtypes import BY_NAME
from ._limits import Quota, check_shape, count
from ._objects import bad
from .errors import CheckpointError, UnsafeCheckpointError

_SPEC = re.compile(r"[?biufcSUVMm]\d{0,9}")
_DATETIME_UNITS = {b"Y", b"M", b"W", b"D", b"h", b"m", b"s", b"ms", b"us", b"ns", b"ps", b"fs"}
_DATETIME_UNITS |= {b"as", b"generic"}


_OBJECT_SPECS = ("O4", "O8")


def _object_ok(dtype: Any, objects: bool) -> bool:
    """An object dtype (not structured) where object arrays are admitted (``objects``)."""
    return objects and dtype.kind == "O" and dtype.fields is None


def _np() -> Any:
    import numpy

    return numpy


def is_array(value: Any) -> bool:
    """Whether ``value`` is a numpy array (numpy not imported for it)."""
    np = sys.modules.get("numpy")
    return np is not None and isinstance(value, np.ndarray)


def _refuse_object(what: str) -> UnsafeCheckpointError:
    return UnsafeCheckpointError(
        f"{what}: numpy object/structured dtypes are refused (their items are arbitrary pickles)",
        ("numpy object dtype",),
    )


def make_dtype(
    _: Any, args: tuple[Any, ...], register: Callable[[Any, Any], None], objects: bool = False
) -> Any:
    """``numpy.dtype(spec, align, copy)`` for simple specs (object ones where ``objects``);
    BUILD state is checked later."""
    if not 1 <= len(args) <= 3 or type(args[0]) is not str:
        raise bad("numpy.dtype", args)
    spec = args[0]
    if not (objects and spec in _OBJECT_SPECS) and not _SPEC.fullmatch(spec):
        if "O" in spec or "," in spec:
            raise _refuse_object(f"numpy.dtype({short(spec)})")
        raise bad("numpy.dtype", args)
    align = args[1] if len(args) > 1 else False
    if type(align) is not bool:
        raise bad("numpy.dtype", args)
    made = _np().dtype(spec, align, True)
    if (made.hasobject or made.fields is not None) and not _object_ok(made, objects):
        raise _refuse_object(f"numpy.dtype({short(spec)})")
    register(made, _OBJECT_DTYPE_STATE if objects else set_dtype_state)
    return made


def set_dtype_state(dtype: Any, state: Any, objects: bool = False) -> None:
    """BUILD on a dtype this loader made: only byte order (and datetime unit) may change."""
    if type(state) is not tuple or len(state) not in (8, 9):
        raise CheckpointError(f"numpy dtype state is {short(state)}, expected an 8/9-tuple")
    version, order, subdescr, names, fields, elsize, alignment, flags = state[:8]
    metadata = state[8] if len(state) == 9 else None
    if dtype.kind == "V" and (subdescr, names, fields) != (None, None, None):
        raise CheckpointError(  # as numpy pickles one: dtype('V12') and its fields in BUILD
            f"a structured numpy dtype (named fields or a subarray, {dtype.str}): compatshim "
            "does not rebuild structured numpy arrays or dtypes (torch's weights-only load "
            "refuses them too); only a load that runs the file's code reads them "
            "(trusted=True, for a file you trust)"
        )
    if (
        version not in (3, 4)
        or order not in ("<", ">", "|", "=")
        or (subdescr, names, fields) != (None, None, None)
        or type(elsize) is not int
        or elsize not in (-1, dtype.itemsize)
        or type(alignment) is not int
        or alignment not in (-1, dtype.alignment)
        or flags != dtype.flags
        or not _datetime_metadata_ok(dtype, metadata)
    ):
        raise CheckpointError(f"numpy dtype state does not describe a simple {dtype.str} dtype")
    dtype.__setstate__(state)
    if (dtype.hasobject or dtype.fields is not None) and not _object_ok(dtype, objects):
        raise _refuse_object("numpy dtype state")


_OBJECT_DTYPE_STATE = functools.partial(set_dtype_state, objects=True)


def _datetime_metadata_ok(dtype: Any, metadata: Any) -> bool:
    if metadata is None:
        return True
    if dtype.kind not in "Mm":
        return False
    if type(metadata) is not tuple or len(metadata) != 2:
        return False
    if metadata[0] is not None and metadata[0] != {}:  # numpy < 2.4 writes an empty dict
        return False
    unit = metadata[1]
    return (
        type(unit) is tuple
        and len(unit) == 4
        and unit[0] in _DATETIME_UNITS
        and all(type(v) is int and 0 < v < 2**31 for v in unit[1:])
    )


def _checked_dtype(value: Any, what: str, objects: bool = False) -> Any:
    np = _np()
    if objects and isinstance(value, np.dtype) and _object_ok(value, objects):
        return value
    if not isinstance(value, np.dtype) or value.hasobject or value.fields is not None:
        if isinstance(value, np.dtype):
            raise _refuse_object(what)
        raise CheckpointError(f"{what}: dtype is {short(value)}, expected a numpy dtype")
    return value


def _data_matches(raw: Any, dims: tuple[int, ...], dtype: Any, what: str) -> None:
    if dtype.kind == "O":  # only where _checked_dtype admitted it: the items, one each
        items = count(dims, what)
        if type(raw) is not list or len(raw) != items:
            held = f"{len(raw)} items" if type(raw) is list else f"a {type(raw).__name__}"
            raise CheckpointError(
                f"{what}: an object array of shape {cut(str(dims), 120)} needs a list of "
                f"{items} items, the file holds {held}"
            )
        return
    if type(raw) not in (bytes, bytearray):
        raise (
            _refuse_object(what)
            if type(raw) is list
            else CheckpointError(f"{what}: data is {short(raw)}, expected bytes")
        )
    expected = count(dims, what) * dtype.itemsize
    if len(raw) != expected:
        raise CheckpointError(
            f"{what}: shape {cut(str(dims), 120)} of {dtype.str} needs {expected} bytes, "
            f"the file holds {len(raw)}"
        )


def reconstruct(
    ndarray: Any,
    args: tuple[Any, ...],
    register: Callable[[Any, Any], None],
    objects: bool = False,
    allowed: Callable[[Any], Callable[[Any, Any], None] | None] = lambda cls: None,
) -> Any:
    """``_reconstruct(ndarray, (0,), b'b')``: an empty plain array that BUILD then fills
    (with object items where ``objects``). ``allowed(cls)``: for an ndarray subclass an allow
    entry admitted (``numpy.char.chararray``, ``numpy.matrix``: its own ``__array_finalize__``
    runs, which the caller trusts), the BUILD of one it overriding ``__setstate__``; None
    where it was not admitted."""
    np = _np()
    cls: Any = args[0] if args else None
    user_build = None  # an allowed subclass's BUILD; None: a plain ndarray or refused below
    if isinstance(cls, type) and cls is not np.ndarray and issubclass(cls, np.ndarray):
        user_build = allowed(cls)
    if user_build is not None:
        if len(args) != 3 or type(args[1]) is not tuple or args[1] != (0,) or args[2] != b"b":
            raise bad("numpy _reconstruct", args)
    elif len(args) != 3 or cls is not np.ndarray:
        if isinstance(cls, type):
            raise UnsafeCheckpointError(
                f"numpy _reconstruct of {cls.__module__}.{cls.__qualname__} refused: "
                "only plain numpy.ndarray",
                ("numpy ndarray subclass",),
            )
        raise bad("numpy _reconstruct", args)
    elif args[1] != (0,) or type(args[2]) is not bytes or len(args[2]) != 1:
        raise bad("numpy _reconstruct", args)
    made = np.ndarray.__new__(cls, (0,), "b")
    own = user_build is not None and cls.__setstate__ is not np.ndarray.__setstate__
    register(made, user_build if own else _OBJECT_ARRAY_STATE if objects else set_array_state)
    return made


def set_array_state(array: Any, state: Any, objects: bool = False) -> None:
    """BUILD on an array this loader made: (version, shape, dtype, fortran, raw bytes)."""
    if type(state) is tuple and len(state) == 4:
        state = (1, *state)
    if type(state) is not tuple or len(state) != 5 or state[0] != 1:
        raise CheckpointError(f"numpy array state is {short(state)}, expected a 5-tuple")
    _, dims, dtype, fortran, raw = state
    dims = check_shape(dims, "numpy array")
    dtype = _checked_dtype(dtype, "numpy array", objects=objects)
    if type(fortran) is not bool:
        raise CheckpointError("numpy array state: fortran flag is not a bool")
    _data_matches(raw, dims, dtype, "numpy array")
    array.__setstate__((1, dims, dtype, fortran, raw))


_OBJECT_ARRAY_STATE = functools.partial(set_array_state, objects=True)


def frombuffer(_: Any, args: tuple[Any, ...]) -> Any:
    """``_frombuffer(buffer, dtype, shape, order)`` as protocol 5 writes arrays in-band."""
    if len(args) != 4 or args[3] not in ("C", "F", "A"):
        raise bad("numpy _frombuffer", args)
    buffer, dtype, dims, order = args
    dims = check_shape(dims, "numpy _frombuffer")
    dtype = _checked_dtype(dtype, "numpy _frombuffer")
    _data_matches(buffer, dims, dtype, "numpy _frombuffer")
    return _np().frombuffer(buffer, dtype=dtype).reshape(dims, order=order)


def scalar(real_scalar: Any, args: tuple[Any, ...]) -> Any:
    """``scalar(dtype, raw)`` for non-object dtypes with exactly itemsize bytes."""
    if len(args) != 2:
        raise bad("numpy scalar", args)
    dtype = _checked_dtype(args[0], "numpy scalar")
    raw = args[1]
    if type(raw) is str:
        raw = raw.encode("latin-1")
    if type(raw) is not bytes or len(raw) != dtype.itemsize:
        raise bad("numpy scalar", args)
    return real_scalar(dtype, raw)


# --------------------------------------------------------------------------- numpy.random
BIT_GENERATORS = ("MT19937", "PCG64", "PCG64DXSM", "Philox", "SFC64")
#: Work units per file: a ctor call is ~6 pickle bytes, but a bit generator is KBs and
#: tens of microseconds (MT19937: 2.5 KB and ~300 us, so it counts 8), seeded before BUILD.
MAX_RANDOM_OBJECTS = 4096
_COST = {"MT19937": 8}
MAX_POOL_SIZE = 256  # SeedSequence mixing costs entropy words x pool size
MAX_ENTROPY_WORDS = 1024  # entropy + spawn key; SeedSequence() draws 4 (128 bits)

Schema = Any  # dict of field -> Schema | range of allowed ints | (numpy dtype str, length)
_U32, _U64 = BY_NAME["uint32"].numpy, BY_NAME["uint64"].numpy
_BUFFERED = {"has_uint32": range(2), "uinteger": range(2**32)}
_PCG = {"state": {"state": range(2**128), "inc": range(2**128)}, **_BUFFERED}
#: ``bit_generator.state`` of each generator, without its ``bit_generator`` name (numpy 1.17-2.5).
STATE_SCHEMAS: dict[str, dict[str, Schema]] = {
    "MT19937": {"state": {"key": (_U32, 624), "pos": range(625)}},
    "PCG64": _PCG,
    "PCG64DXSM": _PCG,
    "Philox": {
        "state": {"counter": (_U64, 4), "key": (_U64, 2)},
        "buffer": (_U64, 4),
        "buffer_pos": range(5),
        **_BUFFERED,
    },
    "SFC64": {"state": {"state": (_U64, 4)}, **_BUFFERED},
}
_GAUSS = {"has_gauss": range(2), "gauss": float}
Register = Callable[[Any, Any], None]


def _random() -> Any:
    import numpy.random

    return numpy.random


def _refuse_random(what: str, value: Any, only: str = "") -> UnsafeCheckpointError:
    shown = short(value) if isinstance(value, (str, bytes, int, float)) else named(value)
    only = only or f"numpy's bit generators {', '.join(BIT_GENERATORS)}"
    return UnsafeCheckpointError(f"{what} of {shown} refused: only {only}", (f"{what} argument",))


def random_quota() -> Quota:
    """One load's count of numpy.random objects (an MT19937 counting 8)."""
    return Quota(MAX_RANDOM_OBJECTS, "numpy.random objects (an MT19937 counting 8)")


def _matches(value: Any, schema: Schema) -> bool:
    if isinstance(schema, dict):
        return (
            type(value) is dict
            and value.keys() == schema.keys()
            and all(_matches(value[k], s) for k, s in schema.items())
        )
    if isinstance(schema, range):
        return type(value) is int and value in schema
    if schema is float:
        return type(value) is float
    code, length = schema
    return (
        type(value) is _np().ndarray
        and f"{value.dtype.kind}{value.dtype.itemsize}" == code
        and value.shape == (length,)
    )


def _checked_state(name: str, state: Any, extra: dict[str, Schema] | None = None) -> Any:
    """``state`` if it is exactly what ``name``'s state property returns (plus ``extra``)."""
    schema = {**STATE_SCHEMAS[name], **(extra or {})}
    if (
        type(state) is not dict
        or type(state.get("bit_generator")) is not str
        or state["bit_generator"] != name
        or not _matches({k: v for k, v in state.items() if k != "bit_generator"}, schema)
    ):
        raise CheckpointError(f"numpy.random state is {short(state)}, not a {name} state")
    return state


def _bit_generator_class(value: Any) -> Any:
    random = _random()
    classes = {name: getattr(random, name) for name in BIT_GENERATORS}
    found = classes.get(value) if type(value) is str else None
    if found is None and isinstance(value, type):
        found = next((c for c in classes.values() if c is value), None)
    if found is None:
        raise _refuse_random("numpy.random bit generator", value)
    return found


def bit_generator_ctor(args: tuple[Any, ...], register: Register, quota: Quota) -> Any:
    """``__bit_generator_ctor(name)`` (numpy 1) or ``(class)`` (numpy 2): a fresh bit generator."""
    if len(args) != 1:
        raise bad("numpy.random __bit_generator_ctor", args)
    cls = _bit_generator_class(args[0])
    quota.take(_COST.get(cls.__name__, 1))
    bit_generator = cls()  # seeded from OS entropy, as numpy's ctor does; BUILD sets the state
    register(bit_generator, set_bit_generator_state)
    return bit_generator


def set_bit_generator_state(bit_generator: Any, state: Any) -> None:
    """BUILD: a state dict (numpy 1) or ``(state dict, SeedSequence or None)`` (numpy 2)."""
    name = type(bit_generator).__name__
    if type(state) is not tuple:
        bit_generator.state = _checked_state(name, state)
        return
    if len(state) != 2:
        raise CheckpointError(f"numpy.random {name} state is a {len(state)}-tuple")
    seed_seq = state[1]
    if seed_seq is not None and (
        type(seed_seq) is not _random().SeedSequence or seed_seq.pool is None
    ):
        raise CheckpointError(f"numpy.random {name} state holds {short(seed_seq)}")
    checked = _checked_state(name, state[0])
    if int(_np().__version__.split(".")[0]) >= 2:
        bit_generator.__setstate__((checked, seed_seq))
    else:  # numpy 1 keeps no SeedSequence across pickling (its _seed_seq is read-only)
        bit_generator.state = checked


def _bit_generator_argument(
    what: str, args: tuple[Any, ...], register: Register, quota: Quota
) -> Any:
    """numpy 2 passes the bit generator itself; numpy 1 its name and ``__bit_generator_ctor``."""
    random = _random()
    if len(args) == 1 and isinstance(args[0], random.BitGenerator):
        bit_generator = args[0]
        _bit_generator_class(type(bit_generator))
        return bit_generator
    if len(args) in (1, 2) and type(args[0]) is str:
        if len(args) == 2:
            ctor = vars(import_module("numpy.random._pickle"))["__bit_generator_ctor"]
            if args[1] is not ctor:
                raise _refuse_random(what, args[1])
        return bit_generator_ctor(args[:1], register, quota)
    raise _refuse_random(what, args[0] if args else None)


def generator_ctor(args: tuple[Any, ...], register: Register, quota: Quota) -> Any:
    """``__generator_ctor``: a Generator over a checked bit generator."""
    bit_generator = _bit_generator_argument("numpy.random Generator", args, register, quota)
    quota.take()
    generator = _random().Generator(bit_generator)
    register(generator, set_generator_state)
    return generator


def set_generator_state(generator: Any, state: Any) -> None:
    """BUILD of a numpy-1 Generator: its bit generator's state dict (numpy 2 writes none)."""
    bit_generator = generator.bit_generator
    bit_generator.state = _checked_state(type(bit_generator).__name__, state)


def randomstate_ctor(args: tuple[Any, ...], register: Register, quota: Quota) -> Any:
    """``__randomstate_ctor``: a RandomState over a checked bit generator."""
    bit_generator = _bit_generator_argument("numpy.random RandomState", args, register, quota)
    quota.take()
    legacy = _random().RandomState(bit_generator)
    register(legacy, set_random_state_state)
    return legacy


def legacy_randomstate_ctor(args: tuple[Any, ...], register: Register, quota: Quota) -> Any:
    """numpy < 1.17's ``numpy.random.__RandomState_ctor()``: RandomState(0), state from BUILD."""
    if args:
        raise bad("numpy.random.__RandomState_ctor", args)
    quota.take()
    legacy = _random().RandomState(0)
    register(legacy, set_random_state_state)
    return legacy


def set_random_state_state(legacy: Any, state: Any) -> None:
    """BUILD: ``get_state(legacy=False)`` (a dict) or the legacy MT19937 5-tuple."""
    name = type(legacy._bit_generator).__name__
    if type(state) is tuple:
        if len(state) != 5 or name != "MT19937":
            raise CheckpointError(f"numpy RandomState state is {short(state)}")
        bit_generator, key, pos, has_gauss, gauss = state
        as_dict = {"bit_generator": bit_generator, "state": {"key": key, "pos": pos}}
        _checked_state(name, {**as_dict, "has_gauss": has_gauss, "gauss": gauss}, _GAUSS)
    else:
        _checked_state(name, state, _GAUSS)
    legacy.set_state(state)


def seed_sequence(args: tuple[Any, ...], register: Register, quota: Quota) -> Any:
    """Cython's ``__pyx_unpickle_SeedSequence(cls, checksum, state)``: an empty SeedSequence."""
    cls = _random().SeedSequence
    if len(args) != 3 or args[0] is not cls or type(args[1]) is not int:
        what = "numpy.random SeedSequence"
        raise _refuse_random(what, args[0] if args else None, "SeedSequence itself")
    quota.take()
    made_seq = cls.__new__(cls)
    if args[2] is not None:
        set_seed_sequence_state(made_seq, args[2])
    else:
        register(made_seq, set_seed_sequence_state)
    return made_seq


def set_seed_sequence_state(seq: Any, state: Any) -> None:
    """BUILD ``(entropy, n_children_spawned, pool, pool_size, spawn_key)``: rebuilt by
    SeedSequence's own constructor from checked fields, then its pool compared."""
    np = _np()
    if type(state) is not tuple or len(state) != 5 or seq.pool is not None:
        raise CheckpointError(f"numpy SeedSequence state is {short(state)}")
    entropy, children, pool, pool_size, spawn_key = state
    words = entropy if type(entropy) in (list, tuple) else [entropy]
    if _entropy_words(words) + _entropy_words(spawn_key) > MAX_ENTROPY_WORDS:
        raise CheckpointError(  # numpy's int-to-words conversion is quadratic in the digits
            f"numpy SeedSequence entropy of more than {MAX_ENTROPY_WORDS} 32-bit words "
            "(numpy's own is 4)"
        )
    if type(entropy) is np.ndarray:  # SeedSequence keeps the entropy it was given
        words = [] if entropy.ndim == 1 and entropy.dtype.kind in "iu" else [None]
        words += [0] if entropy.size == 0 or entropy.min() >= 0 else [None]
    if (
        not all(_whole(w, np) for w in words)
        or type(children) is not int
        or not 0 <= children < 2**63
        or type(pool_size) is not int
        or not 4 <= pool_size <= MAX_POOL_SIZE
        or not _matches(pool, (_U32, pool_size))
        or type(spawn_key) is not tuple
        or not all(_whole(k, np) for k in spawn_key)
    ):
        raise CheckpointError("numpy SeedSequence state fields are not those numpy writes")
    seq.__init__(entropy, spawn_key=spawn_key, pool_size=pool_size, n_children_spawned=children)
    if not np.array_equal(seq.pool, pool):
        raise CheckpointError("numpy SeedSequence state: its pool does not follow from its entropy")


def _entropy_words(values: Any) -> int:
    """32-bit words of the Python ints among ``values`` (numpy's own are bounded by type)."""
    if type(values) not in (list, tuple):
        return 0
    return len(values) + sum(v.bit_length() >> 5 for v in values if type(v) is int)


def _whole(value: Any, np: Any) -> bool:
    """A non-negative Python or numpy integer (SeedSequence keeps what it was given)."""
    return (type(value) is int or isinstance(value, np.integer)) and value >= 0


#: Handlers of the numpy.random globals, by allowlist qualname.
RANDOM: dict[str, Callable[[tuple[Any, ...], Register, Quota], Any]] = {
    "numpy.random._pickle.__bit_generator_ctor": bit_generator_ctor,
    "numpy.random._pickle.__generator_ctor": generator_ctor,
    "numpy.random._pickle.__randomstate_ctor": randomstate_ctor,
    "numpy.random.__RandomState_ctor": legacy_randomstate_ctor,
    "numpy.random.bit_generator.__pyx_unpickle_SeedSequence": seed_sequence,
}
