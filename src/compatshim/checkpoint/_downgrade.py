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
2.2      dtypes float8_e4m3fn, float8_e5m2, float8_e4m3fnuz, float8_e5m2fnuz, complex32,
         bits8-16 (saved with ``_rebuild_tensor_v3``, which 2.2 added: torch 2.1.2 fails)
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

from .._text import escaped, names, short
from ._dcp_folder import METADATA
from ._dcp_records import DCP, FS, SHARD, Folder, Size, Storage, Tensor, read_folder
from .errors import CheckpointError, as_well

_D21_NAMES = (
    "bfloat16 bool cdouble cfloat complex128 complex64 double float float16 float32 float64 "
    "half int int16 int32 int64 int8 long qint32 qint8 quint2x4 quint4x2 quint8 short uint8"
)
_D21 = frozenset(_D21_NAMES.split())
# newer releases save these with torch._utils._rebuild_tensor_v3, which 2.2 added: torch 2.1
# cannot load them ("Can't get attribute '_rebuild_tensor_v3'"), nor save its own float8
_V3 = {"bits16", "bits1x8", "bits2x4", "bits4x2", "bits8", "chalf", "complex32"}
_D22 = _D21 | _V3 | {"float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"}
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


def _minor(target: str) -> tuple[int, int]:
    """``(2, 4)`` for "2.4", "2.4.1", "2.4.1+cpu"; ValueError naming anything else."""
    try:
        major, minor = (int(part) for part in target.split("+")[0].split(".")[:2])
    except (ValueError, AttributeError):
        raise ValueError(f"torch: expected a release such as '2.8', got {short(target)}") from None
    return major, minor


def release_row(target: str) -> Release:
    """The newest row of :data:`RELEASES` at or before ``target`` ("2.4", "2.4.1", "2.8.0+cpu")."""
    rows = [r for r in RELEASES if r.version <= _minor(target)]
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
    for name, path in (("src", src), ("dst", dst)):
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"{name}: expected a folder path, got {short(path)}")
    if link is not True and link is not False:  # "no" is truthy: it would link
        raise TypeError(f"link: expected True or False, got {short(link)}")
    row = release_row(torch)
    src, dst = os.fspath(src), os.fspath(dst)
    folder = read_folder(src)
    files = _other_files(src, folder)
    _refuse_unrepresentable(folder, row, torch)  # before anything is read for the merge
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
        with open(os.path.join(dst, WHOLE_FILE), "xb") as out:  # x: the folder is new
            out.write(whole)
    tmp = os.path.join(dst, METADATA + ".tmp")
    with open(tmp, "xb") as out:
        out.write(data)
    os.replace(tmp, os.path.join(dst, METADATA))
    version = _name(row)
    changes = [*merged, *changes]
    if _minor(torch) > RELEASES[-1].version:  # detect, don't guess: say it is a guess
        changes.insert(0, (
            f"torch {torch} is newer than compatshim's table (its newest row is {version}): "
            f"written as torch {version} reads it, which a newer torch's DCP should read too; "
            "not tested"
        ))  # fmt: skip
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

    from .errors import UnsafeCheckpointError
    from .request import read

    out, storage, merged = io.BytesIO(), list(folder.storage), []
    entries, planner = dict(folder.entries), dict(folder.planner_data)
    for name, (route, held) in whole.items():
        value: Any = [] if isinstance(held[0][1][len(route)], int) else {}
        for fqn, full in held:
            place = folder.storage_for(fqn)
            if place is None:
                raise CheckpointError(f"{src}: item {short(fqn)} has no storage_data entry")
            blob = io.BytesIO(folder.stored(place))
            blob.name = f"{src}: item {short(fqn)}"  # what a refusal names
            try:
                item = read(blob)
            except UnsafeCheckpointError as exc:
                raise as_well(UnsafeCheckpointError, type(exc))(
                    f"{exc}: torch {_name(row)} reads {name} whole, so compatshim reads its "
                    "entries to write it so, and reads nothing it refuses; save plain values "
                    "there, or rewrite for torch 2.4+ (entries are kept as they are)",
                    exc.refused,
                ) from None
            _put(value, full[len(route) :], item, len(held))
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
    names = set(found)
    for storage in folder.storage:
        name = storage.info["relative_path"]
        if name not in names:
            full = os.path.join(src, name)
            kind = "a symlink" if os.path.islink(full) else "missing"
            raise CheckpointError(f"{src}: data file {short(name)} is {kind}")
    return found


