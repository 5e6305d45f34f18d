"""``load``: one weights-only loader for torch's zip format, its legacy format and plain pickles.

Order of work, so that nothing is allocated or constructed before it is checked:

zip
    directory checked (``_container``); TorchScript refused; ``data.pkl`` run by
    :class:`SafeMachine`; each storage it names is compared with its record's
    size, then read into a storage through the checked directory (one copy), or,
    where the archive's format version is not the one this torch writes, through
    torch's own zip reader (whose version check decides); sliced from one mmap.
    Where torch is not installed, ``data.pkl`` is read through the checked
    directory: a file without tensors (a config) loads, one with them is refused.
legacy
    the header pickles (magic, protocol, system info) are read as plain values;
    the main pickle is first run symbolically to learn every storage's size;
    the sizes written before each storage's bytes must match and fit in the
    bytes left; only then are storages allocated and read, and the main
    pickle run for real.
plain pickle
    run by :class:`SafeMachine` with no storages.
safetensors
    header checked whole, then the data read or mmapped (``_safetensors``).

Errors are turned into :class:`CheckpointError` naming the file by the format
reader's boundary (``_container.read``), behind the one entry ``request.read``; a
refused global is reported with every other global the file would also need that the
allowlist lacks. ``load`` adds its own advice (:data:`ADVICE`) to a refusal.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import logging
import os
import sys
from typing import IO, Any, Callable, Iterable, NamedTuple

from .._text import names, short
from . import _safetensors, _tensors
from ._container import (
    LEGACY_MAGIC,
    LOCATION,
    Record,
    ScanMachine,
    ScanResult,
    StorageDecl,
    ZipDirectory,
    declare_storage,
    past_end,
    plain_text,
    read_legacy,
    read_record,
    read_zip_directory,
    refuse_torchscript,
    seek_record,
    sniff,
)
from ._gate import Allow, judge, not_rebuilt
from ._limits import Budget
from ._machine import Source
from ._safe import SafeMachine, check_result
from .errors import CheckpointError, UnsafeCheckpointError, advised, as_well

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .request import Request

log = logging.getLogger("compatshim.checkpoint")
MAX_NESTED_LOADS = 2
Restore = Callable[[Any, str], Any]
ADVICE = (
    ". allow=[...] admits globals you trust for one call; trusted=True loads a file you "
    "trust completely (torch.load(weights_only=False): it runs any code in the file)"
)
DENIED_ADVICE = (
    ". No allow entry admits a denied global: the file may be malicious. Load it only if you "
    "trust it completely: trusted=True (torch.load(weights_only=False): it runs any code in it)"
)


def restorer(map_location: Any) -> Restore:
    """torch.load's map_location semantics: None, str, torch.device, dict or callable.

    ``(storage, saved location) -> storage`` where it must live; a storage already on its
    target is returned as it is (no copy). What torch cannot place (a CUDA location on a
    machine without CUDA, a device index it lacks) and what a callable gets wrong are
    :class:`CheckpointError` naming the saved and the target location.
    """
    if map_location is None:
        return place
    target = one_target(map_location)
    if target is not None:
        return lambda storage, saved: place(storage, saved, target)
    if isinstance(map_location, dict):
        mapping = {str(k): str(v) for k, v in map_location.items()}
        return lambda storage, saved: place(storage, saved, mapping.get(saved, saved))
    if callable(map_location):

        def call(storage: Any, saved: str) -> Any:
            import torch

            try:
                result = map_location(storage, saved)
            except Exception as exc:  # torch lets it through: its type is kept (as_well)
                raise as_well(CheckpointError, type(exc))(
                    f"map_location raised {type(exc).__name__} for a storage saved on "
                    f"{saved!r}: {plain_text(exc)}"
                ) from None
            if result is None:
                return place(storage, saved)
            if not isinstance(result, torch.UntypedStorage):
                raise CheckpointError(
                    f"map_location returned {type(result).__name__} for a storage saved on "
                    f"{saved!r}, not a storage (torch.UntypedStorage) or None"
                )
            return result

        return call
    raise TypeError(
        "map_location must be None, str, torch.device, dict or callable, "
        f"got {type(map_location).__name__}"
    )


def place(storage: Any, saved: str, target: str | None = None) -> Any:
    """``storage`` (read to the CPU) on ``target`` (default: where it was saved)."""
    location = saved if target is None else target
    if location == "cpu" and storage.device.type == "cpu":
        return storage
    if not LOCATION.fullmatch(location):
        raise CheckpointError(f"storage location {short(location)} is not a device name")
    from torch import serialization

    restore: Any = serialization.default_restore_location
    try:
        return restore(storage, location)
    except Exception as exc:  # torch's words and type: no CUDA, no such device index, OOM
        raise as_well(CheckpointError, type(exc))(
            f"a storage saved on {saved!r} cannot be placed on {location!r}: "
            f"{plain_text(exc)} (map_location='cpu' loads every storage to the CPU)"
        ) from None


def one_target(map_location: Any) -> str | None:
    """The one location a str or ``torch.device`` sends every storage to, else None."""
    if isinstance(map_location, str):
        return map_location
    torch = sys.modules.get("torch")  # no torch.device exists before torch is imported
    if torch is not None and isinstance(map_location, torch.device):
        return str(map_location)
    return None


def _as_dtype(retyped: dict[tuple[str, Any], Any], key: str, typed: Any, dtype: Any) -> Any:
    """``typed``, a loaded storage, named again as ``dtype``: one wrapper per key and dtype
    (memo-shared persistent ids made a new one at each 3-byte use)."""
    if typed.dtype is dtype:
        return typed
    wrapper = retyped.get((key, dtype))
    if wrapper is None:
        wrapper = retyped[key, dtype] = _tensors.typed_storage(typed._untyped_storage, dtype)
    return wrapper


class ZipStorages:
    """Storages of a zip file by key: the id checked, its size against the record, then
    read through the checked directory (``file``), through torch's own ``reader`` where
    one is open, or sliced from one mmap."""

    def __init__(
        self,
        file: IO[bytes],
        reader: Any,
        directory: ZipDirectory,
        restore: Restore | None,
        what: str,
        mapped: Any,
        byteorder: bytes | None,
    ) -> None:
        self.file = file
        self.reader = reader
        self.directory = directory
        self.restore = restore  # None: every storage goes to meta, so none is read
        self.what = what
        self.mapped = mapped
        self.declared: dict[str, StorageDecl] = {}
        self.loaded: dict[str, Any] = {}
        self.retyped: dict[tuple[str, Any], Any] = {}  # one wrapper per key and other dtype
        self.swap = False
        if byteorder is not None:
            if byteorder not in (b"little", b"big"):
                raise CheckpointError(f"{what}: byteorder record holds {short(byteorder)}")
            self.swap = byteorder.decode() != sys.byteorder

    def __call__(self, type_name: str | None, rest: tuple[Any, ...]) -> Any:
        import torch

        decl = declare_storage(self.declared, type_name, rest, legacy=False)
        dtype = getattr(torch, decl.dtype)
        typed = self.loaded.get(decl.key)
        if typed is not None:
            return _as_dtype(self.retyped, decl.key, typed, dtype)
        record = self.directory.storage_record(decl, self.what)
        nbytes = decl.nbytes
        if self.restore is None:  # nothing to read: the record's size was checked above
            storage_type: Any = torch.UntypedStorage
            untyped = storage_type(nbytes, device="meta")
        else:
            untyped = self._read(torch, record, decl.key, nbytes)
            if self.swap and decl.item_size > 1:
                untyped.byteswap(dtype)
            untyped = self.restore(untyped, decl.location)
        typed = _tensors.typed_storage(untyped, dtype)
        self.loaded[decl.key] = typed
        return typed

    def _read(self, torch: Any, record: Record, key: str, nbytes: int) -> Any:
        if self.reader is not None:
            name = f"data/{key}"
            if self.mapped is not None:
                offset = self.reader.get_record_offset(name)
                return self.mapped[offset : offset + nbytes]
            return self.reader.get_storage_from_record(name, nbytes, torch.uint8).untyped_storage()
        if nbytes <= _SMALL_STORAGE:  # read, then copied: cheaper than making the view below
            data = read_record(self.file, record, self.what)  # record.size is nbytes
            if not data:
                return torch.UntypedStorage(0)
            return torch.UntypedStorage.from_buffer(data, dtype=torch.uint8)
        seek_record(self.file, record, self.what)
        storage = torch.UntypedStorage(nbytes)
        with _memory(storage.data_ptr(), nbytes) as view:  # released: no file object keeps it
            done = _safetensors.read_into(self.file, view)
        if done != nbytes:
            raise past_end(record, self.what)
        return storage


# Up to this size a storage's bytes are read, then copied into it (0.64 us for 256 bytes
# on torch 2.1); above it, read into it through a view of its memory (one copy, 0.55 us
# more to make the view): 4 KiB is about where the second copy costs that much.
_SMALL_STORAGE = 4096


@functools.cache
def _memory_from() -> Any:
    """CPython's ``PyMemoryView_FromMemory``, a prototype of its own (``pythonapi``'s shared
    function object is left as it is): a memoryview over memory the caller owns, without
    a ctypes array type per size (ctypes keeps each one made, for the process's life)."""
    import ctypes

    prototype = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int)
    return prototype(("PyMemoryView_FromMemory", ctypes.pythonapi))


