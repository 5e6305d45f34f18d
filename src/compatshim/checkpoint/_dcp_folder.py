"""torch.distributed.checkpoint (DCP) folders: the ``.metadata`` file read safely, and summed up.

The file is a pickle, read by ``load``'s machine with the handlers of ``_dcp``.
Used by the ``torch-dcp-safe-metadata`` patch (hardened mode) and by ``inspect``.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import IO, Any

from .._text import short
from . import _dcp
from ._container import open_regular, plain_text
from ._limits import Budget, Walks, check_shape, count
from .errors import CheckpointError, UnsafeCheckpointError

METADATA = ".metadata"


def read_metadata(file: IO[bytes], allow: Any = ()) -> Any:
    """A DCP ``.metadata`` from an open binary file: a pickle, read by ``load``'s machine
    (``request.read``, ``expect="dcp-metadata"``).

    Anything else (a torch zip file, safetensors) is refused: ``pickle.load`` would
    not read it either; so is a data file outside the folder. Raises
    UnsafeCheckpointError naming the refused globals.
    """
    from .request import Request, read

    if not all(hasattr(file, a) for a in ("read", "seek", "tell")):
        raise TypeError("expected a seekable binary file object")
    return read(file, Request(allow=allow, expect="dcp-metadata"))


def _refuse_paths_outside(metadata: Any, what: str, folder: str | None = None) -> None:
    """A data file must lie inside the folder: torch joins ``relative_path`` to the folder
    as it is, so ``../x`` or an absolute path made it read any file (hardened or not). It
    must be a ``str``, as torch writes it: a ``PurePosixPath("../x")`` or ``numpy.str_``
    went past a check of ``str`` alone. Where the ``folder`` is known, a path that a link
    inside it leads out of the folder is refused too (a tarball can carry one)."""
    storage = vars(metadata).get("storage_data") if hasattr(metadata, "__dict__") else None
    inside = None
    seen: set[str] = set()
    for info in storage.values() if type(storage) is dict else ():
        fields = vars(info) if hasattr(info, "__dict__") else {}
        if "relative_path" not in fields:
            continue  # another storage plugin's records: no file path
        path = fields["relative_path"]
        if type(path) is not str and isinstance(path, (str, os.PathLike)):  # it can lead out
            raise UnsafeCheckpointError(
                f"{what}: a data file path that is {short(path)}, not a str as torch writes it",
                (f"DCP relative_path of type {short(type(path).__qualname__, 80)}",),
            )
        if type(path) is not str:  # torch cannot join it to the folder: damage
            raise CheckpointError(f"{what}: a storage_data entry's file is {short(path)}")
        if path in seen:  # a rank's file holds many items: each path is judged once
            continue
        seen.add(path)
        try:  # a lone surrogate ("\ud800"): no file system names it, os raises its own error
            os.fsencode(path)
        except UnicodeEncodeError:
            raise CheckpointError(
                f"{what}: a data file name {short(path)} that no file system holds"
            ) from None
        parts = re.split(r"[/\\]", path)
        if not path or "\0" in path or os.path.isabs(path) or ".." in parts or path[1:2] == ":":
            raise UnsafeCheckpointError(
                f"{what}: a data file {short(path)} outside the checkpoint folder (torch would "
                "read it wherever it points)",
                (f"DCP relative_path {short(path, 80)}",),
            )
        if folder is None:
            continue
        inside = inside or os.path.realpath(folder)
        real = os.path.realpath(os.path.join(folder, path))
        if os.path.commonpath([inside, real]) != inside:
            raise UnsafeCheckpointError(
                f"{what}: data file {short(path)} is a link out of the checkpoint folder (to "
                f"{short(real, 200)}): torch would read that file",
                (f"DCP relative_path {short(path, 80)} (a link out)",),
            )


def _charge_uses(metadata: Any, budget: Budget, what: str) -> None:
    """Charge what torch walks once it has the file (:class:`~._limits.Walks`): unchecked,
    a 50 KB file sharing one chunk list among its entries made torch build 10**6 read
    items (16 s)."""
    fields = vars(metadata) if hasattr(metadata, "__dict__") else {}
    entries, planner = fields.get("state_dict_metadata"), fields.get("planner_data")
    walks = Walks(budget)
    listed = []
    for fqn, entry in entries.items() if type(entries) is dict else ():
        chunks = vars(entry).get("chunks") if hasattr(entry, "__dict__") else None
        if type(chunks) is list:
            walks.chunk_list(len(chunks), f"{what}: {short(fqn)}")
            listed.append((vars(entry).get("size"), chunks, fqn))
    for size, chunks, fqn in listed:  # once every walk is paid for: each is walked once more
        _refuse_overlaps(size, chunks, f"{what}: {short(fqn)}")
    for route in planner.values() if type(planner) is dict else ():
        if type(route) in (tuple, list):
            walks.route(len(route), what)


def _refuse_overlaps(size: Any, chunks: list[Any], what: str) -> None:
    """:func:`refuse_overlapping_chunks` on torch's own objects, as far as they are torch's:
    a size or a chunk that is not a tuple is for torch's load to fail on, reading nothing."""
    try:
        dims = check_shape(tuple(size), what, "size") if isinstance(size, tuple) else None
    except CheckpointError:
        return
    if dims is None:
        return
    pairs = []
    for chunk in chunks:
        fields = vars(chunk) if hasattr(chunk, "__dict__") else {}
        at, extent = fields.get("offsets"), fields.get("sizes")
        if isinstance(at, tuple) and isinstance(extent, tuple):
            pairs.append((tuple(at), tuple(extent)))
    refuse_overlapping_chunks(dims, pairs, what)


