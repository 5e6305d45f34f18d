"""Patch ``torch-dcp-safe-metadata``: hardened mode covers torch.distributed.checkpoint folders.

What breaks
    A DCP checkpoint folder (``dcp.save``, ``save_state_dict``; what FSDP,
    torchtitan, Lightning's distributed checkpoints and accelerate's
    ``SHARDED_STATE_DICT`` write) holds a ``.metadata`` that torch reads with a
    plain ``pickle.load`` (``FileSystemReader.read_metadata`` in
    ``torch/distributed/checkpoint/filesystem.py``, 2.1 to 2.15, and the separate
    ``FsspecReader.read_metadata`` in ``_fsspec_filesystem.py``, 2.1 to 2.3;
    upstream calls DCP a trusted environment). Every reader of the folder gets there:
    ``dcp.load``/``load_state_dict``, ``format_utils.dcp_to_torch_save``,
    Lightning's consolidation and accelerate's ``merge-weights``. So with
    ``COMPATSHIM_SAFE_LOAD=1``, which makes every ``torch.load`` weights-only,
    a poisoned ``.metadata`` still ran its payload. (The folder's non-tensor
    items go through ``torch.load``, which hardened mode already covers.)

Which versions
    torch 2.1 (DCP's ``FileSystemReader``) to 2.15, tested on 2.1, 2.2, 2.4, 2.5, 2.11,
    2.13 and 2.15 (on 2.9-2.11 ``dcp.load`` drops the refusal's words unless
    ``torch-dcp-metadata-error`` puts them back). Two targets: ``filesystem`` and
    ``_fsspec_filesystem``, whose reader has its own ``pickle.load`` in 2.1 to 2.3
    (from 2.4 it subclasses ``FileSystemReader`` and defines no reader of its own: the
    probe finds nothing there; 2.15 keeps the module as a shim that warns on import).
    Only in hardened mode: armed without ``COMPATSHIM_SAFE_LOAD=1`` the probe
    reports nothing to do and DCP behaves as torch's.

How it is detected
    Hardened only: each reader class the module defines itself (``FileSystemReader``,
    ``FsspecReader``) on a temporary folder whose
    ``.metadata`` pickles a ``types.SimpleNamespace`` (harmless, and off
    compatshim's allowlist): the defect is present while ``read_metadata``
    hands it back, i.e. unpickles whatever global the file names.

The fix
    The module's ``pickle`` (which its reader calls ``pickle.load`` on and its
    writer ``pickle.dump``) becomes a stand-in whose ``load`` is compatshim's
    loader, pickles only, with DCP's classes on the allowlist
    (``compatshim.checkpoint.request``, ``expect="dcp-metadata"``: a pickle whose data
    files lie inside the folder); everything else is the real module. A
    refusal raises :class:`~compatshim.checkpoint.UnsafeCheckpointError` (a
    ``pickle.UnpicklingError``) naming the refused globals; nothing runs.
    ``torch.distributed.checkpoint`` is never imported by compatshim: the patch
    applies when the user's code imports its ``filesystem`` (or ``_fsspec_filesystem``)
    module.

    Hardened mode reads every ``torch.load`` with compatshim's loader alone, so
    the module's ``_create_file_view`` also hands ``torch.load`` an exact view of
    each item: torch's file view seeks from the end the wrong way and reads past
    its slice (torch 2.1 to 2.15).

    Two more targets make a refused item say where it is and let it be caught as
    compatshim's error: ``default_planner``'s ``DefaultLoadPlanner.load_bytes`` (where a
    non-tensor item is ``torch.load``-ed) names the item's key and its ``.distcp`` file (the
    file from the view above, on this thread); ``utils``' ``CheckpointException`` (which
    ``_DistWrapper`` raises with every rank's failures) becomes a subclass that, where every
    failure is compatshim's refusal, is also an
    :class:`~compatshim.checkpoint.UnsafeCheckpointError`: ``except CheckpointException``
    still catches it, and so do ``except compatshim.checkpoint.CheckpointError`` and
    ``except Exception`` (torch's own is a ``BaseException``).

    From torch 2.8 an item may be written through stream transforms (zstd), and torch
    reads it whole: a 33 KB frame of zeros made 2.3 GB of memory. Hardened, the module's
    ``_StorageReaderTransforms.transform_load_stream`` hands torch the stream bounded
    (``checkpoint/_expand.py``): at most 64 bytes per stored byte, plus, for a tensor's
    item, the bytes ``.metadata`` declares for its chunk (at most its tensor's, which the
    planner checks the template holds), recorded by ``FileSystemReader.set_up_storage_reader``.

Confirmed
    Right after the fix by :func:`confirm` (the stand-in is in place); end to
    end by the probe when ``status()`` or the doctor asks.

The revert
    The module's ``pickle`` attribute gets the real module back, and each
    wrapped reader its function (Patcher), unless a library wrapped one after
    compatshim: that library's wrapper stays, and compatshim's under it passes
    every call on.
"""

