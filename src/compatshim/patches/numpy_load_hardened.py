"""Patch ``numpy-load-hardened``: hardened mode covers ``numpy.load(allow_pickle=True)``.

What breaks
    ``numpy.load(f, allow_pickle=True)`` unpickles with a plain ``pickle.load``:
    object arrays in ``.npy`` files and ``.npz`` members (``read_array``) and
    files that are a pickle (``load`` itself). A crafted file runs any code.
    So with ``COMPATSHIM_SAFE_LOAD=1``, which makes every ``torch.load``
    weights-only, an ``.npy`` beside the checkpoint still ran its payload.

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
    allowlist.

The fix
    The ``pickle`` of the reader's module becomes a stand-in whose ``load`` and
    ``loads`` are compatshim's loader (``checkpoint.load``'s machine, allowlist,
    deny list, budget and process-wide allow entries, numpy's names admitted as
    there) with plain object arrays admitted (``checkpoint._numpy.object_arrays``);
    everything else (``dump``, ``UnpicklingError``...) is the real module. A
    refusal is an :class:`~compatshim.checkpoint.UnsafeCheckpointError` (a
    ``pickle.UnpicklingError``, the type numpy's own ``load`` raises for a pickle
    it cannot read) naming the refused globals; for a pickle file numpy's ``load``
    wraps it in its own ``UnpicklingError`` (``__cause__``). Nothing runs. numpy
    is never imported by compatshim: the patch applies when numpy is imported.

Not covered
    Python 2 pickles of numpy arrays (their ``_reconstruct`` and data
    arguments are ``str``: refused as ``checkpoint.load`` refuses them). Other
    Python 2 ``str`` is read as ``encoding=`` asks, as numpy reads it.

Confirmed
    Right after the fix by :func:`confirm` (the stand-in is in place); end to
    end by the probe when ``status()`` or the doctor asks.

The revert
    That module's ``pickle`` gets the real module back (Patcher).
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import ModuleType
    from typing import IO, Any

    from .._engine.patching import Patcher

_NAME = "numpy-load-hardened"
_PROMISE = "numpy.load(allow_pickle=True) reads pickles without running code from them"


class SafePickle:
    """``pickle`` as numpy's readers see it: ``load``/``loads`` never run code from the data."""

    def __init__(self, real: ModuleType) -> None:
        self._real = real

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def load(self, file: Any, *, encoding: str = "ASCII", **_: Any) -> Any:
        """``pickle.load(file)`` through compatshim's loader (Python 2 names are mapped as with
        ``fix_imports=True``; ``errors`` is not used: undecodable text is refused)."""
        return _load(file, encoding)

    def loads(self, data: Any, /, *, encoding: str = "ASCII", **_: Any) -> Any:
        import io

        return _load(io.BytesIO(bytes(data)), encoding)


def _load(file: Any, encoding: str) -> Any:
    import io

    from ..checkpoint import CheckpointError
    from .torch_load_safe_globals import seekable

    what = repr(getattr(file, "name", None) or "a numpy.load stream")
    if not seekable(file):
        file = io.BytesIO(file.read())
    try:
        return _read(file, encoding)
    except CheckpointError as why:  # UnsafeCheckpointError included
        _record("refused", f"{what}: {type(why).__name__}")
        raise _refusal(why, what) from None


def _read(file: IO[bytes], encoding: str) -> Any:
    """One pickle from ``file``'s position, read by ``checkpoint.load``'s machine."""
    from ..checkpoint import CheckpointError
    from ..checkpoint._container import read, sniff
    from ..checkpoint._load import Loader
    from ..checkpoint._machine import py2_str_read_as
    from ..checkpoint._numpy import object_arrays

    def reader(source: IO[bytes], what: str, path: str | None) -> Any:
        if sniff(source) != "pickle":
            raise CheckpointError(f"{what}: not a pickle")
        return Loader(None, (), False).read(source, what, path)

    with object_arrays(), py2_str_read_as(encoding):
        return read(file, reader)


def _refusal(why: BaseException, what: str) -> BaseException:
    from .torch_load_safe_globals import _refused_hardened

    return _refused_hardened(why, what, read_as=" for numpy.load", promise=_PROMISE)


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


def probe(module: ModuleType) -> bool:
    """Hardened mode only: True while the module's reader unpickles any global."""
    from .. import _settings

    if not _settings.safe_load():
        return False
    return _runs_any_global(module)


def confirm(module: ModuleType) -> bool:
    """The stand-in is the reader's ``pickle`` (the probe would load compatshim's loader)."""
    return isinstance(_reader(module).__globals__.get("pickle"), SafePickle)


def apply(module: ModuleType, patcher: Patcher) -> None:
    import pickle

    names = _reader(module).__globals__
    if names.get("pickle") is not pickle:
        raise LookupError(
            f"the pickle {module.__name__}.{READERS[module.__name__]} reads is "
            f"{names.get('pickle')!r}, not the pickle module: layout not known"
        )
    patcher.setitem(names, "pickle", SafePickle(pickle))
