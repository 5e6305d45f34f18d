"""``load``: one weights-only loader for torch's zip format, its legacy format and plain pickles.

Order of work, so that nothing is allocated or constructed before it is checked:

zip
    directory checked (``_container``); TorchScript refused; ``data.pkl`` run by
    :class:`SafeMachine`; each storage it names is compared with its record's
    size, then read through torch's own zip reader (or sliced from one mmap).
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

Every error that is not the library's own becomes :class:`CheckpointError`
naming the file; a refused global is reported with every other global the
file would also need that the allowlist lacks.
"""

from __future__ import annotations

import io
import logging
import os
import re
from typing import IO, Any, Callable, Iterable

from .._text import short
from . import _safetensors, _tensors
from ._container import (
    LEGACY_MAGIC,
    LEGACY_PROTOCOL,
    ZipDirectory,
    read_zip_directory,
    refuse_torchscript,
    sniff,
)
from ._machine import Source
from ._safe import Budget, SafeMachine, UserAllow, check_result
from ._scan import ScanMachine, StorageDecl
from .allowlist import lookup
from .errors import CheckpointError, UnsafeCheckpointError
from .process_allow import ProcessAllow, admits

log = logging.getLogger("compatshim.checkpoint")
_LOCATION = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,31}(:\d{1,5})?")
_KEY = re.compile(r"[A-Za-z0-9_]{1,64}")
MAX_NESTED_LOADS = 2
Restore = Callable[[Any, str], Any]


def describe_source(f: Any) -> str:
    if isinstance(f, (str, os.PathLike)):
        return os.fspath(f)  # type: ignore[return-value]
    return str(getattr(f, "name", None) or f"<{type(f).__name__}>")


def restorer(map_location: Any) -> Restore:
    """torch.load's map_location semantics: None, str, torch.device, dict or callable."""
    import torch
    from torch import serialization

    default_restore_location: Any = serialization.default_restore_location

    def to(storage: Any, location: str) -> Any:
        if not _LOCATION.fullmatch(location):
            raise CheckpointError(f"storage location {location[:40]!r} is not a device name")
        if location == "cpu" and storage.device.type == "cpu":
            return storage
        return default_restore_location(storage, location)

    if map_location is None:
        return to
    if isinstance(map_location, (str, torch.device)):
        target = str(map_location)
        return lambda storage, _: to(storage, target)
    if isinstance(map_location, dict):
        mapping = {str(k): str(v) for k, v in map_location.items()}
        return lambda storage, location: to(storage, mapping.get(location, location))
    if callable(map_location):

        def call(storage: Any, location: str) -> Any:
            result = map_location(storage, location)
            return to(storage, location) if result is None else result

        return call
    raise TypeError(
        "map_location must be None, str, torch.device, dict or callable, "
        f"got {type(map_location).__name__}"
    )


class ZipStorages:
    """Storages of a zip file by key: size checked against the record, then read or mmapped."""

    def __init__(
        self, reader: Any, directory: ZipDirectory, restore: Restore, what: str, mapped: Any
    ) -> None:
        self.reader = reader
        self.directory = directory
        self.restore = restore
        self.what = what
        self.mapped = mapped
        self.loaded: dict[str, Any] = {}
        order = directory.records.get("byteorder")
        self.swap = False
        if order is not None:
            data = bytes(reader.get_record("byteorder"))
            if data not in (b"little", b"big"):
                raise CheckpointError(f"{what}: byteorder record holds {data[:20]!r}")
            import sys

            self.swap = data.decode() != sys.byteorder

    def __call__(self, type_name: str, rest: tuple[Any, ...]) -> Any:
        import torch

        if len(rest) != 3:
            raise CheckpointError(
                f"{self.what}: a zip storage id has {len(rest) + 2} fields, not 5"
            )
        key, location, numel = rest
        location = location.decode("ascii", "replace") if type(location) is bytes else location
        if type(key) is not str or not _KEY.fullmatch(key):
            raise CheckpointError(f"{self.what}: storage key {short(key)} is malformed")
        if type(location) is not str or type(numel) is not int or numel < 0:
            raise CheckpointError(f"{self.what}: storage {key} has a malformed location or size")
        if key in self.loaded:
            return self.loaded[key]
        dtype_name, item_size = _tensors.STORAGE_DTYPES[type_name]
        dtype = getattr(torch, dtype_name)
        nbytes = numel * item_size
        name = f"data/{key}"
        record = self.directory.record(name, self.what)
        if record.size != nbytes:
            raise CheckpointError(
                f"{self.what}: storage {key} declares {nbytes} bytes ({numel} x {dtype_name}), "
                f"its record holds {record.size}"
            )
        if self.mapped is not None:
            offset = self.reader.get_record_offset(name)
            untyped = self.mapped[offset : offset + nbytes]
        else:
            untyped = self.reader.get_storage_from_record(name, nbytes, torch.uint8)
            untyped = untyped.untyped_storage()
        if self.swap and item_size > 1:
            untyped.byteswap(dtype)
        untyped = self.restore(untyped, location)
        typed = _tensors.typed_storage(untyped, dtype)
        self.loaded[key] = typed
        return typed


