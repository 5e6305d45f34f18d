"""A DCP folder rewritten for an older torch release: ``downgrade_dcp(src, dst, torch="2.8")``.

torch reads a folder's ``.metadata`` with ``pickle.load`` into its own dataclasses, and
a newer release pickles what an older one cannot take: torch 2.15's
``TensorProperties`` pickles 6 fields (``strides``) where 2.3-2.13 unpack 5 ("too many
values to unpack"); 2.3 moved ``TensorProperties`` and its memory-format enum out of
``torch.distributed._shard`` (2.2: ``AttributeError``). The data files hold
``torch.save`` bytes at offsets the ``.metadata`` names, which every release reads
alike, so only the ``.metadata`` is rewritten; the other files of the folder are
hard-linked (or copied) into the new folder, never changed. For torch 2.1/2.2, which
read a dict without tensors as one item where 2.3+ save it entry by entry, those
entries are read (hardened) and saved whole into one more file (:func:`_merge_whole`).

What each release's DCP reads (:data:`RELEASES`), found in its own source
(``torch/distributed/checkpoint/metadata.py`` and ``filesystem.py``) or, for 2.4, in
a ``.metadata`` torch 2.4.1 wrote:

=======  ====================================================================
release  differs from the row above
=======  ====================================================================
2.1      TensorProperties, MEM_FORMAT_ENCODING in torch.distributed._shard.
         sharded_tensor.metadata (5 fields); Metadata: state_dict_metadata,
         planner_data, storage_data; _StorageInfo: relative_path, offset, length
2.2      dtypes float8_e4m3fnuz, float8_e5m2fnuz
2.4      TensorProperties, _MEM_FORMAT_ENCODING in torch.distributed.checkpoint.
         metadata; Metadata.storage_meta; StorageMeta: checkpoint_id, save_id,
         load_id (dtypes: 2.2's, the ones known to be there)
2.8      StorageMeta.modules; _StorageInfo.transform_descriptors (compressed or
         otherwise transformed data); dtypes uint16-64, uint1-7, int1-7, bit,
         float8_e8m0fnu, float4_e2m1fn_x2
2.11     Metadata.version
2.13     as 2.11
2.15     TensorProperties.strides (6 pickled fields); dtype bcomplex32
=======  ====================================================================

A release between two rows gets the older row's format: DCP reads what earlier
releases wrote (every fixture of ``tests/dcpresume`` shows it). A field the target
lacks is left out where it only describes (``strides``, which no torch reader uses;
``version``; ``StorageMeta``, ``modules``); content the target cannot represent (a dtype
it lacks, transformed data files) is a :class:`DowngradeError` naming it.
"""

from __future__ import annotations

import dataclasses
import io
import os
import pickle
import shutil
import struct
from dataclasses import dataclass
from typing import Any, Callable

from .._text import names, short
from ._dcp_folder import METADATA
from ._dcp_records import DCP, FS, SHARD, Folder, Size, Storage, Tensor, read_folder
from .errors import CheckpointError

_D21_NAMES = (
    "bfloat16 bits16 bits1x8 bits2x4 bits4x2 bits8 bool cdouble cfloat chalf complex128 "
    "complex32 complex64 double float float16 float32 float64 float8_e4m3fn float8_e5m2 half "
    "int int16 int32 int64 int8 long qint32 qint8 quint2x4 quint4x2 quint8 short uint8"
)
_D21 = frozenset(_D21_NAMES.split())
_D22 = _D21 | {"float8_e4m3fnuz", "float8_e5m2fnuz"}
_D28 = _D22 | {"bit", "float4_e2m1fn_x2", "float8_e8m0fnu", "uint16", "uint32", "uint64"}
_D28 |= {f"{kind}{bits}" for kind in ("int", "uint") for bits in range(1, 8)}
_D215 = _D28 | {"bcomplex32"}
_OLD_META = ("state_dict_metadata", "planner_data", "storage_data")
_INFO = ("relative_path", "offset", "length")


