"""Patch ``numpy-load-hardened``: hardened mode covers ``numpy.load(allow_pickle=True)``.

What breaks
    ``numpy.load(f, allow_pickle=True)`` unpickles with a plain ``pickle.load``:
    object arrays in ``.npy`` files and ``.npz`` members (``read_array``) and
    files that are a pickle (``load`` itself). A crafted file runs any code.
    So with ``COMPATSHIM_SAFE_LOAD=1``, which makes every ``torch.load``
    weights-only, an ``.npy`` beside the checkpoint still ran its payload.
    ``allow_pickle=True`` also lifts numpy's header limit (``max_header_size``,
    10 000 characters: "literal_eval is not actually safe for large inputs"),
    so a crafted header of N bytes reached ``ast.literal_eval`` whole: about
    100 bytes of syntax tree per two bytes of header (``[0,0,...]``), far past
    a small multiple of the file's size.

Which versions
    numpy 1.17 to 2.5: ``read_array`` and ``load`` live in ``numpy/lib/format.py``
    and ``numpy/lib/npyio.py`` in 1.x, ``numpy/lib/_format_impl.py`` and
    ``numpy/lib/_npyio_impl.py`` in 2.x; the targets are where users reach them
    (``numpy.lib.format``, ``numpy``), and the fix edits the namespace each
    function reads ``pickle`` from. Tested on 1.24, 1.26 and 2.5. Only in hardened
    mode: armed without ``COMPATSHIM_SAFE_LOAD=1`` the probe reports nothing
    to do and numpy behaves as numpy.

How it is detected
    Hardened only: the module's own reader (``read_array`` of an ``.npy``
    whose object array is a pickled ``types.SimpleNamespace``, or ``load`` of
    that pickle) hands it back, i.e. unpickles a global off compatshim's
    allowlist; or ``read_array(allow_pickle=True)`` parses an ``.npy`` header one
    character over numpy's limit (``numpy.lib.format`` only).

The fix
    The ``pickle`` of the reader's module becomes a stand-in whose ``load`` and
    ``loads`` are compatshim's loader (``checkpoint.load``'s machine, allowlist,
    deny list, budget and process-wide allow entries, numpy's names admitted as
    there) with plain object arrays admitted (``Request(object_arrays=True)``);
    everything else (``dump``, ``UnpicklingError``...) is the real module. A
    refusal is an :class:`~compatshim.checkpoint.UnsafeCheckpointError` (a
    ``pickle.UnpicklingError``, the type numpy's own ``load`` raises for a pickle
    it cannot read) naming the refused globals; for a pickle file numpy's ``load``
    wraps it in its own ``UnpicklingError`` (``__cause__``). Nothing runs. numpy
    is never imported by compatshim: the patch applies when numpy is imported.
    The format module's ``_read_array_header`` (every ``.npy`` reader calls it:
    ``read_array``, ``open_memmap``, ``load``, ``.npz`` members) keeps a header
    limit where ``allow_pickle=True`` lifted it: the ``max_header_size`` the caller
    passed to ``numpy.load``, ``read_array`` or ``open_memmap`` (each noted on entry,
    before numpy lifts it), numpy's default where none; ``2**64`` reads as numpy reads.
    A larger header is numpy's own ``ValueError``, with that advice.
    A stream that is not a plain file (an ``.npz`` member, a gzip file: seeking them
    inflates) is read once, forward, only as far as its pickle's STOP
    (:func:`one_pickle`), and inflated at most 64 bytes per stored byte (a 300 KB
    ``.npz`` member inflated to a 300 MB pickle); the loader reads those bytes, its
    budget a multiple of them.

Not covered
    Python 2 pickles of numpy arrays (their ``_reconstruct`` and data
    arguments are ``str``: refused as ``checkpoint.load`` refuses them). Other
    Python 2 ``str`` is read as ``encoding=`` asks, as numpy reads it. The header
    limit needs numpy's ``max_header_size`` (1.24+; older numpy has no limit at all).

Confirmed
    Right after the fix by :func:`confirm` (the stand-in is in place); end to
    end by the probe when ``status()`` or the doctor asks.

The revert
    That module's ``pickle`` and ``_read_array_header``, and numpy's entries, get the real
    ones back (Patcher).
"""

from __future__ import annotations

import contextvars
import io

from ._safe_pickle import SafePickle

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import ModuleType
    from typing import IO, Any

    from .._engine.patching import Patcher

_NAME = "numpy-load-hardened"
_PROMISE = "numpy.load(allow_pickle=True) reads pickles without running code from them"


