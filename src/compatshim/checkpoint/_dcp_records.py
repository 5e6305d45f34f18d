"""A DCP ``.metadata`` read into plain records, whichever torch release wrote it and whichever runs.

``_dcp_folder.read_metadata`` builds the running torch's own classes, which cannot hold
what a newer release wrote (torch 2.15's ``TensorProperties.strides`` under 2.8). The
rewrite for an older release (``_downgrade``) and the dry run (``_resume_plan``) need
the file as it is, so here ``load``'s pickle machine (``_machine``) runs with a closed
table of the names any release's ``.metadata`` holds (:data:`CLASSES`, the ``torch``
dtypes, ``torch.Size``, ``_get_layout``, pathlib paths): each becomes a token, an
object a :class:`Record` whose fields are the pickled state, and nothing is imported
or called. Any other name is an :class:`UnsafeCheckpointError`; every field is
then checked for the type torch writes (:func:`read_folder`), and a field no known
release has is refused by name rather than guessed at.
"""

from __future__ import annotations

import os
import pathlib
import sys
from dataclasses import dataclass, field
from typing import Any

from .._text import short
from ._container import open_regular
from ._dcp_folder import METADATA, _refuse_paths_outside, refuse_overlapping_chunks
from ._limits import HEADER_BYTES, Budget, Walks, check_shape, weight
from ._machine import Machine, Source
from .errors import CheckpointError, UndecodableTextError, UnsafeCheckpointError, as_well

DCP = "torch.distributed.checkpoint.metadata"
SHARD = "torch.distributed._shard.sharded_tensor.metadata"  # TensorProperties' home to 2.2
FS = "torch.distributed.checkpoint.filesystem"
# every class any release's .metadata names -> the short name used here
CLASSES = {
    f"{DCP}.Metadata": "Metadata",
    f"{DCP}.TensorStorageMetadata": "TensorStorageMetadata",
    f"{DCP}.BytesStorageMetadata": "BytesStorageMetadata",
    f"{DCP}.ChunkStorageMetadata": "ChunkStorageMetadata",
    f"{DCP}.MetadataIndex": "MetadataIndex",
    f"{DCP}.StorageMeta": "StorageMeta",
    f"{DCP}.TensorProperties": "TensorProperties",
    f"{SHARD}.TensorProperties": "TensorProperties",
    f"{FS}._StorageInfo": "_StorageInfo",
}
ENCODINGS = {f"{DCP}._MEM_FORMAT_ENCODING", f"{SHARD}.MEM_FORMAT_ENCODING"}
# the fields any known release pickles, per class (the releases' own: ``_downgrade.RELEASES``)
FIELDS = {
    "Metadata": ("state_dict_metadata", "planner_data", "storage_data", "storage_meta", "version"),
    "TensorStorageMetadata": ("properties", "size", "chunks"),
    "BytesStorageMetadata": (),
    "ChunkStorageMetadata": ("offsets", "sizes"),
    "MetadataIndex": ("fqn", "offset", "index"),
    "StorageMeta": ("checkpoint_id", "save_id", "load_id", "modules"),
    "_StorageInfo": ("relative_path", "offset", "length", "transform_descriptors"),
}
PROPERTIES = ("dtype", "layout", "requires_grad", "memory_format", "pin_memory", "strides")
_DTYPE_NAMES = (
    "bcomplex32 bfloat16 bit bits16 bits1x8 bits2x4 bits4x2 bits8 bool cdouble cfloat chalf "
    "complex128 complex32 complex64 double float float16 float32 float4_e2m1fn_x2 float64 "
    "float8_e4m3fn float8_e4m3fnuz float8_e5m2 float8_e5m2fnuz float8_e8m0fnu half int int1 "
    "int16 int2 int3 int32 int4 int5 int6 int64 int7 int8 long qint32 qint8 quint2x4 quint4x2 "
    "quint8 short uint1 uint16 uint2 uint3 uint32 uint4 uint5 uint6 uint64 uint7 uint8"
)
DTYPES = frozenset(_DTYPE_NAMES.split())  # torch 2.15.0's (every earlier release's among them)
LAYOUTS = frozenset(("strided", "sparse_coo", "sparse_csr", "sparse_csc", "sparse_bsr",
                     "sparse_bsc", "_mkldnn"))  # fmt: skip
_POSIX, _WINDOWS = pathlib.PurePosixPath, pathlib.PureWindowsPath
_PATHS = {"PosixPath": _POSIX, "PurePosixPath": _POSIX, "WindowsPath": _WINDOWS,
          "PureWindowsPath": _WINDOWS}  # fmt: skip