@dataclass(frozen=True)
class Release:
    """What one torch release's DCP reads back (see the module's table)."""

    version: tuple[int, int]
    seen: str  # where the row was read
    home: str  # module of TensorProperties and of its memory-format enum
    encoding: str  # the enum's name there
    strides: bool  # TensorProperties takes a 6th pickled field
    metadata: tuple[str, ...]  # Metadata's fields
    storage_meta: tuple[str, ...] | None  # StorageMeta's fields; None: no such class
    storage_info: tuple[str, ...]  # _StorageInfo's fields
    dtypes: frozenset[str]


_R24 = ("state_dict_metadata", "planner_data", "storage_data", "storage_meta")
_SM = ("checkpoint_id", "save_id", "load_id")
_E = "_MEM_FORMAT_ENCODING"
RELEASES = (
    Release((2, 1), "torch 2.1.2's source", SHARD, "MEM_FORMAT_ENCODING", False, _OLD_META,
            None, _INFO, _D21),
    Release((2, 2), "torch 2.2.2's source", SHARD, "MEM_FORMAT_ENCODING", False, _OLD_META,
            None, _INFO, _D22),
    Release((2, 4), "a .metadata torch 2.4.1 wrote", DCP, _E, False, _R24, _SM, _INFO, _D22),
    Release((2, 8), "torch 2.8.0's source", DCP, _E, False, _R24, (*_SM, "modules"),
            (*_INFO, "transform_descriptors"), _D28),
    Release((2, 11), "torch 2.11.0's source", DCP, _E, False, (*_R24, "version"),
            (*_SM, "modules"), (*_INFO, "transform_descriptors"), _D28),
    Release((2, 13), "torch 2.13.0's source", DCP, _E, False, (*_R24, "version"),
            (*_SM, "modules"), (*_INFO, "transform_descriptors"), _D28),
    Release((2, 15), "torch 2.15.0's source", DCP, _E, True, (*_R24, "version"),
            (*_SM, "modules"), (*_INFO, "transform_descriptors"), _D215),
)  # fmt: skip


class DowngradeError(CheckpointError):
    """The older release cannot represent what the folder holds; the message names it."""


@dataclass(frozen=True)
class DowngradeReport:
    """What :func:`downgrade_dcp` wrote: the row used and every change, named."""

    src: str
    dst: str
    target: str  # as asked ("2.4")
    written_as: str  # the row whose format was written ("2.4")
    changes: tuple[str, ...]
    files: tuple[str, ...]  # the other files, hard-linked or copied
    linked: bool


def _name(row: Release) -> str:
    return ".".join(map(str, row.version))


def release_row(target: str) -> Release:
    """The newest row of :data:`RELEASES` at or before ``target`` ("2.4", "2.4.1", "2.8.0+cpu")."""
    try:
        major, minor = (int(part) for part in target.split("+")[0].split(".")[:2])
    except (ValueError, AttributeError):
        raise ValueError(f"torch: expected a release such as '2.8', got {short(target)}") from None
    rows = [r for r in RELEASES if r.version <= (major, minor)]
    if not rows:
        raise DowngradeError(
            f"torch {target}: DCP folders before torch 2.1 are not known to compatshim "
            f"(rows: {', '.join(_name(r) for r in RELEASES)})"
        )
    return rows[-1]


def downgrade_dcp(src: Any, dst: Any, *, torch: str, link: bool = True) -> DowngradeReport:
    """Write ``dst``: the DCP folder ``src`` as torch release ``torch`` reads it.

    ``src``'s ``.metadata`` is read hardened (no code of the file runs; its names come from
    a closed table) and written again with plain pickle opcodes naming the target's own
    classes; every other regular file of ``src`` is hard-linked (``link=True``; copied
    where the file system cannot link, or with ``link=False``). ``src`` is never changed.
    ``dst`` must not exist, or be an empty folder; its ``.metadata`` is written last, so
    a folder left half made by a failure is not a checkpoint. A hard-linked data file
    is the same file as ``src``'s: save into ``dst`` again only with ``link=False``.
    Raises DowngradeError naming what the target cannot represent, UnsafeCheckpointError
    for a ``.metadata`` that names anything outside DCP's classes.
    """
    if not isinstance(torch, str):
        raise TypeError(f"torch: expected a release such as '2.8', got {short(torch)}")
    row = release_row(torch)
    src, dst = os.fspath(src), os.fspath(dst)
    folder = read_folder(src)
    files = _other_files(src, folder)
    _refuse_unrepresentable(folder, row)  # before anything is read for the merge
    folder, whole, merged = _merge_whole(src, folder, row, files)
    data, changes = _emit(folder, row)
    _make_folder(src, dst)
    linked = link
    for name in files:
        if linked:
            try:
                os.link(os.path.join(src, name), os.path.join(dst, name))
                continue
            except OSError:
                linked = False  # another file system: copy this one and the rest
        shutil.copyfile(os.path.join(src, name), os.path.join(dst, name))
    if whole:
        with open(os.path.join(dst, WHOLE_FILE), "wb") as out:
            out.write(whole)
    tmp = os.path.join(dst, METADATA + ".tmp")
    with open(tmp, "wb") as out:
        out.write(data)
    os.replace(tmp, os.path.join(dst, METADATA))
    version = _name(row)
    changes = [*merged, *changes]
    return DowngradeReport(src, dst, torch, version, tuple(changes), tuple(files), linked)