def refuse_overlapping_chunks(
    dims: tuple[int, ...], chunks: Sequence[tuple[Any, Any]], what: str
) -> None:
    """A tensor of shape ``dims``: its ``(offsets, sizes)`` chunks lie inside it and, together,
    hold no more than it does, as every save writes them (shards that tile it, one copy of a
    replicated one). Chunks that overlap made DCP read, and decompress, the tensor's bytes
    once per chunk: 1,000 chunks over a 256 MiB tensor, 33 KB of zstd each, 128 GB of work
    from a 33 MB folder. The one rule for hardened ``dcp.load`` and for the records the dry
    run and the rewrite read (``_dcp_records``)."""
    room, held = count(dims, what), 0
    for at, extent in chunks:
        at = check_shape(at, what, "a chunk's offsets")
        extent = check_shape(extent, what, "a chunk's sizes")
        if (
            len(at) != len(dims)
            or len(extent) != len(dims)
            or any(a + e > d for a, e, d in zip(at, extent, dims))
        ):
            raise UnsafeCheckpointError(
                f"{what}: a chunk at {list(at)} of {list(extent)} lies outside the tensor's "
                f"size {list(dims)}",  # checked shapes: a few bounded ints
                (f"DCP chunk outside its tensor ({short(what, 80)})",),
            )
        held += count(extent, what)
        if held > room:
            raise UnsafeCheckpointError(
                f"{what}: its {len(chunks)} chunks hold more elements than the tensor's "
                f"{room}: they overlap, and DCP would read each element once per chunk",
                (f"DCP overlapping chunks ({short(what, 80)})",),
            )


def is_folder(f: Any) -> bool:
    """Whether ``f`` names a folder holding a DCP ``.metadata``."""
    return isinstance(f, (str, os.PathLike)) and os.path.isfile(os.path.join(f, METADATA))


@dataclass(frozen=True)
class DcpInfo:
    """What a DCP folder's ``.metadata`` says (``inspect``); tensors are in ``named_tensors``."""

    world_size: int | None  # ranks that wrote data files (__RANK_N.distcp), None if unnamed
    data_files: tuple[str, ...]
    items: tuple[str, ...]  # non-tensor entries (BytesStorageMetadata): torch.save'd values
    version: str | None


_DATA_FILE = re.compile(r"__(\d+)_\d+\.distcp")


