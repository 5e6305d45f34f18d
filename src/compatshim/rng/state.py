"""compatshim's own RNG state: the on-disk schema, and its validation into plain parts.

The schema holds only what ``torch.load(weights_only=True)`` accepts on every
torch 2.x release (dicts, lists, str, int, float, None and CPU tensors), so a
state can live inside any user checkpoint. numpy's state is stored as an int64
tensor, never as a numpy object: that is what keeps a file readable across the
numpy 1.x / 2.x line (``numpy.core`` became ``numpy._core``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

from .._text import cut, short
from .errors import RNGStateError

STATE_FORMAT = "compatshim.rng.state"
FILE_FORMAT = "compatshim.rng.file"
SCHEMA_VERSION = 1
KNOWN_FILE_VERSIONS = (SCHEMA_VERSION,)  # the file versions parse_file reads
MAX_RANK_DIGITS = 7  # a rank number of 10 million or more is no real job's
MAX_SAVED_RANK = 10**MAX_RANK_DIGITS - 1

PY_STATE_WORDS = 625  # random.getstate()[1]: 624 MT words + the position
MT_WORDS = 624
CUDA_STATE_BYTES = 16  # seed (uint64) + philox offset (int64), torch 2.1 and later
LEGACY_CUDA_STATE_BYTES = 816  # torch 2.0: 800 unused bytes, then seed and offset
_U32 = 2**32


@dataclass(frozen=True)
class NumpyMT:
    """numpy's legacy global MT19937 state, as ``numpy.random.get_state()`` spells it."""

    key: tuple[int, ...]
    pos: int
    has_gauss: int
    cached_gaussian: float

    def as_numpy_tuple(self) -> tuple[Any, ...]:
        import numpy as np

        key = np.array(self.key, dtype=np.uint32)
        return ("MT19937", key, self.pos, self.has_gauss, self.cached_gaussian)


PythonState = tuple[int, tuple[int, ...], Optional[float]]


@dataclass
class Parts:
    """One process's generators, validated: what ``restore`` plans with."""

    python: PythonState | None = None
    numpy: NumpyMT | None = None
    torch_cpu: Any = None  # uint8 CPU tensor
    cuda: list[Any] = field(default_factory=list)  # one 16-byte uint8 tensor per device
    xpu: list[Any] = field(default_factory=list)
    mps: Any = None
    meta: dict[str, Any] = field(default_factory=dict)


def _torch() -> Any:
    import torch

    return torch


def _fail(where: str, problem: str) -> RNGStateError:
    return RNGStateError(f"invalid RNG state at {where}: {problem}")


def _same(value: Any, expected: str | int) -> bool:
    """``value == expected`` for untrusted values (a tensor or array must not decide it)."""
    return type(value) is type(expected) and value == expected


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int_in(value: Any, low: int, high: int, where: str) -> int:
    if not _is_int(value) or not low <= value <= high:
        raise _fail(where, f"expected an int in [{low}, {high}], got {short(value)}")
    return int(value)


def _float(value: Any, where: str, *, allow_none: bool = False) -> float | None:
    if value is None and allow_none:
        return None
    try:
        finite = not isinstance(value, bool) and isinstance(value, (int, float))
        finite = finite and math.isfinite(value)
    except OverflowError:
        finite = False
    if not finite:
        raise _fail(where, f"expected a finite float, got {short(value)}")
    return float(value)


MAX_STATE_ELEMENTS = 1 << 20  # generous: a CPU generator state is 5056 bytes


def _tensor(value: Any, where: str, dtype_name: str, numel: int | None = None) -> Any:
    """A checked 1-D CPU tensor; sizes and strides are checked before anything is copied."""
    torch = _torch()
    if not isinstance(value, torch.Tensor):
        raise _fail(where, f"expected a torch tensor, got {type(value).__name__}")
    _dense(value, where)
    limit = numel if numel is not None else MAX_STATE_ELEMENTS
    if value.dim() == 1 and value.numel() > limit:
        raise _fail(where, f"expected at most {limit} elements, got {value.numel()}")
    if value.dim() == 1 and value.numel() > 1 and value.stride(0) != 1:
        raise _fail(where, "an expanded or strided tensor is not a generator state")
    if value.dtype != getattr(torch, dtype_name) or value.dim() != 1:
        raise _fail(
            where, f"expected a 1-D {dtype_name} tensor, got {value.dtype} {tuple(value.shape)}"
        )
    if value.device.type != "cpu":
        raise _fail(where, f"expected a CPU tensor, got one on {value.device}")
    if numel is not None and value.numel() != numel:
        raise _fail(where, f"expected {numel} elements, got {value.numel()}")
    return value.detach().clone().contiguous()