WHOLE_FILE = "__compatshim_whole.distcp"  # the items torch 2.1/2.2 read whole (written, not linked)


def _merge_whole(
    src: str, folder: Folder, row: Release, files: list[str]
) -> tuple[Folder, bytes, list[str]]:
    """torch 2.2 (and 2.1) plan a dict or list that holds no tensor as one item, where 2.3+
    save its entries one by one: a plain ``dcp.load`` there would miss it (a scheduler's
    state: a restart at epoch 0). Each such item is built again from its entries (each read
    hardened from its own ``torch.save`` bytes), saved whole into :data:`WHOLE_FILE` and
    added to the ``.metadata`` under its own name; the entries stay for newer readers."""
    whole = {}
    for route, held in _whole_routes(folder, row).items():
        name = ".".join(map(str, route))
        if name not in folder.entries:  # one already saved whole (by this rewrite) stays
            whole[name] = route, held
    if not whole:
        return folder, b"", []
    if WHOLE_FILE in files:
        raise DowngradeError(f"{src}: already holds a file named {WHOLE_FILE}, which it writes")
    import torch

    from ._load import load

    out, storage, merged = io.BytesIO(), list(folder.storage), []
    entries, planner = dict(folder.entries), dict(folder.planner_data)
    for name, (route, held) in whole.items():
        value: Any = [] if isinstance(held[0][1][len(route)], int) else {}
        for fqn, full in held:
            place = folder.storage_for(fqn)
            if place is None:
                raise CheckpointError(f"{src}: item {short(fqn)} has no storage_data entry")
            blob = io.BytesIO(folder.stored(place))
            _put(value, full[len(route) :], load(blob), len(held))
        start = out.tell()
        torch.save(value, out)
        entries[name], planner[name] = None, route
        index = {"fqn": name, "offset": None, "index": None}
        where = {"relative_path": WHOLE_FILE, "offset": start, "length": out.tell() - start}
        storage.append(Storage(index, where))
        merged.append(
            f"{name}: written whole into {WHOLE_FILE} from its {len(held)} entries "
            f"({names([fqn for fqn, _ in held], 5)}): torch {_name(row)} asks for a dict "
            "without tensors as one item"
        )
    new = dataclasses.replace(folder, entries=entries, planner_data=planner, storage=storage)
    return new, out.getvalue(), merged


def _put(root: Any, path: tuple[Any, ...], value: Any, count: int) -> None:
    """``value`` at ``path`` under ``root``, as torch's unflatten does: a str key makes a dict,
    an int a list (padded with None); an index past the item's entry count is damage."""
    node = root
    for depth, key in enumerate(path):
        if isinstance(node, list) and type(key) is int and 0 <= key < count:
            node.extend([None] * (key + 1 - len(node)))
        elif not (isinstance(node, dict) and type(key) is str):
            raise CheckpointError(f"planner_data route {short(path)}: not what torch writes")
        if depth == len(path) - 1:
            node[key] = value
        else:
            if node[key] is None if isinstance(node, list) else key not in node:
                node[key] = [] if type(path[depth + 1]) is int else {}
            node = node[key]