def _make_folder(src: str, dst: str) -> None:
    inside = os.path.realpath(src)  # links resolved: src by another name is src
    if os.path.commonpath([inside, os.path.realpath(dst)]) == inside:
        raise ValueError(
            f"dst: {dst} is src or lies inside it; the rewrite goes to a new folder outside "
            "src, which is never changed"
        )
    try:
        os.mkdir(dst)
    except FileNotFoundError:
        os.makedirs(dst)
    except FileExistsError:  # an empty folder will do; a file, a link to none won't
        if not os.path.isdir(dst) or os.listdir(dst):
            raise FileExistsError(f"dst: {dst} exists and is not an empty folder") from None


def _refuse_unrepresentable(folder: Folder, row: Release, target: str) -> None:
    """DowngradeError naming what ``row`` cannot represent: a dtype it lacks, data files
    written through a transform before 2.8. ``target``: the release asked for."""
    tensors = folder.tensors()
    where = f"torch {_name(row)}"
    if _minor(target) != row.version:  # a release between two rows: named as asked
        where = f"torch {target} (whose DCP reads as torch {_name(row)}'s)"
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
    (:func:`_refuse_unrepresentable` has passed it).

    The globals the file needs are named first (:meth:`_Pickler.declare`), so that a record
    refers to each with the same bytes wherever it lies: a record is fixed runs of bytes
    around its values, and like tensors are like bytes (the rewrite of a 1 GiB, 4-rank
    folder must cost little beside its hardened read: issue 39 asks <= 1.10x)."""
    changes: list[str] = []
    tensors = folder.tensors()
    where = f"torch {_name(row)}"
    meta = folder.storage_meta
    if "storage_meta" in folder.extra and row.storage_meta is None:
        changes.append(f"Metadata.storage_meta dropped ({where} has no StorageMeta)")
    kept_meta = "storage_meta" in folder.extra and row.storage_meta is not None
    quals = [f"{DCP}.Metadata"]
    if len(tensors) < len(folder.entries):
        quals.append(_BYTES)
    if tensors:
        quals += [_TENSOR, _CHUNK, f"{row.home}.TensorProperties", _LAYOUT]
        quals += [f"{row.home}.{row.encoding}"]
        quals += [f"torch.{dtype}" for dtype in sorted({t.dtype for t in tensors.values()})]
    if folder.storage:
        quals += [_INDEX, _STORAGE_INFO]
    if tensors or any(s.index.get("offset") is not None for s in folder.storage):
        quals.append("torch.Size")
    if kept_meta and meta is not None:
        quals.append(f"{DCP}.StorageMeta")
    out = _Pickler()
    ref = out.declare(quals)
    text = out.encode
    out.raw(ref[f"{DCP}.Metadata"] + b")\x81}(" + text("state_dict_metadata") + b"}(")
    _entries(out, ref, folder.entries, row)
    out.raw(b"u" + text("planner_data") + _plain(folder.planner_data) + text("storage_data"))
    _storage(out, ref, folder.storage)
    if kept_meta:
        out.raw(text("storage_meta"))
        if meta is None:
            out.raw(b"N")
        else:
            dropped = sorted(set(meta) - set(row.storage_meta))  # type: ignore[arg-type]
            if dropped:
                changes.append(f"StorageMeta.{', '.join(dropped)} dropped (not in {where})")
            kept = {k: v for k, v in meta.items() if k not in dropped}
            out.raw(ref[f"{DCP}.StorageMeta"] + b")\x81" + out.encode(kept) + b"b")
    if "version" in folder.extra:
        if "version" in row.metadata:
            out.raw(text("version") + out.encode(folder.extra["version"]))
        else:
            changes.append(f"Metadata.version dropped (not in {where})")
    out.raw(b"ub")
    six = sum(t.fields == 6 for t in tensors.values())
    if six and not row.strides:
        changes.append(
            f"TensorProperties.strides dropped from {six} tensor(s) (not in {where}; torch's "
            "readers never use it)"
        )
    if tensors and row.home != DCP:
        changes.append(f"TensorProperties named from {row.home} ({where})")
    return out.finish(), changes


def _entries(
    out: _Pickler, ref: dict[str, bytes], entries: dict[str, Tensor | None], row: Release
) -> None:
    """``state_dict_metadata``'s items: fqn -> TensorStorageMetadata or BytesStorageMetadata."""
    text, size, put = out.encode, out.size, out.parts.extend
    head = ref.get(_TENSOR, b"") + b")\x81}(" + text("properties")
    props = ref.get(f"{row.home}.TensorProperties", b"")
    encoding = ref.get(f"{row.home}.{row.encoding}", b"")
    chunk, sizes_key = ref.get(_CHUNK, b"") + b")\x81}(" + text("offsets"), text("sizes")
    bodies: dict[Any, bytes] = {}  # a tensor's bytes after "properties", by what they hold
    for fqn, tensor in entries.items():
        if tensor is None:
            put((text(fqn), ref[_BYTES], b")\x81"))
            continue
        strides = tensor.strides if row.strides else None
        same = (tensor.dtype, tensor.layout, tensor.requires_grad, tensor.encoding,
                tensor.pin_memory, strides, tensor.size, tuple(tensor.chunks))  # fmt: skip
        body = bodies.get(same)  # like shards of like tensors (layers, ranks): like bytes
        if body is None:
            body = bodies[same] = b"".join((
                props, b")\x81(", ref[f"torch.{tensor.dtype}"], ref[_LAYOUT],
                text((tensor.layout,)), b"R", text(tensor.requires_grad), encoding,
                text((tensor.encoding,)), b"R", text(tensor.pin_memory),
                text(strides) if row.strides else b"", b"tb", text("size"), size(tensor.size),
                text("chunks"), b"]",
                *(chunk + size(at) + sizes_key + size(dims) + b"uba" for at, dims in tensor.chunks),
                b"ub",
            ))  # fmt: skip
        put((text(fqn), head, body))