_PYBUF_WRITE = 0x200


def _memory(address: int, size: int) -> memoryview:
    """A writable view of ``size`` bytes at ``address`` (a storage this load just made,
    alive while the view is used)."""
    return _memory_from()(address, size, _PYBUF_WRITE)  # type: ignore[no-any-return]


@functools.cache
def _own_version(torch: Any) -> tuple[str, bytes] | None:
    """The version record the running torch's ``torch.save`` writes (name, bytes), found
    once by saving an empty dict in memory: a version this torch writes, it reads. None
    where that fails: torch's own reader then checks every archive."""
    buffer = io.BytesIO()
    try:
        torch.save({}, buffer)
        buffer.seek(0)
        records = read_zip_directory(buffer, "torch.save({})").records
        name = _version_name(records)
        return name, read_record(buffer, records[name], "torch.save({})")
    except Exception:
        return None


def _version_name(records: dict[str, Record]) -> str:
    return ".data/version" if ".data/version" in records else "version"  # as torch's reader


def _written_as_torch_writes(
    torch: Any, file: IO[bytes], directory: ZipDirectory, what: str
) -> bool:
    """Whether the archive's format version (the record torch's reader checks) is the one
    the running torch writes. Then its storages are read through compatshim's checked
    directory, and torch's reader is not opened: a second parse of the directory (8 us
    and about 1 us a record on torch 2.1). Any other version, or none, goes to torch's
    reader, whose own check decides (it refuses a version outside what it reads)."""
    own = _own_version(torch)
    name = _version_name(directory.records)
    record = directory.records.get(name)
    if own is None or record is None or own[0] != name or record.size != len(own[1]):
        return False
    start = file.tell()  # where torch's reader, if opened, takes the archive from
    try:
        return read_record(file, record, what) == own[1]
    finally:
        file.seek(start)