from __future__ import annotations

import functools
import io
import threading
import weakref

from .._engine.patching import in_force, ours, wrapping
from ._safe_pickle import SafePickle

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import ModuleType
    from typing import Any, Callable

    from .._engine.patching import Patcher

_NAME = "torch-dcp-safe-metadata"
_PLANNER = "torch.distributed.checkpoint.default_planner"
_UTILS = "torch.distributed.checkpoint.utils"
_reading = threading.local()  # the data file DCP's reader is slicing on this thread


def _read(file: Any, **_: Any) -> Any:
    """``pickle.load(file)`` of a ``.metadata``, by compatshim's loader (options ignored)."""
    from ..checkpoint.request import Request, read

    return read(file, Request(expect="dcp-metadata"))


def safe_pickle(real: ModuleType) -> SafePickle:
    return SafePickle(
        real,
        patch=_NAME,
        read=_read,
        read_as=" as a DCP .metadata",
        promise="torch.distributed.checkpoint's .metadata is read without running code from it",
        unnamed="a DCP .metadata stream",
    )


def _readers(module: ModuleType) -> list[type]:
    """The classes of ``module`` that define their own ``read_metadata``."""
    return [
        value
        for value in vars(module).values()
        if isinstance(value, type)
        and value.__module__ == module.__name__
        and "read_metadata" in vars(value)
    ]


def _runs_any_global(reader: type) -> bool:
    """Whether ``reader(folder).read_metadata()`` hands back a pickled SimpleNamespace."""
    import os
    import pickle
    import shutil
    import tempfile
    import types

    folder = tempfile.mkdtemp(prefix="compatshim-dcp-probe-")
    try:
        with open(os.path.join(folder, ".metadata"), "wb") as file:
            pickle.dump(types.SimpleNamespace(), file)
        try:
            found = reader(folder).read_metadata()
        except pickle.UnpicklingError:
            return False
        return type(found) is types.SimpleNamespace
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def probe(module: ModuleType) -> bool:
    """Hardened mode only: True while a reader of this module unpickles any global; for the
    planner and utils modules, while their refusals are torch's alone (not yet wrapped)."""
    from .. import _settings

    if not _settings.safe_load():
        return False
    if module.__name__ == _PLANNER:
        return _planner_real(module) is not None
    if module.__name__ == _UTILS:
        found = vars(module).get("CheckpointException")
        return isinstance(found, type) and not getattr(found, "_compatshim", False)
    return any(_runs_any_global(reader) for reader in _readers(module))


def confirm(module: ModuleType) -> bool:
    """The stand-in is in place (the probe would load compatshim's loader)."""
    if module.__name__ == _PLANNER:
        planner = vars(module).get("DefaultLoadPlanner")
        return in_force(vars(planner).get("load_bytes"))
    if module.__name__ == _UTILS:
        return getattr(vars(module).get("CheckpointException"), "_compatshim", False)
    return isinstance(vars(module).get("pickle"), SafePickle)


def _planner_real(module: ModuleType) -> Any:
    """torch's ``load_bytes`` to wrap; None where there is none or ours is in force."""
    planner = vars(module).get("DefaultLoadPlanner")
    return wrapping(vars(planner).get("load_bytes")) if isinstance(planner, type) else None


def _naming_items(real: Any, patcher: Patcher) -> Any:
    """``load_bytes`` whose refusal names the item's key and its data file."""

    @functools.wraps(real)
    def load_bytes(self: Any, read_item: Any, value: Any) -> Any:
        from ..checkpoint.errors import UnsafeCheckpointError

        try:
            return real(self, read_item, value)
        except UnsafeCheckpointError as exc:
            if not patcher.live:  # reverted, still held by a library that wrapped it
                raise
            where = _item_name(getattr(read_item, "dest_index", None))
            raise type(exc)(f"{where}: {exc}", exc.refused) from None

    return ours(load_bytes, real, patcher)