def _read(file: IO[bytes], *, encoding: str = "ASCII", **_: Any) -> Any:
    """One pickle from ``file``'s position, read by ``checkpoint.load``'s machine (Python 2
    names are mapped as with ``fix_imports=True``; ``errors`` is not used: undecodable text
    is refused)."""
    from ..checkpoint.request import Request, read

    request = Request(encoding=encoding, object_arrays=True, expect="pickle")
    if not isinstance(file, _IN_PLACE):
        file = one_pickle(file)
    return read(file, request)


#: streams the loader reads in place: seeking to their end (the loader's size, its budget)
#: costs nothing. Others (an ``.npz`` member, a gzip stream) inflate their data to seek.
_IN_PLACE = (io.BytesIO, io.BufferedReader, io.BufferedRandom, io.FileIO)
_CHUNK = 1 << 16  # read ahead while stepping over short opcodes: the most read past the pickle
_LONG_READ = 1 << 20  # a long argument is read in parts: its claimed length is never allocated
#: how the scan steps over an opcode: its whole length in bytes (> 0), STOP (0), a line
#: (pickletools' UP_TO_NEWLINE, -1), two lines (-6: GLOBAL, INST), no such opcode (-7), or a
#: length first (pickletools' n, -2 to -5)
_STOP, _LINE, _TWO_LINES, _UNKNOWN = 0, -1, -6, -7
_LENGTHS = {-2: (1, False), -3: (4, True), -4: (4, False), -5: (8, False)}  # pickletools' n


def _opcode_kinds() -> list[int]:
    """Per opcode byte, how the scan steps over it, from pickletools."""
    import pickletools

    kinds = [_UNKNOWN] * 256
    for op in pickletools.opcodes:
        arg = op.arg
        if op.name == "STOP":
            kind = _STOP
        elif arg is None or arg.n >= 0:
            kind = 1 + (arg.n if arg is not None else 0)
        elif arg is pickletools.stringnl_noescape_pair:
            kind = _TWO_LINES
        else:
            kind = arg.n
        kinds[ord(op.code)] = kind
    return kinds


def _need(file: IO[bytes], data: bytearray, upto: int) -> bool:
    """Read on until ``data`` holds ``upto`` bytes (False: the stream ended first)."""
    while len(data) < upto:
        chunk = file.read(min(max(upto - len(data), _CHUNK), _LONG_READ))
        if not chunk:
            return False
        data += chunk
    return True


def one_pickle(file: IO[bytes]) -> io.BytesIO:
    """The pickle at ``file``'s position, read forward once, as a stream of its own bytes.

    A compressed stream (an ``.npz`` member, a gzip file) seeks by inflating: the loader's
    three seeks to its end (its size: the budget and every length check) each inflated the
    whole rest of the stream, however little of it the pickle was. Here the opcodes are
    stepped over (not run) to the pickle's STOP, so only the pickle is inflated, once, and
    the loader's budget is a multiple of the bytes actually inflated. ``file`` is left just
    after the pickle, as ``pickle.load`` leaves it (a seek back over at most one read-ahead
    chunk); a pickle that does not parse is handed over as read, for the loader to word
    the error.
    """
    from ..checkpoint.request import MAX_LINE

    kinds = _opcode_kinds()
    start = file.tell()
    source, file = file, _bounded(file)
    data = bytearray()
    pos = 0
    while True:
        if len(data) < pos + 9 and not _need(file, data, pos + 9) and pos >= len(data):
            break
        limit = len(data) - 9  # the longest fixed-length opcode is 9 bytes
        while pos <= limit and (kind := kinds[data[pos]]) > 0:
            pos += kind  # most opcodes: a fixed length
        if pos >= len(data):
            continue
        kind = kinds[data[pos]]
        if kind == _UNKNOWN:
            break
        if kind > 0:
            pos += kind
        elif kind == _STOP:
            pos += 1
            if len(data) > pos:
                del data[pos:]
                source.seek(start + pos)
            break
        elif kind in (_LINE, _TWO_LINES):
            for _ in range(1 if kind == _LINE else 2):
                end, searched = -1, pos + 1
                while (end := data.find(b"\n", searched)) < 0:
                    searched = len(data)
                    if searched - pos > MAX_LINE or not _need(file, data, searched + 1):
                        break
                if end < 0:
                    break
                pos = end
            else:
                pos += 1
                continue
            break
        else:
            width, signed = _LENGTHS[kind]
            if not _need(file, data, pos + 1 + width):
                break
            size = int.from_bytes(data[pos + 1 : pos + 1 + width], "little", signed=signed)
            pos += 1 + width + size
            if size < 0 or not _need(file, data, pos):
                break
    found = io.BytesIO(bytes(data))
    name = getattr(source, "name", None)
    if name:
        found.name = name  # type: ignore[attr-defined]
    return found