class LegacyStorages:
    """Legacy-format storages, at the offsets ``read_legacy`` checked; views share their root."""

    def __init__(self, file: IO[bytes], declared: dict[str, StorageDecl], offsets: dict[str, int],
                 restore: Restore) -> None:  # fmt: skip
        self.file = file
        self.roots = declared  # from the symbolic pass: every id must say the same again
        self.offsets = offsets
        self.restore = restore
        self.loaded: dict[str, Any] = {}
        self.retyped: dict[tuple[str, Any], Any] = {}  # one wrapper per key and other dtype
        self.views: dict[str, Any] = {}

    def __call__(self, type_name: str | None, rest: tuple[Any, ...]) -> Any:
        decl = declare_storage(self.roots, type_name, rest, legacy=True)
        typed = self.loaded.get(decl.key)
        if typed is None:
            typed = self.loaded[decl.key] = self._read(decl)
        elif not decl.numel:  # empty, and may be named with another type (declare_storage)
            import torch

            typed = _as_dtype(self.retyped, decl.key, typed, getattr(torch, decl.dtype))
        if decl.view is None:
            return typed
        view_key, offset, size = decl.view
        made = self.views.get(view_key)
        if made is None:
            item = decl.item_size
            sliced = typed._untyped_storage[offset * item : (offset + size) * item]
            made = self.views[view_key] = _tensors.typed_storage(sliced, typed.dtype)
        return made

    def _read(self, decl: StorageDecl) -> Any:
        import torch

        offset = self.offsets.get(decl.key)
        if offset is None:
            raise CheckpointError(f"legacy storage {decl.key} is not in the key list")
        resume = self.file.tell()  # the main pickle is being read from the same file
        self.file.seek(offset)
        if decl.nbytes:
            data = _safetensors.read_exactly(self.file, decl.nbytes)
            untyped = torch.frombuffer(data, dtype=torch.uint8).untyped_storage()
        else:
            untyped = torch.empty(0, dtype=torch.uint8).untyped_storage()
        self.file.seek(resume)
        return _tensors.typed_storage(
            self.restore(untyped, decl.location), getattr(torch, decl.dtype)
        )