def _item_name(index: Any) -> str:
    """The item a ``MetadataIndex`` names, and the data file DCP's reader is slicing."""
    fqn = getattr(index, "fqn", None)
    where = f"DCP item {fqn!r}" if isinstance(fqn, str) else "a DCP item"
    file = getattr(_reading, "file", None)
    return f"{where} in {file}" if isinstance(file, str) else where


def _catchable(real: type) -> type:
    """torch's ``CheckpointException``, made as one that is also compatshim's refusal where
    every rank's failure is one (see the module docstring); anything else is torch's."""
    from ..checkpoint.errors import UnsafeCheckpointError

    def refusal(failure: Any) -> bool:
        first = failure[0] if isinstance(failure, tuple) and failure else failure
        return isinstance(first, UnsafeCheckpointError)

    class CheckpointException(real):  # type: ignore[valid-type,misc]
        _compatshim = True

        def __new__(cls, *args: Any, **kwargs: Any) -> Any:
            failures = args[1] if len(args) > 1 else kwargs.get("failures")
            if (
                cls is CheckpointException
                and isinstance(failures, dict)
                and failures
                and all(map(refusal, failures.values()))
            ):
                cls = Refused
            return real.__new__(cls, *args, **kwargs)

        def __reduce__(self) -> Any:  # ranks exchange it: rebuilt as the receiver's utils makes it
            # (msg, failures) explicitly: Refused's args are UnsafeCheckpointError's (msg,)
            return _rebuilt, (self.args[0] if self.args else "", self.failures)

    class Refused(CheckpointException, UnsafeCheckpointError):  # type: ignore[misc]
        @property
        def refused(self) -> tuple[str, ...]:
            failures = getattr(self, "failures", {}) or {}
            names: list[str] = []
            for failure in failures.values():
                first = failure[0] if isinstance(failure, tuple) else failure
                names.extend(getattr(first, "refused", ()))
            return tuple(dict.fromkeys(names))

        @refused.setter
        def refused(self, value: Any) -> None:
            pass  # UnsafeCheckpointError's __init__ is not run: torch's builds the object

    for made in (CheckpointException, Refused):  # tracebacks read torch's name
        made.__module__, made.__qualname__ = real.__module__, real.__qualname__
        made.__name__ = real.__name__
    return CheckpointException


def _rebuilt(*args: Any) -> Any:
    """A ``CheckpointException`` from another rank, made by this process's DCP ``utils`` (the
    subclass where this patch is armed, torch's own where not), so ``_DistWrapper``'s
    ``isinstance`` checks hold on every rank."""
    from torch.distributed.checkpoint import utils

    return utils.CheckpointException(*args)


class _Slice(io.RawIOBase):
    """A read-only view of ``length`` bytes at ``offset`` of an open file (DCP's item).

    Stands for torch's ``_ReaderView``, whose ``seek(n, SEEK_END)`` lands past the end of
    its slice and whose ``seek``/``tell`` mix absolute and relative positions: the zip
    reader finds no archive in it. Reads go straight to the file (no copy of the item).
    """

    def __init__(self, file: Any, offset: int, length: int) -> None:
        super().__init__()
        self._file, self._start, self._length, self._pos = file, offset, length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET, /) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._length}[whence]
        if base + offset < 0:
            raise ValueError(f"negative seek position {base + offset}")
        self._pos = base + offset
        return self._pos

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        size = min(len(view), self._length - self._pos)
        if size <= 0:
            return 0
        self._file.seek(self._start + self._pos)
        got = self._file.readinto(view[:size])
        if not got:
            raise OSError(
                f"DCP data file ends inside an item ({self._length} bytes at {self._start})"
            )
        self._pos += got
        return int(got)


def _slicing(real: Any, patcher: Patcher) -> Any:
    """DCP's ``_create_file_view``, made exact (see :class:`_Slice`; buffered for small reads);
    the file's name is kept for a refusal of the item read from it (``_naming_items``)."""

    @functools.wraps(real)
    def _create_file_view(file: Any, offset: int, length: int) -> Any:
        if not patcher.live:  # reverted, still held by a library that wrapped it
            return real(file, offset, length)
        name = getattr(file, "name", None)
        _reading.file = name if isinstance(name, str) else None
        return io.BufferedReader(_Slice(file, offset, length))

    return ours(_create_file_view, real, patcher)