class Loader:
    """One ``load`` call: the file, its name for messages, and the options."""

    def __init__(self, map_location: Any, allow: Iterable[Any], mmap: bool, depth: int = 0):
        self.map_location = map_location
        self.allow: UserAllow = ProcessAllow(allow)  # allow=, then process-wide entries
        self.mmap = mmap
        self.depth = depth
        self.budget = Budget(0)

    # ------------------------------------------------------------------ entry
    def load(self, f: Any) -> Any:
        what = describe_source(f)
        if isinstance(f, (str, os.PathLike)):
            with open(f, "rb") as file:
                return self._guarded(file, what, os.fspath(f))
        if not all(hasattr(f, a) for a in ("read", "seek", "tell")):
            raise TypeError("load() takes a path or a seekable binary file object")
        return self._guarded(f, what, None)

    def _guarded(self, file: IO[bytes], what: str, path: str | None) -> Any:
        try:
            here = file.tell()
            self.budget = Budget(file.seek(0, io.SEEK_END) - here)
            file.seek(here)
            return self._load(file, what, path)
        except UnsafeCheckpointError as exc:
            raise _name_file(exc, what) from None
        except CheckpointError as exc:
            raise CheckpointError(_prefixed(str(exc), what)) from None
        except RecursionError:
            raise CheckpointError(f"{what}: nested too deeply to load") from None
        except MemoryError:
            raise CheckpointError(f"{what}: not enough memory for what the file holds") from None
        except Exception as exc:
            raise CheckpointError(
                f"{what}: damaged or unsupported file ({type(exc).__name__}: {plain_text(exc)})"
            ) from None

    def _load(self, file: IO[bytes], what: str, path: str | None) -> Any:
        kind = sniff(file)
        if kind == "zip":
            return self._zip(file, what, path)
        if kind == "safetensors":
            return _safetensors.load(file, path, restorer(self.map_location), self.mmap)
        if self.mmap:
            raise CheckpointError(
                f"{what}: mmap=True needs torch's zip format (torch.save's default since 1.6) "
                "or safetensors; "
                f"this file is {'a legacy torch file or ' if kind == 'pickle' else ''}"
                f"not a zip file. Load it without mmap, or re-save it."
            )
        if kind == "tar":
            raise CheckpointError(f"{what}: torch's tar format (torch < 0.4) is not supported")
        if kind == "other":
            raise CheckpointError(f"{what}: neither a torch zip file nor a pickle")
        return self._pickle_or_legacy(file, what)

    # ------------------------------------------------------------------ zip
    def _zip(self, file: IO[bytes], what: str, path: str | None) -> Any:
        import torch

        directory = read_zip_directory(file, what)
        if directory.is_torchscript:
            raise refuse_torchscript(what)
        mapped = None
        if self.mmap:
            if path is None:
                raise CheckpointError(f"{what}: mmap=True needs a file path, not a file object")
            size = os.path.getsize(path)
            mapped = torch.UntypedStorage.from_file(path, False, size)
        reader = torch._C.PyTorchFileReader(path if path is not None else file)
        storages = ZipStorages(reader, directory, restorer(self.map_location), what, mapped)
        data = bytes(reader.get_record("data.pkl"))
        return self._run(Source(io.BytesIO(data)), storages)

    # ------------------------------------------------------------------ pickle / legacy
    def _pickle_or_legacy(self, file: IO[bytes], what: str) -> Any:
        first = self._run(Source(file), None)
        if type(first) is not int or first != LEGACY_MAGIC:
            return first
        protocol = self._run(Source(file), None)
        if protocol != LEGACY_PROTOCOL:
            raise CheckpointError(f"legacy torch file with protocol version {short(protocol)}")
        info = self._run(Source(file), None)
        if type(info) is not dict or info.get("little_endian") is not True:
            raise CheckpointError(
                "legacy torch file written on a big-endian machine or without system info"
            )
        return self._legacy(file)

    def _legacy(self, file: IO[bytes]) -> Any:
        main = file.tell()
        scanner = ScanMachine(Source(file))
        scanner.run()
        declared = scanner.found.storages
        keys = self._run(Source(file), None)
        if type(keys) is not list or not all(type(k) is str for k in keys):
            raise CheckpointError("legacy storage key list is malformed")
        roots = dict(declared)
        if sorted(keys) != sorted(roots) or len(set(keys)) != len(keys):
            raise CheckpointError(
                "legacy storage key list does not match the storages the pickle names"
            )
        # Check every size header against the declared size and the bytes left, before allocating.
        source = Source(file)
        offsets: dict[str, int] = {}
        position = file.tell()
        for key in keys:
            decl = roots[key]
            if decl.type_name not in _tensors.STORAGE_DTYPES:
                raise UnsafeCheckpointError(
                    f"storage type {decl.type_name} refused", (decl.type_name,)
                )
            file.seek(position)
            header = int.from_bytes(source.read(8), "little", signed=True)
            if header != decl.numel:
                raise CheckpointError(
                    f"legacy storage {key}: the data section says {header} elements, "
                    f"the pickle declared {decl.numel}"
                )
            if decl.nbytes > source.remaining():
                raise CheckpointError(
                    f"legacy storage {key}: declares {decl.nbytes} bytes, only "
                    f"{source.remaining()} bytes are left in the file"
                )
            offsets[key] = position + 8
            position += 8 + decl.nbytes
        storages = LegacyStorages(file, roots, offsets, restorer(self.map_location))
        file.seek(main)
        return self._run(Source(file), storages)

    # ------------------------------------------------------------------ running a pickle
    def _run(self, source: Source, storages: Any) -> Any:
        tensors = _tensors.Tensors()
        machine = SafeMachine(
            source,
            allow=self.allow,
            tensors=tensors,
            storages=storages,
            budget=self.budget,
            load_nested=self._nested,
        )
        start = source.file.tell()
        try:
            value = machine.run()
        except UnsafeCheckpointError as exc:
            raise self._every_refusal(source, start, exc) from None
        check_result(value, "the loaded object", machine.forbidden_values(), machine.created())
        return value

    def _nested(self, data: bytes) -> Any:
        if self.depth >= MAX_NESTED_LOADS:
            raise CheckpointError("storages pickled inside pickled storages, too deep")
        inner = Loader(self.map_location, (), False, self.depth + 1)
        inner.allow = self.allow
        inner.budget = self.budget  # one budget for the whole file, nested pickles included
        return inner._load(io.BytesIO(data), "<pickled storage>", None)

    def _every_refusal(
        self, source: Source, start: int, first: UnsafeCheckpointError
    ) -> UnsafeCheckpointError:
        """The first refusal plus every other global the file names that would be refused."""
        source.file.seek(start)
        try:
            scanner = ScanMachine(source)
            scanner.run()
        except Exception:
            return first
        others = [n for n in refusals(scanner.found.globals, self.allow) if n not in first.refused]
        if not others:
            return first
        return UnsafeCheckpointError(
            f"{first}; the file also names {', '.join(others)}, not allow-listed either",
            (*first.refused, *others),
        )