def _whole_routes(
    folder: Folder, row: Release
) -> dict[tuple[Any, ...], list[tuple[str, tuple[Any, ...]]]]:
    """Each route torch ``row`` plans as one item (a dict or list without tensors) that the
    folder holds entry by entry, with those entries' fqns and whole routes."""
    if row.version >= (2, 3) or type(folder.planner_data) is not dict:
        return {}
    routes = {fqn: tuple(route) for fqn, route in folder.planner_data.items()}
    with_tensors = {
        routes[fqn][:depth]
        for fqn, tensor in folder.entries.items()
        if tensor is not None and fqn in routes
        for depth in range(1, len(routes[fqn]) + 1)
    }
    whole: dict[tuple[Any, ...], list[tuple[str, tuple[Any, ...]]]] = {}
    for fqn, tensor in folder.entries.items():
        route = routes.get(fqn, ())
        if tensor is None and len(route) > 1:
            depth = next(d for d in range(1, len(route) + 1) if route[:d] not in with_tensors)
            if depth < len(route):
                whole.setdefault(route[:depth], []).append((fqn, route))
    return whole


def _other_files(src: str, folder: Folder) -> list[str]:
    """The regular files of ``src`` but ``.metadata``; each data file ``.metadata`` names
    must be one (a symlink is refused: it could lead anywhere)."""
    found = []
    for entry in sorted(os.scandir(src), key=lambda e: e.name):
        if entry.name != METADATA and entry.is_file(follow_symlinks=False):
            found.append(entry.name)
    for storage in folder.storage:
        name = storage.info["relative_path"]
        if name not in found:
            full = os.path.join(src, name)
            kind = "a symlink" if os.path.islink(full) else "missing"
            raise CheckpointError(f"{src}: data file {short(name)} is {kind}")
    return found


def _make_folder(src: str, dst: str) -> None:
    if os.path.exists(dst):
        if os.path.samefile(src, dst):
            raise ValueError(f"dst: {dst} is src; the rewrite goes to a new folder")
        if not os.path.isdir(dst) or os.listdir(dst):
            raise FileExistsError(f"dst: {dst} exists and is not an empty folder")
    else:
        os.makedirs(dst)


def _refuse_unrepresentable(folder: Folder, row: Release) -> None:
    """DowngradeError naming what ``row`` cannot represent: a dtype it lacks, data files
    written through a transform before 2.8."""
    tensors = folder.tensors()
    where = f"torch {_name(row)}"
    lacking = sorted({t.dtype for t in tensors.values()} - row.dtypes)
    if lacking:
        held = [fqn for fqn, t in tensors.items() if t.dtype in lacking]
        raise DowngradeError(
            f"dtype {', '.join(lacking)} ({names(held, 5)}): {where} has no such dtype, so "
            "the older release cannot represent these tensors; cast them before saving"
        )
    transformed = [s.index["fqn"] for s in folder.storage if s.info.get("transform_descriptors")]
    if transformed and "transform_descriptors" not in row.storage_info:
        raise DowngradeError(
            f"_StorageInfo.transform_descriptors ({names(transformed, 5)}): the data files "
            f"were written through a transform (compression, ...), which {where}'s reader "
            "does not know (torch 2.8+ does); save without extensions"
        )