def _bounded(file: IO[bytes]) -> IO[bytes]:
    """``file`` read through ``_expand.Bounded``: at most ``EXPANSION_PER_BYTE`` bytes per
    byte it is stored in (``request.compressed_size``: an ``.npz`` member's compressed
    size held to its archive's, a gzip, bz2 or lzma file's size on disk; else the size of
    the file under it); a stream of none of them is read as it comes."""
    from ..checkpoint.request import Bounded, compressed_size, expansion_limit, stored_size

    stored = compressed_size(file)
    if stored is None:
        stored = stored_size(file)
        if stored is None:
            return file
    what = str(getattr(file, "name", None) or "the stream")
    return Bounded(file, expansion_limit(stored), what, "it inflates", "")  # type: ignore[return-value]


def safe_pickle(real: ModuleType) -> SafePickle:
    return SafePickle(
        real,
        patch=_NAME,
        read=_read,
        read_as=" for numpy.load",
        promise=_PROMISE,
        unnamed="a numpy.load stream",
    )


def _record(event: str, detail: str) -> None:
    from .._engine import decisions

    decisions.record(_NAME, event, detail)


#: target module -> the function of it that calls ``pickle.load``; the patch edits the
#: namespace that function reads ``pickle`` from (numpy 2 moved both into ``_impl`` modules)
READERS = {"numpy.lib.format": "read_array", "numpy": "load"}
_NPY_OBJECT_HEADER = b"{'descr': '|O', 'fortran_order': False, 'shape': (1,), }"


def _probe_bytes() -> tuple[bytes, bytes]:
    """A pickled SimpleNamespace (harmless, off the allowlist), alone and as an object .npy."""
    import pickle
    import types

    payload = pickle.dumps(types.SimpleNamespace(), protocol=2)
    header = _NPY_OBJECT_HEADER.ljust(64 - 10 - 1) + b"\n"
    npy = b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header + payload
    return payload, npy


def _reader(module: ModuleType) -> Any:
    """The module's reader function (``read_array`` or ``load``), or a LookupError."""
    name = READERS.get(module.__name__, "")
    found = vars(module).get(name)
    found = getattr(found, _REAL, found)  # under compatshim's entry: numpy's own function
    if not isinstance(getattr(found, "__globals__", None), dict):
        raise LookupError(
            f"{module.__name__}.{name} is {found!r}, not a function: layout not known"
        )
    return found


def _runs_any_global(module: ModuleType) -> bool:
    """Whether the module's reader hands back a pickled SimpleNamespace."""
    import io
    import pickle
    import types

    payload, npy = _probe_bytes()
    reader = _reader(module)
    try:
        if module.__name__ == "numpy":
            found = reader(io.BytesIO(payload), allow_pickle=True)
        else:
            found = reader(io.BytesIO(npy), allow_pickle=True)
    except pickle.UnpicklingError:
        return False
    return type(found) is types.SimpleNamespace


def _header_limit(module: ModuleType) -> int | None:
    """numpy's header limit where this module's readers take one (1.24+), else None."""
    import inspect

    if module.__name__ != "numpy.lib.format":
        return None
    names = _reader(module).__globals__
    limit, parse = names.get("_MAX_HEADER_SIZE"), names.get("_read_array_header")
    if type(limit) is not int or not callable(parse):
        return None
    if "max_header_size" not in inspect.signature(parse).parameters:
        return None
    return limit


def _lifts_header_limit(module: ModuleType) -> bool:
    """Whether ``read_array(allow_pickle=True)`` parses a header one character over the limit."""
    import io

    limit = _header_limit(module)
    if limit is None:
        return False
    header = b"{'descr': '<f8', 'fortran_order': False, 'shape': (0,), }"
    size = ((limit + 10) // 64 + 1) * 64 - 10  # over the limit, aligned as numpy writes
    header = header.ljust(size - 1) + b"\n"
    npy = b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header
    try:
        _reader(module)(io.BytesIO(npy), allow_pickle=True)
    except ValueError:
        return False
    return True


#: numpy's "no limit", which ``read_array`` and ``load`` put in ``max_header_size`` when
#: allow_pickle=True (the file is trusted), whatever their caller passed
_LIFTED = 2**64
#: ``max_header_size`` as the caller passed it (numpy's default where not) to the outermost
#: numpy entry running in this thread/task; None outside any
_ASKED: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "compatshim_numpy_max_header_size", default=None
)
#: numpy's functions that take ``max_header_size`` from a caller and read a header
ENTRIES = {"numpy.lib.format": ("read_array", "open_memmap"), "numpy": ("load",)}
_REAL = "_compatshim_numpy_entry_of"  # an entry's attribute: numpy's function it wraps