def _needs_torch(*_: Any) -> Any:
    """The storages of a zip file read without torch: its tensors cannot be built."""
    raise CheckpointError("its tensors need torch, which is not installed")


class Nested(NamedTuple):
    """What a pickle inside the file shares with the outer read (``Request.nested``)."""

    allow: Allow
    budget: Budget
    depth: int


#: why a source that is not a pickle is refused, by ``Request.expect`` (absent: any format)
NOT_PICKLE = {
    "pickle": "not a pickle",
    "dcp-metadata": "a DCP .metadata is a pickle; this file is not one",
}


class Loader:
    """One read (a ``request.Request``): the options, and the budget every pickle of the
    file draws from."""

    budget: Budget

    def __init__(self, request: Request) -> None:
        self.request = request
        self.map_location = request.map_location
        self.restore = restorer(self.map_location)  # a wrong type: TypeError before any read
        nested = request.nested
        # allow=; the process-wide entries are judge()'s to read
        self.allow = Allow(request.allow) if nested is None else nested.allow
        if nested is not None:  # one budget for the whole file; read() makes the outer one
            self.budget = nested.budget
        self.depth = 0 if nested is None else nested.depth
        self.mmap = request.mmap
        self.encoding = request.encoding or "utf-8"
        self.not_pickle = NOT_PICKLE.get(request.expect)

    def read(self, file: IO[bytes], what: str, path: str | None) -> Any:
        here = file.tell()
        self.budget = Budget(file.seek(0, io.SEEK_END) - here)
        file.seek(here)
        return self._read(file, what, path)

    def _read(self, file: IO[bytes], what: str, path: str | None) -> Any:
        kind = sniff(file)
        if self.not_pickle is not None and kind != "pickle":
            raise CheckpointError(f"{what}: {self.not_pickle}")
        if kind == "zip":
            return self._zip(file, what, path)
        if kind == "safetensors":
            return _safetensors.load(file, path, self.restore, self.mmap)
        if self.mmap:  # torch's type for it too, as for a file object below
            raise as_well(CheckpointError, RuntimeError)(
                f"{what}: mmap=True needs torch's zip format (torch.save's default since 1.6) "
                "or safetensors; "
                f"this file is {'a legacy torch file or ' if kind == 'pickle' else ''}"
                f"not a zip file. Load it without mmap, or re-save it."
            )
        if kind == "tar":
            raise CheckpointError(f"{what}: torch's tar format (torch < 0.4) is not supported")
        if kind == "other":
            if not file.read(1):  # nothing from here on: as torch says it (pickle's EOFError),
                raise as_well(CheckpointError, EOFError)(  # which skips an empty save
                    f"{what}: the file is empty (a save that never wrote?)"
                )
            raise CheckpointError(f"{what}: neither a torch zip file nor a pickle")
        first = self._run(Source(file), None)
        if type(first) is not int or first != LEGACY_MAGIC:
            return first
        legacy = read_legacy(file, self.encoding)
        storages = LegacyStorages(file, legacy.found.storages, legacy.offsets, self.restore)
        return self._run(Source(file), storages)

    def _zip(self, file: IO[bytes], what: str, path: str | None) -> Any:
        try:
            directory = read_zip_directory(file, what)
        except CheckpointError as exc:
            raise _as_torchs_reader(exc) from None
        if directory.is_torchscript:
            raise refuse_torchscript(what)
        try:
            import torch
        except ImportError:  # a torch.save file read where torch is not installed (a config)
            if self.mmap:
                raise CheckpointError(
                    f"{what}: mmap=True needs torch, which is not installed"
                ) from None
            return self._run(
                Source(io.BytesIO(_pickle_record(file, directory, what))), _needs_torch
            )
        mapped = None
        if self.mmap:
            if path is None:
                raise as_well(CheckpointError, ValueError)(  # a wrong argument, as torch says
                    f"{what}: mmap=True needs a file path, not a file object"
                )
            size = os.path.getsize(path)
            mapped = torch.UntypedStorage.from_file(path, _shared_mmap(torch), size)
        # torch's own reader (a second parse of the archive) is opened only where the archive
        # holds storage records (a pickle naming another is refused by storage_record before
        # any read) and either they are mapped or the archive's format version is not the
        # one this torch writes: its check then decides, also when every storage goes to
        # meta (as inspect reads), so load and inspect judge the archive alike
        reader = None
        if directory.has_storages and (
            self.mmap or not _written_as_torch_writes(torch, file, directory, what)
        ):
            reader = torch._C.PyTorchFileReader(path if path is not None else file)
        # every storage to meta: none is read (torch 2.15 reads none either)
        restore = None if one_target(self.map_location) == "meta" else self.restore
        record = directory.records.get("byteorder")
        byteorder = None if record is None else read_record(file, record, what)
        storages = ZipStorages(file, reader, directory, restore, what, mapped, byteorder)
        return self._run(Source(io.BytesIO(_pickle_record(file, directory, what))), storages)

    def _run(self, source: Source, storages: Any) -> Any:
        tensors = _tensors.Tensors(self.budget.tensors)
        machine = SafeMachine(
            source,
            allow=self.allow,
            tensors=tensors,
            storages=storages,
            budget=self.budget,
            load_nested=self._nested,
            encoding=self.encoding,
            object_arrays=self.request.object_arrays,
        )
        start = source.file.tell()
        try:
            value = machine.run()
        except UnsafeCheckpointError as exc:
            raise self._every_refusal(source, start, exc) from None
        forbidden, created = machine.forbidden_values(), machine.created()
        machine.release()
        check_result(value, "the loaded object", forbidden, created, tensors.bare())
        return value

    def _nested(self, data: bytes) -> Any:
        if self.depth >= MAX_NESTED_LOADS:
            raise CheckpointError("storages pickled inside pickled storages, too deep")
        # one allow and one budget for the whole file, nested pickles included
        nested = Nested(self.allow, self.budget, self.depth + 1)
        request = dataclasses.replace(self.request, mmap=False, expect="checkpoint", nested=nested)
        return Loader(request)._read(io.BytesIO(data), "<pickled storage>", None)

    def _every_refusal(
        self, source: Source, start: int, first: UnsafeCheckpointError
    ) -> UnsafeCheckpointError:
        """The first refusal plus every other global the file names that would be refused."""
        source.file.seek(start)
        try:
            scanner = ScanMachine(source, encoding=self.encoding)
            scanner.run()
        except Exception:
            return first
        others = [n for n in refusals(scanner.found, self.allow) if n not in first.refused]
        if not others:
            return first
        return UnsafeCheckpointError(
            f"{first}; the file also names {names(others)}, refused as well",
            (*first.refused, *others),
        )