def _emit(folder: Folder, row: Release) -> tuple[bytes, list[str]]:
    """The ``.metadata`` bytes for ``row``, and each change from what the file held
    (:func:`_refuse_unrepresentable` has passed it)."""
    changes: list[str] = []
    tensors = folder.tensors()
    where = f"torch {_name(row)}"
    out = _Pickler()
    out.obj(f"{DCP}.Metadata")
    out.mark_dict()
    out.value("state_dict_metadata")
    out.mark_dict()
    for fqn, tensor in folder.entries.items():
        out.value(fqn)
        if tensor is None:
            out.obj(f"{DCP}.BytesStorageMetadata")
        else:
            _tensor(out, tensor, row)
    out.end_dict()
    out.value("planner_data")
    out.value(folder.planner_data)
    out.value("storage_data")
    out.mark_dict()
    for storage in folder.storage:
        out.obj(_INDEX)
        out.plain_dict(storage.index)
        out.build()
        out.obj(_STORAGE_INFO)
        out.plain_dict({k: v for k, v in storage.info.items() if v is not None})
        out.build()
    out.end_dict()
    meta = folder.storage_meta
    if "storage_meta" in folder.extra and row.storage_meta is None:
        changes.append(f"Metadata.storage_meta dropped ({where} has no StorageMeta)")
    elif "storage_meta" in folder.extra:
        out.value("storage_meta")
        if meta is None:
            out.value(None)
        else:
            dropped = sorted(set(meta) - set(row.storage_meta))  # type: ignore[arg-type]
            if dropped:
                changes.append(f"StorageMeta.{', '.join(dropped)} dropped (not in {where})")
            out.obj(f"{DCP}.StorageMeta")
            out.plain_dict({k: v for k, v in meta.items() if k not in dropped})
            out.build()
    if "version" in folder.extra:
        if "version" in row.metadata:
            out.value("version")
            out.value(folder.extra["version"])
        else:
            changes.append(f"Metadata.version dropped (not in {where})")
    out.end_dict()
    out.build()
    six = sum(t.fields == 6 for t in tensors.values())
    if six and not row.strides:
        changes.append(
            f"TensorProperties.strides dropped from {six} tensor(s) (not in {where}; torch's "
            "readers never use it)"
        )
    if tensors and row.home != DCP:
        changes.append(f"TensorProperties named from {row.home} ({where})")
    return out.finish(), changes


def _tensor(out: _Pickler, tensor: Tensor, row: Release) -> None:
    out.obj(_TENSOR)
    out.mark_dict()
    out.value("properties")
    key = ("TensorProperties", tensor.dtype, tensor.layout, tensor.requires_grad,
           tensor.encoding, tensor.pin_memory, tensor.strides if row.strides else None)  # fmt: skip
    if not out.again(key):  # the bytes of a TensorProperties written before, as they were
        start = out.start()
        out.obj(f"{row.home}.TensorProperties")
        out.mark()
        out.global_(f"torch.{tensor.dtype}")
        out.global_("torch.serialization._get_layout")
        out.value((tensor.layout,))
        out.reduce()
        out.value(tensor.requires_grad)
        out.global_(f"{row.home}.{row.encoding}")
        out.value((tensor.encoding,))
        out.reduce()
        out.value(tensor.pin_memory)
        if row.strides:
            out.value(tensor.strides)
        out.tuple_from_mark()
        out.build()
        out.keep(key, start)
    out.value("size")
    out.value(Size(tensor.size))
    out.value("chunks")
    out.raw(b"]")
    for offsets, sizes in tensor.chunks:
        out.obj(_CHUNK)
        out.raw(_CHUNK_KEYS[0])
        out.value(Size(offsets))
        out.raw(_CHUNK_KEYS[1])
        out.value(Size(sizes))
        out.raw(b"uba")
    out.end_dict()
    out.build()


_BININT = struct.Struct("<ci")  # the opcode and its argument, packed at once
_BINUNICODE = struct.Struct("<cI")


def _text(value: str) -> bytes:
    data = value.encode("utf-8", "surrogatepass")
    return _BINUNICODE.pack(b"X", len(data)) + data


_TENSOR, _CHUNK = f"{DCP}.TensorStorageMetadata", f"{DCP}.ChunkStorageMetadata"
_INDEX, _STORAGE_INFO = f"{DCP}.MetadataIndex", f"{FS}._StorageInfo"
_CHUNK_KEYS = (b"}(" + _text("offsets"), _text("sizes"))  # a chunk's dict, around the sizes