def describe(
    metadata: Any, what: str = METADATA
) -> tuple[DcpInfo, list[tuple[str, str, tuple[int, ...]]]]:
    """The folder summary and ``(fqn, dtype, shape)`` of each tensor, from a loaded Metadata
    (``what``: the file, for messages).

    The dataclasses' fields come from the file unchecked (any value ``load`` builds), so
    each one read here is checked for the type torch writes before it is used: str FQNs
    and paths, a ``torch.dtype``, a shape of at most ``MAX_DIMS`` ints within
    ``MAX_ITEMS`` (``_limits``). Anything else is a CheckpointError naming the field, never
    a ``str()`` or product of whatever the file put there (a shared nested list prints
    in exponential time, a huge int multiplies slowly). Work: linear in the entries.
    """
    import torch
    from torch.distributed.checkpoint import filesystem
    from torch.distributed.checkpoint import metadata as md

    if type(metadata) is not md.Metadata:
        raise CheckpointError(f"{what} holds {short(metadata)}, not a DCP Metadata")
    state = vars(metadata).get("state_dict_metadata")
    if type(state) is not dict:
        raise CheckpointError(f"{what}: state_dict_metadata is {short(state)}, not a dict")
    tensors, items = [], []
    for fqn, entry in state.items():
        if type(fqn) is not str:
            raise CheckpointError(f"{what}: a state_dict_metadata key is {short(fqn)}")
        if type(entry) is md.BytesStorageMetadata:
            items.append(fqn)
            continue
        if type(entry) is not md.TensorStorageMetadata:
            raise CheckpointError(f"{what}: {short(fqn)} is {short(entry)}, not a storage")
        properties = vars(entry).get("properties")
        kind = type(properties)
        known = f"{kind.__module__}.{kind.__qualname__}" in _dcp.BUILDERS  # TensorProperties
        dtype = vars(properties).get("dtype") if known else None
        if type(dtype) is not torch.dtype:
            raise CheckpointError(f"{what}: {short(fqn)}'s dtype is {short(dtype)}")
        size = vars(entry).get("size")
        shape = check_shape(
            tuple(size) if isinstance(size, tuple) else size, f"{what}: {short(fqn)}", "size"
        )
        count(shape, f"{what}: {short(fqn)}")
        tensors.append((fqn, str(dtype).replace("torch.", ""), shape))
    storage = vars(metadata).get("storage_data")  # a storage plugin's own: FileSystemWriter's
    files = set()  # is a dict of _StorageInfo; other shapes list no data files
    for info in storage.values() if type(storage) is dict else ():
        if type(info) is filesystem._StorageInfo:
            path = vars(info).get("relative_path")
            if type(path) is not str:
                raise CheckpointError(f"{what}: a storage_data entry's file is {short(path)}")
            files.add(path)
    ranks = {m.group(1) for m in map(_DATA_FILE.fullmatch, files) if m is not None}
    version = vars(metadata).get("version")
    info = DcpInfo(
        world_size=len(ranks) or None,
        data_files=tuple(sorted(files)),
        items=tuple(items),
        version=version if type(version) is str else None,
    )
    return info, tensors


def load_folder_metadata(folder: Any) -> Any:
    """The Metadata of a DCP folder (path), read safely; UnsafeCheckpointError on refusal."""
    path = os.path.join(folder, METADATA)
    with open_regular(path, path) as file:
        return read_metadata(file)


def ranks_on_disk(folder: Any) -> tuple[int | None, tuple[str, ...]]:
    files = sorted(n for n in os.listdir(folder) if n.endswith(".distcp"))
    ranks = {m.group(1) for m in map(_DATA_FILE.fullmatch, files) if m is not None}
    return len(ranks) or None, tuple(files)


def data_problems(folder: str, places: Iterable[tuple[Any, Any, Any]]) -> dict[str, str]:
    """Each data file the ``(relative_path, offset, length)`` places name that is missing, no
    regular file, or shorter than what it places in it, and why (``"data file X: why"``):
    ``dcp.load`` fails there (a copy or a sync that stopped half way, a rank's file lost).
    Checked by size: nothing is read; fields of another type are not judged here."""
    ends: dict[str, int] = {}
    for file, offset, length in places:
        if type(file) is str and type(offset) is int and type(length) is int and offset >= 0:
            ends[file] = max(ends.get(file, 0), offset + max(length, 0))
    problems = {}
    for file, end in sorted(ends.items()):
        label = f"data file {short(file, 200)}"
        try:
            found = os.stat(os.path.join(folder, file))
        except (OSError, ValueError) as exc:
            problems[file] = f"{label}: {plain_text(exc)}"
            continue
        if not stat.S_ISREG(found.st_mode):
            problems[file] = f"{label}: not a regular file"
        elif found.st_size < end:
            problems[file] = (
                f"{label}: {found.st_size} bytes, where .metadata places data up to byte {end} "
                "(cut short: an interrupted copy or save?)"
            )
    return problems