def _storage(out: _Pickler, ref: dict[str, bytes], storage: list[Storage]) -> None:
    """``storage_data``: MetadataIndex -> _StorageInfo for each item, every field written (a
    missing offset or index as None, the classes' default); ``%`` puts in the values."""
    text, size, known, sized = out.encode, out.size, out.texts.get, out.sizes.get
    index, info = ref.get(_INDEX, b"") + b")\x81}(", ref.get(_STORAGE_INFO, b"") + b")\x81}("
    parts = (index + text("fqn"), text("offset"), text("index"), b"ub" + info +
             text("relative_path"), text("offset"), text("length"))  # fmt: skip
    entry = b"%s".join(part.replace(b"%", b"%%") for part in parts) + b"%s%sub"
    transforms = text("transform_descriptors")
    out.raw(b"}(")
    pack = _BININT.pack  # offset and length: ints >= 0 (read_folder), most under 2**31
    for item in storage:  # read_folder checked each field's type
        key, place = item.index, item.info  # (known() or text(): a call less per value)
        fqn, offset, number = key["fqn"], key.get("offset"), key.get("index")
        path, start, length = place["relative_path"], place["offset"], place["length"]
        more = place.get("transform_descriptors")
        out.raw(entry % (
            known(fqn) or text(fqn), b"N" if offset is None else sized(offset) or size(offset),
            b"N" if number is None else _int(number), known(path) or text(path),
            pack(b"J", start) if start < 2**31 else _int(start),
            pack(b"J", length) if length < 2**31 else _int(length),
            b"" if more is None else transforms + text(more),
        ))  # fmt: skip
    out.raw(b"u")


_BININT = struct.Struct("<ci")  # the opcode and its argument, packed at once
_BINUNICODE = struct.Struct("<cI")


def _text(value: str) -> bytes:
    data = value.encode("utf-8", "surrogatepass")
    return _BINUNICODE.pack(b"X", len(data)) + data


def _int(value: int) -> bytes:
    if -(2**31) <= value < 2**31:
        return _BININT.pack(b"J", value)
    data = pickle.encode_long(value)  # type: ignore[attr-defined]
    return b"\x8a" + bytes((len(data),)) + data


def _plain(value: dict[str, Any] | None) -> bytes:
    """The bytes that push ``planner_data`` (read_folder checked it: None, or str keys to
    tuples or lists of str and int), made by C pickle: those types only, no memo (``fast``),
    so no memo index of the file's globals is reused; protocol 2 opcodes throughout."""
    buffer = io.BytesIO()
    writer = pickle.Pickler(buffer, 2)
    writer.fast = True
    writer.dump(value)
    return buffer.getvalue()[2:-1]  # less PROTO 2 and STOP


_TENSOR, _CHUNK = f"{DCP}.TensorStorageMetadata", f"{DCP}.ChunkStorageMetadata"
_BYTES, _LAYOUT = f"{DCP}.BytesStorageMetadata", "torch.serialization._get_layout"
_INDEX, _STORAGE_INFO = f"{DCP}.MetadataIndex", f"{FS}._StorageInfo"