def refusals(globals_named: Iterable[str], allow: UserAllow) -> list[str]:
    """The globals among ``globals_named`` that neither the allowlist nor ``allow=`` admits."""
    out = []
    for qualname in globals_named:
        module, _, name = qualname.rpartition(".")
        if (module, name) in allow.named:
            continue
        entry = lookup(module, name)
        if entry is None and "." in module:
            owner_module, _, owner = module.rpartition(".")
            owner_entry = lookup(owner_module, owner)
            if owner_entry is not None and owner_entry.kind == "enum":
                continue
        if (entry is None or not entry.applies()) and not admits(module, name):
            out.append(qualname)
    return out


class LegacyStorages:
    """Legacy-format storages: sizes were checked by ``Loader._legacy``; views checked here."""

    def __init__(
        self,
        file: IO[bytes],
        roots: dict[str, StorageDecl],
        offsets: dict[str, int],
        restore: Restore,
    ) -> None:
        self.file = file
        self.roots = roots
        self.offsets = offsets
        self.restore = restore
        self.loaded: dict[str, Any] = {}
        self.views: dict[str, Any] = {}

    def __call__(self, type_name: str, rest: tuple[Any, ...]) -> Any:

        if len(rest) != 4:
            raise CheckpointError(f"a legacy storage id has {len(rest) + 2} fields, not 6")
        key, location, numel, view = rest
        decl = self.roots.get(key) if type(key) is str else None
        if decl is None or decl.type_name != type_name or decl.numel != numel:
            raise CheckpointError(f"legacy storage {short(key)} changed between passes")
        typed = self.loaded.get(key)
        if typed is None:
            typed = self._read(decl, location)
            self.loaded[key] = typed
        if view is None:
            return typed
        if type(view) is not tuple or len(view) != 3:
            raise CheckpointError("legacy storage view is malformed")
        view_key, offset, size = view
        if view_key in self.views:
            return self.views[view_key]
        if type(offset) is not int or type(size) is not int or offset < 0 or size < 0:
            raise CheckpointError("legacy storage view has a malformed offset or size")
        if offset + size > decl.numel:
            raise CheckpointError(f"legacy storage view reaches past storage {key}")
        item = _tensors.STORAGE_DTYPES[type_name][1]
        sliced = typed._untyped_storage[offset * item : (offset + size) * item]
        made = _tensors.typed_storage(sliced, typed.dtype)
        self.views[view_key] = made
        return made

    def _read(self, decl: StorageDecl, location: Any) -> Any:
        import torch

        if type(location) is bytes:
            location = location.decode("ascii", "replace")
        if type(location) is not str:
            raise CheckpointError("legacy storage location is not a string")
        dtype = getattr(torch, decl.dtype)
        buffer = torch.empty(decl.nbytes, dtype=torch.uint8)
        resume = self.file.tell()  # the main pickle is being read from the same file
        self.file.seek(self.offsets[decl.key])
        if decl.nbytes:
            view = buffer.numpy().data if _numpy_ok() else None
            if view is not None:
                got = self.file.readinto(view)  # type: ignore[attr-defined]
            else:
                chunk = self.file.read(decl.nbytes)
                got = len(chunk)
                buffer = torch.frombuffer(bytearray(chunk), dtype=torch.uint8)
            if got != decl.nbytes:
                raise CheckpointError(f"legacy storage {decl.key} ends early")
        self.file.seek(resume)
        untyped = self.restore(buffer.untyped_storage(), location)
        return _tensors.typed_storage(untyped, dtype)


def _numpy_ok() -> bool:
    try:
        import numpy  # noqa: F401
    except ImportError:
        return False
    return True


def plain_text(exc: BaseException) -> str:
    """An exception's message only when every argument is a short string: ``str(KeyError(x))``
    is ``repr(x)``, and ``x`` may be a file value whose text is exponential in its size."""
    if all(type(arg) is str for arg in exc.args):
        return str(exc)[:300]
    return "message not shown: it holds values from the file"


def _prefixed(message: str, what: str) -> str:
    return message if message.startswith(what) else f"{what}: {message}"


ADVICE = (
    ". allow=[...] admits globals you trust for one call; trusted=True loads a file you "
    "trust completely (torch.load(weights_only=False): it runs any code in the file)"
)


def _name_file(exc: UnsafeCheckpointError, what: str) -> UnsafeCheckpointError:
    return UnsafeCheckpointError(_prefixed(str(exc), what) + ADVICE, exc.refused)


def load(f: Any, map_location: Any = None, *, allow: Iterable[Any] = (), mmap: bool = False) -> Any:
    return Loader(map_location, allow, mmap).load(f)