class _Token:
    """A name from the table, standing in for the object it names."""

    __slots__ = ("kind", "name")

    def __init__(self, kind: str, name: str) -> None:
        self.kind = kind  # "class", "encoding", "dtype", "size", "layout", "path"
        self.name = name


class Record:
    """An object of one of :data:`CLASSES`: its short class name and pickled state."""

    __slots__ = ("built", "cls", "state")

    def __init__(self, cls: str) -> None:
        self.cls = cls
        self.state: Any = {}
        self.built = False


class Size(tuple):  # type: ignore[type-arg]
    """A ``torch.Size`` from the file: a tuple of ints (checked by :func:`check_shape`)."""


@dataclass(frozen=True)
class Layout:
    name: str  # "torch.strided"


@dataclass(frozen=True)
class Encoding:
    value: int  # the memory-format enum's value, 0-2 in every release


class _Reader(Machine):
    """``load``'s machine with the closed name table of a DCP ``.metadata``."""

    def __init__(self, source: Source, size: int) -> None:
        super().__init__(source)
        self.budget = Budget(size)
        self.named: set[str] = set()  # every global the file names

    def find_global(self, module: str, name: str) -> Any:
        qual = f"{module}.{name}"
        if qual in CLASSES:
            kind = "class"
        elif qual in ENCODINGS:
            kind = "encoding"
        elif module == "torch" and name in DTYPES:
            kind = "dtype"
        elif qual == "torch.Size":
            kind = "size"
        elif qual == "torch.serialization._get_layout":
            kind = "layout"
        elif module in ("pathlib", "pathlib._local") and name in _PATHS:
            kind = "path"
        else:
            raise UnsafeCheckpointError(
                f"{short(qual, 80)} refused: not a name a DCP .metadata holds", (qual,)
            )
        self.named.add(qual)
        return _Token(kind, qual)

    def new_object(self, cls: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if type(cls) is not _Token or cls.kind != "class" or args or kwargs:
            raise CheckpointError(f"NEWOBJ of {short(cls)}: only DCP's classes, without arguments")
        self.budget.charge(HEADER_BYTES, cls.name)  # as load's machine charges a NEWOBJ
        return Record(CLASSES[cls.name])

    def build(self, inst: Any, state: Any) -> None:
        if type(inst) is not Record or inst.built:
            raise CheckpointError(f"BUILD of {short(inst)}: only a DCP record, once")
        inst.built = True
        inst.state = {} if state is None else state

    def call(self, func: Any, args: tuple[Any, ...]) -> Any:
        kind = func.kind if type(func) is _Token else None
        one = args[0] if len(args) == 1 else None
        self.budget.charge(weight(args), "a call")  # a shared tuple: at each use, by length
        if kind == "size" and type(one) is tuple:
            return Size(check_shape(one, "torch.Size"))
        if kind == "layout" and type(one) is str and one[6:] in LAYOUTS and one[:6] == "torch.":
            return Layout(one)
        if kind == "encoding" and type(one) is int and 0 <= one <= 2:
            return Encoding(one)
        if kind == "path" and args and all(type(a) is str for a in args):
            return str(_PATHS[func.name.rpartition(".")[2]](*args))  # type: ignore[union-attr]
        raise CheckpointError(f"call of {short(getattr(func, 'name', func))} with {short(args)}")

    def persistent_load(self, pid: Any) -> Any:
        raise CheckpointError("a DCP .metadata holds no persistent ids")

    def set_items(self, target: Any, pairs: list[Any]) -> None:
        if type(target) is not dict:
            raise CheckpointError(f"SETITEM into {short(target)}: only dicts")
        for index in range(0, len(pairs), 2):
            target[pairs[index]] = pairs[index + 1]

    def append_items(self, target: Any, items: list[Any]) -> None:
        if type(target) is not list:
            raise CheckpointError(f"APPEND to {short(target)}: only lists")
        target.extend(items)

    def add_items(self, target: Any, items: list[Any]) -> None:
        raise CheckpointError("a DCP .metadata holds no sets")


@dataclass
class Tensor:
    """One tensor entry: ``TensorStorageMetadata`` with its ``TensorProperties``."""

    dtype: str  # "float32"
    layout: str  # "torch.strided"
    requires_grad: bool
    encoding: int
    pin_memory: bool
    strides: tuple[int, ...] | None  # torch 2.15+ (the 6th pickled field)
    size: tuple[int, ...]
    chunks: list[tuple[tuple[int, ...], tuple[int, ...]]]  # (offsets, sizes)
    fields: int = 5  # how many TensorProperties fields the file pickled


@dataclass
class Storage:
    """One ``storage_data`` entry: the ``MetadataIndex`` key and its ``_StorageInfo``."""

    index: dict[str, Any]  # fqn, and offset (a Size) and index where the file has them
    info: dict[str, Any]  # relative_path, offset, length, transform_descriptors if any


@dataclass
class Folder:
    """A DCP ``.metadata`` as plain records: what every release's classes hold."""

    path: str
    entries: dict[str, Tensor | None]  # fqn -> tensor, or None for a non-tensor item
    planner_data: Any
    storage: list[Storage]
    storage_meta: dict[str, Any] | None  # None: absent or None in the file
    extra: dict[str, Any] = field(default_factory=dict)  # Metadata fields after the first three
    named: frozenset[str] = frozenset()  # every global the file names
    # fqn -> storage, made by storage_for; not an init field, so dataclasses.replace drops it
    _places: dict[Any, Storage] | None = field(default=None, init=False, repr=False, compare=False)

    def tensors(self) -> dict[str, Tensor]:
        """The tensor entries: ``entries`` less the non-tensor items."""
        return {fqn: t for fqn, t in self.entries.items() if t is not None}

    def storage_for(self, fqn: str) -> Storage | None:
        """The ``storage_data`` entry of the item ``fqn`` (the first, if several), if the file
        has one; indexed at the first call (one pass, not one per item asked for)."""
        if self._places is None:  # built from the end: the first entry of a key stays
            self._places = {storage.index.get("fqn"): storage for storage in self.storage[::-1]}
        return self._places.get(fqn)

    def stored(self, storage: Storage) -> bytes:
        """The bytes ``storage`` names (``read_folder`` checked its data file lies inside
        the folder): a non-tensor item's ``torch.save`` blob, unless it was transformed.
        CheckpointError where they run past the data file's end: a length the file gives
        is checked before anything that long is allocated."""
        info = storage.info
        offset, length, name = info["offset"], info["length"], info["relative_path"]
        path = os.path.join(self.path, name)
        with open_regular(path, f"{self.path}: {short(name)}", buffering=0) as file:
            size = os.fstat(file.fileno()).st_size
            if offset + length > size:
                raise CheckpointError(
                    f"{self.path}: {short(storage.index.get('fqn'))} is {length} bytes at "
                    f"offset {offset} of {short(name)}, which holds {size}"
                )
            file.seek(offset)  # unbuffered: one small read, no 8 KiB buffer made for it
            return file.read(length)


def read_folder(folder: Any) -> Folder:
    """The ``.metadata`` of ``folder`` as a :class:`Folder`, every field checked.

    Raises UnsafeCheckpointError for a name outside the table or a data file outside the
    folder, CheckpointError for anything torch would not have written (naming it).
    """
    path = os.path.join(os.fspath(folder), METADATA)
    what = path
    if not os.path.isfile(path):  # say what the path is, not "[Errno 20] ... .metadata"
        no_metadata(os.fspath(folder))
    with open_regular(path, what) as file:
        size = os.fstat(file.fileno()).st_size
        if file.read(1) != b"\x80":
            raise CheckpointError(f"{what}: a DCP .metadata is a pickle; this file is not one")
        file.seek(0)
        reader = _Reader(Source(file), size)
        try:
            top = reader.run()
        except CheckpointError as exc:
            raise _named(exc, what) from None
        except (RecursionError, MemoryError, ValueError, TypeError, KeyError) as exc:
            raise CheckpointError(f"{what}: {type(exc).__name__}: {short(str(exc), 120)}") from None
    return _checked(top, what, frozenset(reader.named), reader.budget)


def no_metadata(folder: str) -> None:
    """FileNotFoundError (and CheckpointError) saying what ``folder`` is instead: the one
    wording read_folder (plan_resume, downgrade_dcp) and ``optim.load_dcp`` give."""
    if not os.path.lexists(folder):
        why = "no such folder"
    elif not os.path.isdir(folder):
        why = "a file, not a DCP checkpoint folder (`compatshim inspect` reads checkpoint files)"
    elif os.path.lexists(os.path.join(folder, METADATA)):
        return  # a .metadata that is no regular file: open_regular says so
    else:
        why = f"no {METADATA} here: not a DCP checkpoint folder, or a save that did not finish"
    raise as_well(CheckpointError, FileNotFoundError)(f"{folder}: {why}")


def _named(exc: CheckpointError, what: str) -> CheckpointError:
    """``exc`` with ``what`` (the ``.metadata`` path) before its message, unless it starts so:
    the pickle machine's messages name no file, and dcp-downgrade and resume-check print them
    as they are. Its type is kept (an UnsafeCheckpointError's ``refused``, torch's types)."""
    message = str(exc) if str(exc).startswith(what) else f"{what}: {exc}"
    if isinstance(exc, UnsafeCheckpointError):
        return as_well(UnsafeCheckpointError, type(exc))(message, exc.refused)
    if isinstance(exc, UndecodableTextError):
        return UndecodableTextError(exc, message)
    return as_well(CheckpointError, type(exc))(message)


def _state(record: Any, cls: str, what: str) -> dict[str, Any]:
    if type(record) is not Record or record.cls != cls:
        raise CheckpointError(f"{what} is {short(getattr(record, 'cls', record))}, not a {cls}")
    state = record.state
    if type(state) is not dict or not all(type(k) is str for k in state):
        raise CheckpointError(f"{what}: the {cls} state is {short(state)}, not a dict of fields")
    unknown = sorted(set(state) - set(FIELDS[cls]))
    if unknown:
        raise CheckpointError(
            f"{what}: {cls} field(s) {unknown} belong to no torch release compatshim knows "
            f"(known: {list(FIELDS[cls])}); a newer torch wrote this file"
        )
    return state


def _typed(value: Any, kinds: tuple[type, ...], what: str) -> Any:
    if type(value) not in kinds:
        raise CheckpointError(f"{what} is {short(value)}")
    return value


def _tensor(entry: dict[str, Any], what: str, walks: Walks) -> Tensor:
    props = entry.get("properties")
    if type(props) is not Record or props.cls != "TensorProperties":
        raise CheckpointError(f"{what}.properties is {short(props)}, not a TensorProperties")
    state = props.state
    if type(state) is not tuple or len(state) not in (5, 6):
        raise CheckpointError(f"{what}: TensorProperties state is not a tuple of 5 or 6 fields")
    dtype, layout, grad, encoding, pin = state[:5]
    strides = state[5] if len(state) == 6 else None
    if type(dtype) is not _Token or dtype.kind != "dtype":
        raise CheckpointError(f"{what}: dtype is {short(dtype)}")
    if type(layout) is not Layout or type(encoding) is not Encoding:
        raise CheckpointError(f"{what}: layout or memory format is not one torch writes")
    if type(grad) is not bool or type(pin) is not bool:
        raise CheckpointError(f"{what}: requires_grad or pin_memory is not a bool")
    # one record may serve every entry: each use checks its size and strides again
    dims = sum(len(v) if isinstance(v, tuple) else 0 for v in (strides, entry.get("size")))
    walks.visit(dims, f"{what}: checking its size and strides")
    if strides is not None:
        strides = check_shape(strides, what, "strides")
    chunks = []
    listed = _typed(entry.get("chunks"), (list,), f"{what}.chunks")
    walks.chunk_list(len(listed), what)  # one list may serve every tensor
    for chunk in listed:
        fields = _state(chunk, "ChunkStorageMetadata", f"{what}'s chunk")
        offsets = check_shape(fields.get("offsets"), what, "chunk offsets", (Size,))
        sizes = check_shape(fields.get("sizes"), what, "chunk sizes", (Size,))
        chunks.append((offsets, sizes))
    return Tensor(
        dtype=dtype.name[6:],
        layout=layout.name,
        requires_grad=grad,
        encoding=encoding.value,
        pin_memory=pin,
        strides=strides,
        size=check_shape(entry.get("size"), what, "size", (Size,)),
        chunks=chunks,
        fields=len(state),
    )


def _checked(top: Any, what: str, named: frozenset[str], budget: Budget) -> Folder:
    """The records as a :class:`Folder`. The walk is charged per element
    (:class:`~._limits.Walks`): a list or tuple the file shares by memo reads (one route for
    every key, one chunk list for every tensor) is walked, and later written, at every use."""
    state = _state(top, "Metadata", what)
    walks = Walks(budget)
    entries: dict[str, Tensor | None] = {}
    sdm = _typed(state.get("state_dict_metadata"), (dict,), f"{what}: state_dict_metadata")
    for fqn, entry in sdm.items():
        where = f"{what}: {short(fqn)}"
        if type(fqn) is not str:
            raise CheckpointError(f"{where}: a state_dict_metadata key is not a str")
        if type(entry) is Record and entry.cls == "BytesStorageMetadata":
            _state(entry, "BytesStorageMetadata", where)
            entries[fqn] = None
        else:
            entries[fqn] = _tensor(_state(entry, "TensorStorageMetadata", where), where, walks)
    for fqn, tensor in entries.items():  # once every chunk walk is paid for: as dcp.load
        if tensor is not None:  # hardened refuses them, so do the dry run and the rewrite
            refuse_overlapping_chunks(tensor.size, tensor.chunks, f"{what}: {short(fqn)}")
    planner = state.get("planner_data")
    if planner is not None:  # the default planner's: fqn -> its path in the nested state dict
        for key, route in _typed(planner, (dict,), f"{what}: planner_data").items():
            if type(route) in (tuple, list):
                walks.route(len(route), what)
            if (
                type(key) is not str
                or type(route) not in (tuple, list)
                or not all(type(part) in (str, int) for part in route)
            ):
                raise CheckpointError(
                    f"{what}: planner_data holds {short(key)}: {short(route)}, not the default "
                    "planner's mapping of names to paths"
                )
    storage = []
    data = state.get("storage_data")
    for key, info in _typed(data, (dict,), f"{what}: storage_data").items():
        index = dict(_state(key, "MetadataIndex", f"{what}: a storage_data key"))
        _typed(index.get("fqn"), (str,), f"{what}: a MetadataIndex fqn")
        where = f"{what}: {short(index['fqn'])}'s storage"
        if index.get("offset") is not None:
            check_shape(index["offset"], where, "offset", (Size,))
        _typed(index.get("index"), (int, type(None)), f"{where} index")
        fields = dict(_state(info, "_StorageInfo", where))
        _typed(fields.get("relative_path"), (str,), f"{where} relative_path")
        for name in ("offset", "length"):
            if type(fields.get(name)) is not int or fields[name] < 0:
                raise CheckpointError(f"{where}: {name} is {short(fields.get(name))}")
        transforms = fields.get("transform_descriptors")
        if isinstance(transforms, (list, tuple)):  # one list may serve every entry
            walks.visit(len(transforms), f"{where}: checking its transform_descriptors")
        if transforms is not None and (
            type(transforms) not in (list, tuple) or not all(type(t) is str for t in transforms)
        ):
            raise CheckpointError(f"{where}: transform_descriptors is {short(transforms)}")
        storage.append(Storage(index, fields))
    meta = state.get("storage_meta")
    if meta is not None:
        meta = dict(_state(meta, "StorageMeta", f"{what}: storage_meta"))
        for name in ("checkpoint_id", "save_id", "load_id"):
            _typed(meta.get(name), (str, type(None)), f"{what}: StorageMeta.{name}")
        modules = meta.get("modules", [])
        if type(modules) is not list or not all(type(m) is str for m in modules):
            raise CheckpointError(f"{what}: StorageMeta.modules is {short(modules)}")
    extra = {k: v for k, v in state.items() if k in ("storage_meta", "version")}
    _typed(extra.get("version"), (str, type(None)), f"{what}: version")
    folder = Folder(
        path=os.path.dirname(what),
        entries=entries,
        planner_data=planner,
        storage=storage,
        storage_meta=meta,
        extra=extra,
        named=named,
    )
    _refuse_paths_outside(_Paths(storage), what, os.path.dirname(what))
    return folder


class _Paths:
    """``storage_data`` as ``_dcp_folder._refuse_paths_outside`` reads it (``vars()`` of
    objects), so one rule decides which data files lie outside the folder."""

    def __init__(self, storage: list[Storage]) -> None:
        self.storage_data = {id(s): _Info(s.info["relative_path"]) for s in storage}


class _Info:
    def __init__(self, relative_path: str) -> None:
        self.relative_path = relative_path


def running_torch_reads(folder: Folder) -> list[str]:
    """Why the running torch's own ``pickle.load`` of this ``.metadata`` would fail (empty: it
    reads it): a name it lacks, or a ``TensorProperties`` with more fields than it takes."""
    import importlib

    problems = []
    for qual in sorted(folder.named):
        module, _, name = qual.rpartition(".")
        try:  # imported already, most often: importlib's own lookup costs a microsecond
            found = hasattr(sys.modules.get(module) or importlib.import_module(module), name)
        except ImportError:
            found = False
        if not found:
            problems.append(f"{qual} does not exist in torch {_torch_version()}")
    props = sys.modules.get(f"{DCP}") or importlib.import_module(DCP)
    known = getattr(getattr(props, "TensorProperties", None), "__dataclass_fields__", {})
    if "strides" in known:
        return problems
    six = sorted(fqn for fqn, t in folder.entries.items() if t is not None and t.fields == 6)
    if six:
        problems.append(
            f"TensorProperties.strides (torch 2.14+; {len(six)} tensor(s), e.g. {short(six[0])}) "
            f"is not a field of torch {_torch_version()}'s TensorProperties"
        )
    return problems


def _torch_version() -> str:
    import torch

    return str(torch.__version__)
