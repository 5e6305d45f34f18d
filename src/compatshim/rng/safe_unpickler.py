"""A restricted unpickler for RNG files: admits the few globals they need, runs no code.

Pickles name every class and function they call as (module, name). This
unpickler answers only the names an RNG file needs and refuses the rest with
:class:`RNGStateError`, so a file that names ``os.system`` or any other callable
fails before anything is called. numpy objects are never rebuilt: arrays,
dtypes and scalars become small stand-ins that decode the raw bytes. That
makes a file readable whichever numpy major wrote it (``numpy.core`` in 1.x,
``numpy._core`` in 2.x), and even without numpy installed.

This module is also a ``pickle_module`` for ``torch.load`` (it has ``Unpickler``
and ``load``), so tensors in torch's zip format load through the same gate.
"""

from __future__ import annotations

import collections
import io
import pickle
import struct
from typing import IO, Any, Callable

from .errors import RNGStateError

_NUMPY_CORE = ("numpy.core", "numpy._core")
_SIZES = {
    ("i", 1): "b",
    ("u", 1): "B",
    ("i", 2): "h",
    ("u", 2): "H",
    ("i", 4): "i",
    ("u", 4): "I",
    ("i", 8): "q",
    ("u", 8): "Q",
    ("f", 4): "f",
    ("f", 8): "d",
    ("b", 1): "?",
}


class DtypeStandIn:
    """What ``numpy.dtype('u4', False, True)`` plus its pickled state describe."""

    def __init__(self, spec: Any = "", align: Any = False, copy: Any = True) -> None:
        self.spec = spec if isinstance(spec, str) else ""
        self.byteorder = "="

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, tuple) and len(state) > 1 and isinstance(state[1], str):
            self.byteorder = state[1]

    def struct_code(self) -> str:
        spec = self.spec.lstrip("<>=|")
        kind, size = spec[:1], spec[1:]
        code = _SIZES.get((kind, int(size))) if size.isdigit() else None
        if code is None:
            raise RNGStateError(f"numpy dtype {self.spec!r} is not one an RNG state uses")
        return (">" if self.byteorder == ">" or self.spec.startswith(">") else "<") + code


class ArrayStandIn:
    """A numpy array's pickled payload: shape, dtype and raw bytes, decoded to Python numbers."""

    def __init__(self, *_: Any) -> None:
        self.shape: tuple[int, ...] = ()
        self.dtype: DtypeStandIn | None = None
        self.raw = b""

    def __setstate__(self, state: Any) -> None:
        if not (isinstance(state, tuple) and len(state) == 5):
            raise RNGStateError("unexpected numpy array pickle state")
        _, shape, dtype, _fortran, raw = state
        if not isinstance(dtype, DtypeStandIn) or not isinstance(raw, (bytes, bytearray)):
            raise RNGStateError("numpy array pickle without a plain dtype and raw bytes")
        self.shape, self.dtype, self.raw = tuple(shape), dtype, bytes(raw)

    def tolist(self) -> list[Any]:
        if self.dtype is None:
            raise RNGStateError("numpy array pickle without data")
        code = self.dtype.struct_code()
        count = len(self.raw) // struct.calcsize(code[1:])
        expected = 1
        for dim in self.shape:
            expected *= int(dim)
        if count != expected or len(self.shape) != 1:
            raise RNGStateError(f"numpy array of shape {self.shape} does not match its data")
        return list(struct.unpack(f"{code[0]}{count}{code[1:]}", self.raw))


def _reconstruct(_cls: Any, _shape: Any, _code: Any) -> ArrayStandIn:
    return ArrayStandIn()


def _frombuffer(buffer: Any, dtype: Any, shape: Any, _order: Any) -> ArrayStandIn:
    array = ArrayStandIn()
    array.__setstate__((1, tuple(shape), dtype, False, bytes(buffer)))
    return array


def _scalar(dtype: Any, raw: Any) -> Any:
    if not isinstance(dtype, DtypeStandIn) or not isinstance(raw, (bytes, bytearray)):
        raise RNGStateError("numpy scalar pickle without a plain dtype and raw bytes")
    return struct.unpack(dtype.struct_code(), bytes(raw))[0]


def _latin1_encode(text: Any, encoding: Any = "utf-8") -> bytes:
    """``_codecs.encode`` as protocol-2 pickles use it for bytes; nothing else."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise RNGStateError("refused _codecs.encode call that is not a bytes literal")
    return text.encode("latin1")


def _torch_global(name: str) -> Callable[[], Any]:
    def resolve() -> Any:
        import torch._utils

        return getattr(torch._utils, name)

    return resolve


def _fixed(value: Any) -> Callable[[], Any]:
    return lambda: value


_ALLOWED: dict[tuple[str, str], Callable[[], Any]] = {
    ("collections", "OrderedDict"): _fixed(collections.OrderedDict),
    ("builtins", "set"): _fixed(set),
    ("builtins", "frozenset"): _fixed(frozenset),
    ("builtins", "bytearray"): _fixed(bytearray),
    ("_codecs", "encode"): _fixed(_latin1_encode),
    ("torch._utils", "_rebuild_tensor_v2"): _torch_global("_rebuild_tensor_v2"),
    ("torch._utils", "_rebuild_tensor_v3"): _torch_global("_rebuild_tensor_v3"),
    ("numpy", "ndarray"): _fixed(ArrayStandIn),
    ("numpy", "dtype"): _fixed(DtypeStandIn),
}
for _core in _NUMPY_CORE:
    _ALLOWED[(f"{_core}.multiarray", "_reconstruct")] = _fixed(_reconstruct)
    _ALLOWED[(f"{_core}.multiarray", "scalar")] = _fixed(_scalar)
    _ALLOWED[(f"{_core}.numeric", "_frombuffer")] = _fixed(_frombuffer)


def allowed_globals() -> list[str]:
    return sorted(f"{module}.{name}" for module, name in _ALLOWED)


class Unpickler(pickle.Unpickler):
    """``pickle.Unpickler`` whose ``find_class`` admits only :data:`_ALLOWED` names."""

    def find_class(self, module: str, name: str) -> Any:
        resolve = _ALLOWED.get((module, name))
        if resolve is None and module == "numpy.dtypes" and name.endswith("DType"):
            resolve = _fixed(DtypeStandIn)
        if resolve is None:
            raise RNGStateError(
                f"refused to load {module}.{name}: an RNG file has no reason to name it, "
                "and unpickling it could run code. Pass trusted=True only for a file you "
                "trust completely."
            )
        return resolve()


def load(file: IO[bytes], **kwargs: Any) -> Any:
    """``pickle.load`` through :class:`Unpickler`."""
    return Unpickler(file, **kwargs).load()


def loads(data: bytes) -> Any:
    return load(io.BytesIO(data))