class _Pickler:
    """Protocol 2 bytes, put together by :func:`_emit` (the tests craft files with it):
    globals by name, memoized (:meth:`ref`); plain values (None, bool, int, str, tuple,
    list, dict, ``torch.Size``: :meth:`encode`); NEWOBJ, BUILD and REDUCE are the caller's
    opcodes. A ``.metadata`` repeats itself (keys, FQNs, sizes), so the bytes of a str
    and of a ``torch.Size`` are kept once made, and given again."""

    def __init__(self) -> None:
        self.parts: list[bytes] = [b"\x80\x02"]
        self.raw: Callable[[bytes], None] = self.parts.append  # bytes as they are
        self.memo: dict[str, bytes] = {}  # a global named -> the bytes that fetch it again
        self.texts: dict[str, bytes] = {}
        self.sizes: dict[tuple[int, ...], bytes] = {}

    def ref(self, qual: str) -> bytes:
        """The bytes that push global ``qual``: its name, memoized, the first time."""
        data = self.memo.get(qual)
        if data is not None:
            return data
        index = len(self.memo)
        put, get = (b"q", b"h") if index < 256 else (b"r", b"j")
        arg = bytes((index,)) if index < 256 else struct.pack("<I", index)
        self.memo[qual] = get + arg
        module, _, name = qual.rpartition(".")
        return b"c" + module.encode() + b"\n" + name.encode() + b"\n" + put + arg

    def declare(self, quals: list[str]) -> dict[str, bytes]:
        """Each global of ``quals`` named now and popped, so that every later mention of
        it is the same bytes (a memo read), whichever comes first."""
        for qual in quals:
            self.raw(self.ref(qual) + b"0")
        return dict(self.memo)

    def encode(self, value: Any) -> bytes:
        """The bytes that push ``value``."""
        kind = type(value)
        if kind is str:
            data = self.texts.get(value)
            if data is None:
                data = self.texts[value] = _text(value)
            return data
        if kind is int:
            return _int(value)
        if value is None:
            return b"N"
        if kind is bool:
            return b"\x88" if value else b"\x89"
        encode = self.encode
        if kind is Size:
            return self.size(value)
        if kind is tuple:
            return b"(" + b"".join(map(encode, value)) + b"t"
        if kind is list:
            return b"](" + b"".join(map(encode, value)) + b"e"
        if kind is dict:
            return b"}(" + b"".join(encode(k) + encode(v) for k, v in value.items()) + b"u"
        raise CheckpointError(f"cannot write {short(value)} into a .metadata")  # read_folder: never

    def size(self, dims: tuple[int, ...]) -> bytes:
        """The bytes that push ``torch.Size(dims)``."""
        data = self.sizes.get(dims)
        if data is None:
            known = "torch.Size" in self.memo  # else these bytes name it: not to be repeated
            data = self.ref("torch.Size") + b"((" + b"".join(map(self.encode, dims)) + b"ttR"
            if known:
                self.sizes[dims] = data
        return data

    def finish(self) -> bytes:
        self.raw(b".")
        return b"".join(self.parts)


def main(src: str, dst: str, target: str, link: bool) -> int:
    """``compatshim dcp-downgrade``: 0 written, 1 refused (named), 2 unreadable or bad use."""
    import sys

    from .errors import UnsafeCheckpointError

    try:
        _minor(target)
    except ValueError as exc:  # "torch: ..." is the Python argument; here it is the option
        print(f"compatshim dcp-downgrade: --{escaped(str(exc))}", file=sys.stderr)
        return 2
    try:
        report = downgrade_dcp(src, dst, torch=target, link=link)
    except (DowngradeError, UnsafeCheckpointError) as exc:
        print(f"compatshim dcp-downgrade: refused: {escaped(str(exc))}", file=sys.stderr)
        return 1
    except (CheckpointError, OSError, ValueError) as exc:
        print(f"compatshim dcp-downgrade: {escaped(str(exc))}", file=sys.stderr)
        return 2
    how = "hard-linked" if report.linked else "copied"
    print(escaped(f"{report.dst}: {report.src} as torch {report.written_as} reads it "
                  f"({len(report.files)} other file(s) {how})"))  # fmt: skip
    for line in report.changes:  # a key may hold ESC, CR, U+202E
        print(f"  {escaped(line)}")
    return 0