def _pickle_record(file: IO[bytes], directory: ZipDirectory, what: str) -> bytes:
    try:
        return read_record(file, directory.record("data.pkl", what), what)
    except CheckpointError as exc:
        raise _as_torchs_reader(exc) from None


def _as_torchs_reader(error: CheckpointError) -> CheckpointError:
    """A damaged archive (cut short by an interrupted save, no ``data.pkl``) is a RuntimeError
    too, as torch's zip reader reports it, so ``except RuntimeError`` around the load of a
    half-written checkpoint still catches it; a refusal stays as it is."""
    if type(error) is not CheckpointError:
        return error
    return as_well(CheckpointError, RuntimeError)(*error.args)


def _shared_mmap(torch: Any) -> bool:
    """Whether torch maps files ``MAP_SHARED`` (``torch.serialization.set_default_mmap_options``),
    so writes to the loaded tensors reach the file, as with torch's own ``load``."""
    import mmap

    get = getattr(torch.serialization, "get_default_mmap_options", None)  # torch 2.2+
    shared = getattr(mmap, "MAP_SHARED", None)  # not on Windows, where torch maps private
    return get is not None and shared is not None and get() == shared


def refusals(found: ScanResult, allow: Allow) -> list[str]:
    """The globals a scanned pickle names that :func:`judge` refuses, as ``load`` would."""
    return [
        name
        for name in found.globals
        if not judge(*name.rpartition(".")[::2], allow, name in found.reached).admitted
    ]


def load(f: Any, map_location: Any = None, *, allow: Iterable[Any] = (), mmap: bool = False) -> Any:
    """``checkpoint.load``: :func:`request.read`, a refusal with ``load``'s own advice."""
    from .request import Request, read

    try:
        return read(f, Request(map_location, allow, mmap))
    except UnsafeCheckpointError as exc:
        raise advised(exc, _advice(exc.refused)) from None


def _advice(refused: tuple[str, ...]) -> str:
    """What to do: never "allow it" for a denied global (the refusal said it cannot be)."""
    from .deny import refused_globals

    if refused_globals(refused)[1]:
        return DENIED_ADVICE
    return not_rebuilt(refused) or ADVICE