class _Pickler:
    """Protocol 2 opcodes, written one by one: globals by name (memoized), NEWOBJ, BUILD,
    REDUCE, and plain values (None, bool, int, str, tuple, list, dict, ``torch.Size``).

    A ``.metadata`` repeats itself (keys, FQNs, sizes, one TensorProperties per dtype), so
    the bytes of a str, a ``torch.Size`` and a TensorProperties are kept once written:
    the same bytes again, as the opcodes are (a global already named is a memo read)."""

    def __init__(self) -> None:
        self.parts: list[bytes] = [b"\x80\x02"]
        self.raw: Callable[[bytes], None] = self.parts.append  # bytes as they are
        self.memo: dict[str, int] = {}
        self.texts: dict[str, bytes] = {}
        self.kept: dict[Any, bytes] = {}  # bytes to write again, by what they encode

    def start(self) -> tuple[int, int]:
        """Where the next bytes go, and how many globals are named so far (for :meth:`keep`)."""
        return len(self.parts), len(self.memo)

    def keep(self, key: Any, start: tuple[int, int]) -> None:
        """The bytes written since ``start`` written again for ``key`` by :meth:`again`, if
        they named no new global (a memo write must not happen twice)."""
        if len(self.memo) == start[1]:
            self.kept[key] = b"".join(self.parts[start[0] :])

    def again(self, key: Any) -> bool:
        data = self.kept.get(key)
        if data is not None:
            self.raw(data)
        return data is not None

    def global_(self, qual: str) -> None:
        index = self.memo.get(qual)
        if index is None:
            module, _, name = qual.rpartition(".")
            self.raw(b"c" + module.encode() + b"\n" + name.encode() + b"\n")
            index = self.memo[qual] = len(self.memo)
            self.raw(b"q" + bytes((index,)) if index < 256 else b"r" + struct.pack("<I", index))
        else:
            self.raw(b"h" + bytes((index,)) if index < 256 else b"j" + struct.pack("<I", index))

    def obj(self, qual: str) -> None:
        """``cls.__new__(cls)`` (NEWOBJ); the caller writes the state and :meth:`build`."""
        self.global_(qual)
        self.raw(b")\x81")

    def build(self) -> None:
        self.raw(b"b")

    def reduce(self) -> None:
        self.raw(b"R")

    def mark(self) -> None:
        self.raw(b"(")

    def tuple_from_mark(self) -> None:
        self.raw(b"t")

    def mark_dict(self) -> None:
        self.raw(b"}(")

    def end_dict(self) -> None:
        self.raw(b"u")

    def plain_dict(self, items: dict[str, Any]) -> None:
        self.mark_dict()
        for key, value in items.items():
            self.value(key)
            self.value(value)
        self.end_dict()

    def value(self, value: Any) -> None:
        kind = type(value)
        if kind is str:
            data = self.texts.get(value)
            if data is None:
                data = self.texts[value] = _text(value)
            self.raw(data)
        elif value is None:
            self.raw(b"N")
        elif kind is bool:
            self.raw(b"\x88" if value else b"\x89")
        elif kind is int:
            if -(2**31) <= value < 2**31:
                self.raw(_BININT.pack(b"J", value))
            else:
                data = pickle.encode_long(value)  # type: ignore[attr-defined]
                self.raw(b"\x8a" + bytes((len(data),)) + data)
        elif kind is Size:
            key = (Size, value)
            if not self.again(key):
                start = self.start()
                self.global_("torch.Size")
                self.raw(b"(")
                self.value(tuple(value))
                self.raw(b"tR")
                self.keep(key, start)
        elif kind in (tuple, list):
            self.raw(b"(" if kind is tuple else b"](")
            for item in value:
                self.value(item)
            self.raw(b"t" if kind is tuple else b"e")
        elif kind is dict:
            self.plain_dict(value)
        else:  # read_folder lets nothing else through
            raise CheckpointError(f"cannot write {short(value)} into a .metadata")

    def finish(self) -> bytes:
        self.raw(b".")
        return b"".join(self.parts)


def main(src: str, dst: str, target: str, link: bool) -> int:
    """``compatshim dcp-downgrade``: 0 written, 1 refused (named), 2 unreadable or bad use."""
    import sys

    from .errors import UnsafeCheckpointError

    try:
        report = downgrade_dcp(src, dst, torch=target, link=link)
    except (DowngradeError, UnsafeCheckpointError) as exc:
        print(f"compatshim dcp-downgrade: refused: {exc}", file=sys.stderr)
        return 1
    except (CheckpointError, OSError, ValueError) as exc:
        print(f"compatshim dcp-downgrade: {exc}", file=sys.stderr)
        return 2
    how = "hard-linked" if report.linked else "copied"
    print(f"{report.dst}: {report.src} as torch {report.written_as} reads it "
          f"({len(report.files)} other file(s) {how})")  # fmt: skip
    for line in report.changes:
        print(f"  {line}")
    return 0