_WORD_DTYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")


def _dense(value: Any, where: str) -> None:
    """A sparse or nested tensor is no generator state, and torch's reductions and strides
    raise their own errors on it (NotImplementedError for SparseCPU)."""
    if value.layout != _torch().strided:
        raise _fail(where, f"expected a dense tensor, got a {str(value.layout)[:40]} one")


def words(values: Any, where: str, count: int) -> tuple[int, ...]:
    """``count`` uint32 words from a tensor, list or tuple, range-checked."""
    torch = _torch()
    if isinstance(values, torch.Tensor):
        _dense(values, where)
        # every integer dtype torch has (uint16/32/64 from 2.3: torch.from_numpy of numpy's
        # uint32 key); torch.min has no kernel for the unsigned ones, nor for quantized ones
        dtypes = [getattr(torch, name) for name in _WORD_DTYPES if hasattr(torch, name)]
        if values.dtype not in dtypes:
            raise _fail(where, f"expected an integer tensor, got {values.dtype}")
        if values.dim() != 1 or values.numel() != count:
            raise _fail(where, f"expected {count} words, got shape {tuple(values.shape)}")
        if values.device.type != "cpu":
            raise _fail(where, f"expected a CPU tensor, got one on {values.device}")
        listed = values.tolist()  # exact Python ints for every dtype above, uint64 included
        if min(listed) < 0 or max(listed) >= _U32:
            raise _fail(where, "values outside the uint32 range")
        return tuple(listed)
    if not isinstance(values, (list, tuple)) or len(values) != count:
        size = len(values) if isinstance(values, (list, tuple)) else type(values).__name__
        raise _fail(where, f"expected {count} words, got {size}")
    if not all(type(word) is int for word in values) or min(values) < 0 or max(values) >= _U32:
        index, word = next(
            (i, w) for i, w in enumerate(values) if not (_is_int(w) and 0 <= w < _U32)
        )
        raise _fail(f"{where}[{index}]", f"expected a uint32, got {short(word)}")
    return tuple(values)


_MT_UPPER = 0x80000000  # the one bit of word 0 that MT19937's recurrence reads


def mt_key(key: tuple[int, ...], where: str) -> tuple[int, ...]:
    """``key`` unless its 19937 state bits are all zero (a zero-filled, corrupt state): such a
    generator returns only zeros; torch refuses its own ("Invalid mt19937 state"), random and
    numpy would accept it."""
    if not key[0] & _MT_UPPER and not any(key[1:MT_WORDS]):
        raise _fail(
            where,
            "an all-zero MT19937 key (a zero-filled state) gives a generator that returns only "
            "zeros; the saved state is corrupt: restore from another checkpoint or re-seed",
        )
    return key


def python_state(value: Any, where: str) -> PythonState:
    """Check ``random.getstate()`` output (version 3 only) by loading it into a scratch Random."""
    import random

    if not isinstance(value, (tuple, list)) or len(value) != 3:
        raise _fail(where, "expected (version, internal state, gauss_next)")
    version, internal, gauss = value
    if not _same(version, 3):
        raise _fail(where, f"unsupported random module state version {short(version)}")
    internal_words = words(internal, f"{where}.internal", PY_STATE_WORDS)
    mt_key(internal_words, f"{where}.internal")
    _int_in(internal_words[-1], 0, MT_WORDS, f"{where}.internal[-1]")
    state = (3, internal_words, _float(gauss, f"{where}.gauss_next", allow_none=True))
    try:
        random.Random().setstate(state)
    except (TypeError, ValueError, OverflowError) as exc:
        raise _fail(where, f"random.setstate refused it: {exc}") from None
    return state


def numpy_state(key: Any, pos: Any, has_gauss: Any, cached: Any, where: str) -> NumpyMT:
    return NumpyMT(
        key=mt_key(words(key, f"{where}.key", MT_WORDS), f"{where}.key"),
        pos=_int_in(pos, 0, MT_WORDS, f"{where}.pos"),
        has_gauss=_int_in(has_gauss, 0, 1, f"{where}.has_gauss"),
        cached_gaussian=_float(cached, f"{where}.cached_gaussian") or 0.0,
    )