def _takes_limit(function: Any) -> bool:
    """Whether ``function`` takes a ``max_header_size`` (numpy 1.24+)."""
    defaults = getattr(function, "__kwdefaults__", None) or {}
    return type(defaults.get("max_header_size")) is int


def _entry(real: Any) -> Any:
    """``real`` (``load``, ``read_array``, ``open_memmap``) recording for :class:`BoundedHeader`
    the ``max_header_size`` its caller passed, before allow_pickle=True lifts it; None where
    ``real`` takes none (numpy < 1.24)."""
    import functools

    if not _takes_limit(real):
        return None
    default = real.__kwdefaults__["max_header_size"]

    @functools.wraps(real)
    def entry(*args: Any, **kwargs: Any) -> Any:
        if _ASKED.get() is not None:  # inside another entry: its caller's value stands
            return real(*args, **kwargs)
        token = _ASKED.set(kwargs.get("max_header_size", default))
        try:
            return real(*args, **kwargs)
        finally:
            _ASKED.reset(token)

    vars(entry)[_REAL] = real
    return entry


class BoundedHeader:
    """numpy's ``_read_array_header``, keeping a header limit where allow_pickle=True lifted
    it: the ``max_header_size`` the caller passed to numpy (numpy's own default where none)."""

    def __init__(self, real: Any, limit: int) -> None:
        self.real, self.limit = real, limit

    def __call__(self, fp: Any, version: Any, max_header_size: int | None = None) -> Any:
        if max_header_size is None:
            max_header_size = self.limit
        if max_header_size < _LIFTED:  # not lifted: the caller's own limit
            return self.real(fp, version, max_header_size=max_header_size)
        asked = _ASKED.get()
        limit = self.limit if asked is None else asked
        if limit >= _LIFTED:  # the caller lifted it: numpy's behaviour
            return self.real(fp, version, max_header_size=limit)
        try:
            return self.real(fp, version, max_header_size=limit)
        except ValueError as exc:
            if "may not be safe" not in str(exc):
                raise
            _record("refused", f"an .npy header over the {limit}-character limit")
            raise ValueError(
                f"{exc}\ncompatshim's hardened mode keeps the {limit}-character header limit "
                "(max_header_size) with allow_pickle=True (the file is not trusted: parsing a "
                "large header costs far more memory than it holds). A trusted file loads with "
                "a larger max_header_size=..., which hardened mode honours."
            ) from None


def probe(module: ModuleType) -> bool:
    """Hardened mode only: True while the module's reader unpickles any global or lifts
    numpy's header limit."""
    from .. import _settings

    if not _settings.safe_load():
        return False
    return _runs_any_global(module) or _lifts_header_limit(module)


def confirm(module: ModuleType) -> bool:
    """The stand-ins are in place (the probe would load compatshim's loader)."""
    names = _reader(module).__globals__
    bounded = _header_limit(module) is None or isinstance(
        names.get("_read_array_header"), BoundedHeader
    )
    entries = all(
        not _takes_limit(found) or _REAL in vars(found)
        for found in (vars(module).get(name) for name in ENTRIES[module.__name__])
    )
    return isinstance(names.get("pickle"), SafePickle) and bounded and entries


def apply(module: ModuleType, patcher: Patcher) -> None:
    import pickle

    names = _reader(module).__globals__
    if names.get("pickle") is not pickle:
        raise LookupError(
            f"the pickle {module.__name__}.{READERS[module.__name__]} reads is "
            f"{names.get('pickle')!r}, not the pickle module: layout not known"
        )
    limit = _header_limit(module)
    patcher.setitem(names, "pickle", safe_pickle(pickle))
    if limit is not None:
        patcher.setitem(
            names, "_read_array_header", BoundedHeader(names["_read_array_header"], limit)
        )
    for name in ENTRIES[module.__name__]:
        entry = _entry(vars(module).get(name))
        if entry is not None:
            patcher.setattr(module, name, entry)
