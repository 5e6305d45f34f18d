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
    (``compatshim.checkpoint._dcp_folder``); everything else is the real module. A
    refusal raises :class:`~compatshim.checkpoint.UnsafeCheckpointError` (a
    ``pickle.UnpicklingError``) naming the refused globals; nothing runs.
    ``torch.distributed.checkpoint`` is never imported by compatshim: the patch
    applies when the user's code imports its ``filesystem`` (or ``_fsspec_filesystem``)
    module.

    Hardened mode reads every ``torch.load`` with compatshim's loader alone, so
    the module's ``_create_file_view`` also hands ``torch.load`` an exact view of
    each item: torch's file view seeks from the end the wrong way and reads past
    its slice (torch 2.1 to 2.15).

Confirmed
    Right after the fix by :func:`confirm` (the stand-in is in place); end to
    end by the probe when ``status()`` or the doctor asks.

The revert
    The module's ``pickle`` attribute gets the real module back (Patcher).
"""

from __future__ import annotations

import io

from ._safe_pickle import SafePickle

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import ModuleType
    from typing import Any

    from .._engine.patching import Patcher

_NAME = "torch-dcp-safe-metadata"


def _read(file: Any, **_: Any) -> Any:
    """``pickle.load(file)`` of a ``.metadata``, by compatshim's loader (options ignored)."""
    from ..checkpoint._dcp_folder import read_metadata

    return read_metadata(file)


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
    """Hardened mode only: True while a reader of this module unpickles any global."""
    from .. import _settings

    if not _settings.safe_load():
        return False
    return any(_runs_any_global(reader) for reader in _readers(module))


def confirm(module: ModuleType) -> bool:
    """The stand-in is the module's ``pickle`` (the probe would load compatshim's loader)."""
    return isinstance(vars(module).get("pickle"), SafePickle)


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


def _file_slice(file: Any, offset: int, length: int) -> Any:
    """DCP's ``_create_file_view``, made exact (see :class:`_Slice`; buffered for small reads)."""
    return io.BufferedReader(_Slice(file, offset, length))


def apply(module: ModuleType, patcher: Patcher) -> None:
    import pickle

    current = vars(module).get("pickle")
    if current is not pickle:
        raise LookupError(
            f"{module.__name__}.pickle is {current!r}, not the pickle module: layout not known"
        )
    patcher.setattr(module, "pickle", safe_pickle(pickle))
    # Hardened, every torch.load is read by compatshim's loader alone, and DCP hands it each
    # item as torch's _ReaderView, which seeks from the end the wrong way and reads past its
    # slice (torch 2.1 to 2.15): the zip reader then finds no archive. An exact view of the
    # same bytes loads the same.
    if vars(module).get("_create_file_view") is not None:
        patcher.setattr(module, "_create_file_view", _file_slice)