def cpu_state(value: Any, where: str) -> Any:
    """A torch CPU generator state, checked by loading it into a scratch generator."""
    torch = _torch()
    tensor = _tensor(value, where, "uint8")
    try:
        torch.Generator().set_state(tensor)
    except (RuntimeError, TypeError, ValueError) as exc:
        raise _fail(where, f"torch refused it as a CPU generator state: {exc}") from None
    return tensor


def cuda_state(value: Any, where: str) -> Any:
    """A CUDA generator state; torch 2.0's 816-byte layout is converted to (seed, offset)."""
    tensor = _tensor(value, where, "uint8")
    if tensor.numel() == LEGACY_CUDA_STATE_BYTES:
        tensor = tensor[-CUDA_STATE_BYTES:].clone()
    if tensor.numel() != CUDA_STATE_BYTES:
        raise _fail(
            where,
            f"a CUDA generator state is {CUDA_STATE_BYTES} bytes (torch >= 2.1) or "
            f"{LEGACY_CUDA_STATE_BYTES} (torch 2.0), got {tensor.numel()}",
        )
    return tensor


def _device_list(value: Any, where: str, check: Any) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, (list, tuple)):
        raise _fail(where, f"expected a list of per-device states, got {type(value).__name__}")
    return [check(item, f"{where}[{index}]") for index, item in enumerate(value)]


def byte_state(value: Any, where: str) -> Any:
    return _tensor(value, where, "uint8")


