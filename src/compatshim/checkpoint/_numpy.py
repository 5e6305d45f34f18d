"""numpy arrays, dtypes and scalars rebuilt from checked arguments, under either core name.

numpy 1.x pickles name ``numpy.core.*``, numpy 2 ``numpy._core.*``; both map to
the running numpy's objects (``allowlist`` resolves them). Only plain ndarrays
of simple dtypes are built: no object dtype, no structured dtype, no subclass,
and the byte count of the data is compared with shape x itemsize before numpy
sees it, so a few-byte file cannot ask for a huge array.
"""

from __future__ import annotations

import re
from typing import Any, Callable

from ._objects import bad, short
from .errors import CheckpointError, UnsafeCheckpointError

_SPEC = re.compile(r"[?biufcSUVMm]\d{0,9}")
_DATETIME_UNITS = {b"Y", b"M", b"W", b"D", b"h", b"m", b"s", b"ms", b"us", b"ns", b"ps", b"fs"}
_DATETIME_UNITS |= {b"as", b"generic"}
MAX_DIMS = 64


def _np() -> Any:
    import numpy

    return numpy


def _refuse_object(what: str) -> UnsafeCheckpointError:
    return UnsafeCheckpointError(
        f"{what}: numpy object/structured dtypes are refused (their items are arbitrary pickles)",
        ("numpy object dtype",),
    )


def make_dtype(_: Any, args: tuple[Any, ...], register: Callable[[Any, Any], None]) -> Any:
    """``numpy.dtype(spec, align, copy)`` for simple specs; BUILD state is checked later."""
    if not 1 <= len(args) <= 3 or type(args[0]) is not str:
        raise bad("numpy.dtype", args)
    spec = args[0]
    if not _SPEC.fullmatch(spec):
        if "O" in spec or "," in spec:
            raise _refuse_object(f"numpy.dtype({short(spec)})")
        raise bad("numpy.dtype", args)
    align = args[1] if len(args) > 1 else False
    if type(align) is not bool:
        raise bad("numpy.dtype", args)
    made = _np().dtype(spec, align, True)
    if made.hasobject or made.fields is not None:
        raise _refuse_object(f"numpy.dtype({short(spec)})")
    register(made, set_dtype_state)
    return made


def set_dtype_state(dtype: Any, state: Any) -> None:
    """BUILD on a dtype this loader made: only byte order (and datetime unit) may change."""
    if type(state) is not tuple or len(state) not in (8, 9):
        raise CheckpointError(f"numpy dtype state is {short(state)}, expected an 8/9-tuple")
    version, order, subdescr, names, fields, elsize, alignment, flags = state[:8]
    metadata = state[8] if len(state) == 9 else None
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
    if dtype.hasobject or dtype.fields is not None:
        raise _refuse_object("numpy dtype state")


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


def _checked_dtype(value: Any, what: str) -> Any:
    np = _np()
    if not isinstance(value, np.dtype) or value.hasobject or value.fields is not None:
        if isinstance(value, np.dtype):
            raise _refuse_object(what)
        raise CheckpointError(f"{what}: dtype is {short(value)}, expected a numpy dtype")
    return value


def _shape(value: Any, what: str) -> tuple[int, ...]:
    if type(value) is not tuple or len(value) > MAX_DIMS:
        raise CheckpointError(f"{what}: shape is {short(value)}, expected a tuple of ints")
    for dim in value:
        if type(dim) is not int or dim < 0:
            raise CheckpointError(f"{what}: shape holds {short(dim)}")
    return value


def _count(shape: tuple[int, ...]) -> int:
    total = 1
    for dim in shape:
        total *= dim
    return total


def _data_matches(raw: Any, shape: tuple[int, ...], dtype: Any, what: str) -> None:
    if type(raw) not in (bytes, bytearray):
        raise (
            _refuse_object(what)
            if type(raw) is list
            else CheckpointError(f"{what}: data is {short(raw)}, expected bytes")
        )
    expected = _count(shape) * dtype.itemsize
    if len(raw) != expected:
        raise CheckpointError(
            f"{what}: shape {shape[:8]} of {dtype.str} needs {expected} bytes, the file holds "
            f"{len(raw)}"
        )


def reconstruct(ndarray: Any, args: tuple[Any, ...], register: Callable[[Any, Any], None]) -> Any:
    """``_reconstruct(ndarray, (0,), b'b')``: an empty plain array that BUILD then fills."""
    np = _np()
    if len(args) != 3 or args[0] is not np.ndarray:
        if args and isinstance(args[0], type):
            raise UnsafeCheckpointError(
                f"numpy _reconstruct of {args[0].__module__}.{args[0].__qualname__} refused: "
                "only plain numpy.ndarray",
                ("numpy ndarray subclass",),
            )
        raise bad("numpy _reconstruct", args)
    if args[1] != (0,) or type(args[2]) is not bytes or len(args[2]) != 1:
        raise bad("numpy _reconstruct", args)
    made = np.ndarray.__new__(np.ndarray, (0,), "b")
    register(made, set_array_state)
    return made


def set_array_state(array: Any, state: Any) -> None:
    """BUILD on an array this loader made: (version, shape, dtype, fortran, raw bytes)."""
    if type(state) is tuple and len(state) == 4:
        state = (1, *state)
    if type(state) is not tuple or len(state) != 5 or state[0] != 1:
        raise CheckpointError(f"numpy array state is {short(state)}, expected a 5-tuple")
    _, shape, dtype, fortran, raw = state
    shape = _shape(shape, "numpy array")
    dtype = _checked_dtype(dtype, "numpy array")
    if type(fortran) is not bool:
        raise CheckpointError("numpy array state: fortran flag is not a bool")
    _data_matches(raw, shape, dtype, "numpy array")
    array.__setstate__((1, shape, dtype, fortran, raw))


def frombuffer(_: Any, args: tuple[Any, ...]) -> Any:
    """``_frombuffer(buffer, dtype, shape, order)`` as protocol 5 writes arrays in-band."""
    if len(args) != 4 or args[3] not in ("C", "F", "A"):
        raise bad("numpy _frombuffer", args)
    buffer, dtype, shape, order = args
    shape = _shape(shape, "numpy _frombuffer")
    dtype = _checked_dtype(dtype, "numpy _frombuffer")
    _data_matches(buffer, shape, dtype, "numpy _frombuffer")
    return _np().frombuffer(buffer, dtype=dtype).reshape(shape, order=order)


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