# a reader's transforms -> the .metadata it was set up with (set_up_storage_reader)
_declared: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def _recording(real: Any, patcher: Patcher) -> Any:
    """``set_up_storage_reader`` that keeps the ``.metadata`` for its reader's transforms."""

    @functools.wraps(real)
    def set_up_storage_reader(self: Any, metadata: Any, *args: Any, **kwargs: Any) -> Any:
        result = real(self, metadata, *args, **kwargs)
        transforms = vars(self).get("transforms")
        if transforms is not None and patcher.live:
            _declared[transforms] = metadata
        return result

    return ours(set_up_storage_reader, real, patcher)


def _chunk_bytes(metadata: Any, fqn: Any, offsets: Any) -> int:
    """The bytes ``.metadata`` declares for the chunk of tensor ``fqn`` at ``offsets``, at
    most its tensor's (0 where it declares none)."""
    import math

    found = vars(metadata).get("state_dict_metadata", {}).get(fqn)
    size, props = getattr(found, "size", None), getattr(found, "properties", None)
    itemsize = getattr(getattr(props, "dtype", None), "itemsize", 0)
    if not isinstance(itemsize, int) or size is None:
        return 0
    want = tuple(offsets or ())
    for chunk in getattr(found, "chunks", ()):
        if tuple(chunk.offsets) == want:
            return int(min(math.prod(chunk.sizes), math.prod(size)) * itemsize)
    return 0


def _bounding(real: Any, patcher: Patcher) -> Any:
    """``transform_load_stream`` whose stream stops past what the item may expand to."""

    @functools.wraps(real)
    def transform_load_stream(self: Any, read_item: Any, descriptors: Any, raw: Any) -> Any:
        from ..checkpoint.request import Bounded, expansion_limit

        if not descriptors or not patcher.live:  # live: not reverted under a library's wrapper
            return real(self, read_item, descriptors, raw)
        here = raw.tell()
        stored = raw.seek(0, io.SEEK_END) - here
        raw.seek(here)
        index = getattr(read_item, "storage_index", None)
        declared = 0
        metadata = _declared.get(self)
        if metadata is not None and getattr(read_item.type, "name", "") == "TENSOR":
            fqn, offsets = getattr(index, "fqn", None), getattr(index, "offset", None)
            declared = _chunk_bytes(metadata, fqn, offsets)
        stream = real(self, read_item, descriptors, raw)
        return Bounded(stream, expansion_limit(stored, declared), _item_name(index))

    return ours(transform_load_stream, real, patcher)


def apply(module: ModuleType, patcher: Patcher) -> None:
    import pickle

    if module.__name__ == _PLANNER:
        if confirm(module):
            return  # ours in force (applied twice by hand): wrapping again would nest
        real = _planner_real(module)
        if real is None:
            raise LookupError(f"{_PLANNER}.DefaultLoadPlanner.load_bytes: layout not known")
        planner = vars(module)["DefaultLoadPlanner"]
        patcher.setattr(planner, "load_bytes", _naming_items(real, patcher))
        return
    if module.__name__ == _UTILS:
        if not confirm(module):  # already compatshim's subclass: subclassing it again nests
            patcher.setattr(module, "CheckpointException", _catchable(module.CheckpointException))
        return

    current = vars(module).get("pickle")
    if not isinstance(current, SafePickle):  # the stand-in already: applied twice by hand
        if current is not pickle:
            raise LookupError(
                f"{module.__name__}.pickle is {current!r}, not the pickle module: layout not known"
            )
        patcher.setattr(module, "pickle", safe_pickle(pickle))
    # Hardened, every torch.load is read by compatshim's loader alone, and DCP hands it each
    # item as torch's _ReaderView, which seeks from the end the wrong way and reads past its
    # slice (torch 2.1 to 2.15): the zip reader then finds no archive. An exact view of the
    # same bytes loads the same.
    owners: list[tuple[Any, str, Callable[[Any, Patcher], Any]]] = [
        (module, "_create_file_view", _slicing)
    ]
    # torch 2.8+: items written through stream transforms, read whole: bounded
    transforms = vars(module).get("_StorageReaderTransforms")
    reader = vars(module).get("FileSystemReader")
    if isinstance(transforms, type) and isinstance(reader, type):
        owners += [
            (transforms, "transform_load_stream", _bounding),
            (reader, "set_up_storage_reader", _recording),
        ]
    for owner, name, wrap in owners:
        real = wrapping(vars(owner).get(name))
        if real is not None:  # None: this torch has none, or ours is in force
            patcher.setattr(owner, name, wrap(real, patcher))