def _require(state: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in state:
        raise _fail(where, f"missing key {key!r}")
    return state[key]


def captured_position(parts: Parts) -> tuple[int | None, int | None]:
    """(rank, world size) that ``capture()`` recorded; None outside a process group or if odd."""
    rank: Any = parts.meta.get("rank")
    world_size: Any = parts.meta.get("world_size")
    if not _is_int(rank) or not 0 <= rank <= MAX_SAVED_RANK:
        return None, None
    if not _is_int(world_size) or not rank < world_size:
        return int(rank), None
    return int(rank), int(world_size)


def is_state(obj: Any) -> bool:
    return isinstance(obj, Mapping) and _same(obj.get("format"), STATE_FORMAT)


def is_file(obj: Any) -> bool:
    return isinstance(obj, Mapping) and _same(obj.get("format"), FILE_FORMAT)


def parse_state(obj: Any, where: str = "state") -> Parts:
    """Validate a compatshim state dict into :class:`Parts`; raise RNGStateError on anything off."""
    if not isinstance(obj, Mapping):
        raise _fail(where, f"expected a dict, got {type(obj).__name__}")
    if not _same(obj.get("format"), STATE_FORMAT):
        raise _fail(where, f"format is {short(obj.get('format'))}, expected {STATE_FORMAT!r}")
    if not _same(obj.get("version"), SCHEMA_VERSION):
        raise _fail(where, f"schema version {short(obj.get('version'))} is not {SCHEMA_VERSION}")
    parts = Parts()
    py = _require(obj, "python", where)
    if py is not None:
        if not isinstance(py, Mapping):
            raise _fail(f"{where}.python", "expected a dict or None")
        parts.python = python_state(
            (
                _require(py, "version", f"{where}.python"),
                _require(py, "internal", f"{where}.python"),
                _require(py, "gauss_next", f"{where}.python"),
            ),
            f"{where}.python",
        )
    np_state = _require(obj, "numpy", where)
    if np_state is not None:
        w = f"{where}.numpy"
        if not isinstance(np_state, Mapping):
            raise _fail(w, "expected a dict or None")
        if not _same(_require(np_state, "bit_generator", w), "MT19937"):
            raise _fail(w, f"unsupported bit generator {short(np_state['bit_generator'])}")
        parts.numpy = numpy_state(
            _require(np_state, "key", w),
            _require(np_state, "pos", w),
            _require(np_state, "has_gauss", w),
            _require(np_state, "cached_gaussian", w),
            w,
        )
    cpu = _require(obj, "torch_cpu", where)
    parts.torch_cpu = None if cpu is None else cpu_state(cpu, f"{where}.torch_cpu")
    parts.cuda = _device_list(_require(obj, "cuda", where), f"{where}.cuda", cuda_state)
    parts.xpu = _device_list(obj.get("xpu"), f"{where}.xpu", byte_state)
    mps = obj.get("mps")
    parts.mps = None if mps is None else byte_state(mps, f"{where}.mps")
    meta = obj.get("meta", {})
    if not isinstance(meta, Mapping):
        raise _fail(f"{where}.meta", "expected a dict")
    parts.meta = dict(meta)
    return parts


@dataclass(frozen=True)
class SavedFile:
    """An RNG file parsed: every saved rank's parts and what the file says about the job.

    ``world_size`` None: the file holds one rank's state (``saved_rank`` if known)
    or one state for the whole job.
    """

    source: str
    world_size: int | None
    saved_rank: int | None
    ranks: list[Parts]


def make_file(
    states: Sequence[Mapping[str, Any]],
    *,
    source: str,
    world_size: int | None,
    saved_rank: int | None = None,
) -> dict[str, Any]:
    """The on-disk RNG file dict (inverse of :func:`parse_file`); the one place it is built."""
    found: dict[str, Any] = {
        "format": FILE_FORMAT,
        "version": SCHEMA_VERSION,
        "source": source,
        "world_size": world_size,
        "ranks": [dict(state) for state in states],
    }
    if world_size is None:
        found["saved_rank"] = saved_rank
    return found


def check_file_header(obj: Mapping[str, Any]) -> None:
    """The file's version and saved_rank, before anything reads it as version 1: a file of a
    later format is refused, never guessed at (also where ``read`` rebuilds a file dict)."""
    version = obj.get("version")
    if not (_is_int(version) and version in KNOWN_FILE_VERSIONS):
        known = ", ".join(str(v) for v in KNOWN_FILE_VERSIONS)
        raise RNGStateError(
            f"RNG file version {short(version)} is not one this release reads (known: {known}); "
            "a file from another compatshim release (read it with that one) or a damaged one"
        )
    saved_rank = obj.get("saved_rank")
    if saved_rank is None:
        return
    if obj.get("world_size") is not None:  # make_file writes saved_rank only without it
        raise RNGStateError(
            f"invalid RNG file: saved_rank {short(saved_rank)} beside world_size "
            f"{short(obj.get('world_size'))} (a saved_rank is written only for a one-rank file)"
        )
    if not _is_int(saved_rank) or not 0 <= saved_rank <= MAX_SAVED_RANK:
        raise RNGStateError(
            f"invalid RNG file: saved_rank {short(saved_rank)} is not a rank number "
            f"(an int in [0, {MAX_SAVED_RANK}] or None)"
        )


def parse_file(obj: Mapping[str, Any]) -> SavedFile:
    """Validate an RNG file dict into :class:`SavedFile`; the one place it is read."""
    check_file_header(obj)
    ranks = obj.get("ranks")
    if not isinstance(ranks, list) or not ranks:
        raise RNGStateError("invalid RNG file: 'ranks' must be a non-empty list of states")
    all_parts = [parse_state(entry, f"ranks[{i}]") for i, entry in enumerate(ranks)]
    world_size = obj.get("world_size")
    if world_size is None and len(all_parts) != 1:
        raise RNGStateError("invalid RNG file: several ranks but no world_size")
    if world_size is not None and (not _is_int(world_size) or world_size != len(all_parts)):
        raise RNGStateError(
            f"invalid RNG file: world_size {short(world_size)} but {len(all_parts)} rank states"
        )
    saved_rank = obj.get("saved_rank")
    source = obj.get("source", "compatshim")
    if not isinstance(source, str):  # never str() of what a file holds (a tensor, a big int)
        raise RNGStateError(f"invalid RNG file: 'source' is {short(source)}, not a str")
    return SavedFile(
        source=cut(source),
        world_size=world_size,
        saved_rank=saved_rank,
        ranks=all_parts,
    )


def to_state(parts: Parts) -> dict[str, Any]:
    """The on-disk dict for ``parts`` (inverse of :func:`parse_state`)."""
    torch = _torch()
    python = None
    if parts.python is not None:
        version, internal, gauss = parts.python
        python = {
            "version": version,
            "internal": torch.tensor(internal, dtype=torch.int64),
            "gauss_next": gauss,
        }
    numpy = None
    if parts.numpy is not None:
        numpy = {
            "bit_generator": "MT19937",
            "key": torch.tensor(parts.numpy.key, dtype=torch.int64),
            "pos": parts.numpy.pos,
            "has_gauss": parts.numpy.has_gauss,
            "cached_gaussian": parts.numpy.cached_gaussian,
        }
    return {
        "format": STATE_FORMAT,
        "version": SCHEMA_VERSION,
        "python": python,
        "numpy": numpy,
        "torch_cpu": parts.torch_cpu,
        "cuda": list(parts.cuda),
        "xpu": list(parts.xpu),
        "mps": parts.mps,
        "meta": dict(parts.meta),
    }
