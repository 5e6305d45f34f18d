"""torch.distributed.checkpoint (DCP) folders: their ``.metadata`` read without running code.

torch writes a DCP folder's ``.metadata`` with plain ``pickle.dump`` and reads it
with ``pickle.load`` (any global, any code). Here it is read by ``load``'s machine,
pickles only, with the DCP rows of the allowlist: the dataclasses are filled
field by field, ``TensorProperties``' tuple state is checked here instead of its
``__setstate__`` running, and a ``torch.layout`` comes from a fixed set of names.
Used by the ``torch-dcp-safe-metadata`` patch (hardened mode) and by ``inspect``.
"""

from __future__ import annotations

import enum
import os
import re
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any, Callable

from ._container import read, sniff
from ._dtypes import BY_TORCH
from ._limits import check_shape
from .errors import CheckpointError

if TYPE_CHECKING:
    from ._inspect import CheckpointInfo

METADATA = ".metadata"
_TENSOR_PROPERTIES = (
    "torch.distributed.checkpoint.metadata.TensorProperties",
    "torch.distributed._shard.sharded_tensor.metadata.TensorProperties",
)
_ENCODINGS = {"_MEM_FORMAT_ENCODING", "MEM_FORMAT_ENCODING"}
_MEMORY_FORMATS = ("contiguous_format", "channels_last", "preserve_format")  # by encoding value
_LAYOUTS = frozenset(
    ("strided", "sparse_coo", "sparse_csr", "sparse_csc", "sparse_bsr", "sparse_bsc", "_mkldnn")
)


def layout(args: tuple[Any, ...]) -> Any:
    """``torch.serialization._get_layout(name)``: torch's own layout object of that name."""
    import torch

    name = args[0] if len(args) == 1 else None
    if type(name) is not str or not name.startswith("torch.") or name[6:] not in _LAYOUTS:
        raise CheckpointError("torch.serialization._get_layout: not a known torch.layout name")
    found = vars(torch).get(name[6:])
    if type(found) is not torch.layout:
        raise CheckpointError(f"torch.serialization._get_layout: {name} is not a layout here")
    return found


def build_tensor_properties(inst: Any, state: Any) -> None:
    """BUILD for ``TensorProperties``: what its ``__setstate__`` sets, from checked fields."""
    import torch

    if type(state) is not tuple or len(state) not in (5, 6):
        raise CheckpointError("TensorProperties state is not a tuple of 5 or 6 fields")
    dtype, kind, requires_grad, encoding, pin_memory = state[:5]
    strides = state[5] if len(state) == 6 else None
    if (
        type(dtype) is not torch.dtype
        or type(kind) is not torch.layout
        or type(requires_grad) is not bool
        or type(pin_memory) is not bool
        or not isinstance(encoding, enum.Enum)
        or type(encoding).__name__ not in _ENCODINGS
        or encoding.value not in (0, 1, 2)
    ):
        raise CheckpointError("TensorProperties state holds an unexpected field")
    if strides is not None:
        check_shape(strides, "TensorProperties", "strides")
    known = getattr(type(inst), "__dataclass_fields__", {})
    if strides is not None and "strides" not in known:
        raise CheckpointError(
            "TensorProperties state holds strides (a .metadata written by a newer torch, "
            f"2.14+); torch {torch.__version__}'s TensorProperties has no strides field, so "
            "this torch cannot read it (its own pickle.load fails on it too)"
        )
    fields = {
        "dtype": dtype,
        "layout": kind,
        "requires_grad": requires_grad,
        "memory_format": getattr(torch, _MEMORY_FORMATS[encoding.value]),
        "pin_memory": pin_memory,
    }
    if "strides" in known:
        fields["strides"] = strides
    object.__getattribute__(inst, "__dict__").update(fields)


BUILDERS = {name: build_tensor_properties for name in _TENSOR_PROPERTIES}
"""BUILD handlers by allowlist name, for classes whose state is not a dict of fields."""


def read_metadata(file: IO[bytes], allow: Any = ()) -> Any:
    """A DCP ``.metadata`` from an open binary file: a pickle, read by ``load``'s machine.

    Anything else (a torch zip file, safetensors) is refused: ``pickle.load`` would
    not read it either. Raises UnsafeCheckpointError naming the refused globals.
    """
    from ._load import ADVICE, Loader

    def reader(source: IO[bytes], what: str, path: str | None) -> Any:
        if sniff(source) != "pickle":
            raise CheckpointError(f"{what}: a DCP .metadata is a pickle; this file is not one")
        return Loader(None, allow, False).read(source, what, path)

    if not all(hasattr(file, a) for a in ("read", "seek", "tell")):
        raise TypeError("expected a seekable binary file object")
    return read(file, reader, ADVICE)


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


def describe(metadata: Any) -> tuple[DcpInfo, list[tuple[str, str, tuple[int, ...]]]]:
    """The folder summary and ``(fqn, dtype, shape)`` of each tensor, from a loaded Metadata."""
    state = getattr(metadata, "state_dict_metadata", None)
    if type(state) is not dict:
        raise CheckpointError(".metadata does not hold a DCP Metadata (no state_dict_metadata)")
    tensors, items = [], []
    for fqn, entry in state.items():
        properties = getattr(entry, "properties", None)
        size = getattr(entry, "size", None)
        if properties is None or size is None:
            items.append(str(fqn))
            continue
        dtype = str(getattr(properties, "dtype", "?")).replace("torch.", "")
        tensors.append((str(fqn), dtype, tuple(int(n) for n in size)))
    storage = getattr(metadata, "storage_data", None)
    files = sorted(
        {str(getattr(info, "relative_path", "")) for info in (storage or {}).values()} - {""}
    )
    ranks = {m.group(1) for m in map(_DATA_FILE.fullmatch, files) if m is not None}
    version = getattr(metadata, "version", None)
    info = DcpInfo(
        world_size=len(ranks) or None,
        data_files=tuple(files),
        items=tuple(items),
        version=version if type(version) is str else None,
    )
    return info, tensors


def load_folder_metadata(folder: Any) -> Any:
    """The Metadata of a DCP folder (path), read safely; UnsafeCheckpointError on refusal."""
    with open(os.path.join(folder, METADATA), "rb") as file:
        return read_metadata(file)


def _ranks_on_disk(folder: Any) -> tuple[int | None, tuple[str, ...]]:
    files = sorted(n for n in os.listdir(folder) if n.endswith(".distcp"))
    ranks = {m.group(1) for m in map(_DATA_FILE.fullmatch, files) if m is not None}
    return len(ranks) or None, tuple(files)


def inspect_folder(folder: Any, inspect_file: Callable[[Any], CheckpointInfo]) -> CheckpointInfo:
    """``inspect`` of a DCP folder: its ``.metadata``'s globals and verdict, then what it
    lists (FQNs, dtypes, shapes, ranks that wrote it, non-tensor items) when loadable."""
    from dataclasses import replace

    from ._inspect import NamedTensor

    path = os.fspath(folder)
    info = inspect_file(os.path.join(path, METADATA))
    world_size, files = _ranks_on_disk(path)
    unread = DcpInfo(world_size, files, (), None)
    if not info.loadable:
        return replace(info, path=path, container="dcp", dcp=unread)
    try:
        found, tensors = describe(load_folder_metadata(path))
    except CheckpointError as exc:
        refusals = (*info.refusals, str(exc))
        return replace(info, path=path, container="dcp", dcp=unread, refusals=refusals)
    dtypes: dict[str, int] = {}
    size = 0
    for _, dtype, shape in tensors:
        dtypes[dtype] = dtypes.get(dtype, 0) + 1
        numel = 1
        for n in shape:
            numel *= n
        known = BY_TORCH.get(dtype)  # an unknown dtype counts no bytes, as before
        size += numel * (known.torch_bytes if known is not None else 0)
    return replace(
        info,
        path=path,
        container="dcp",
        tensors=len(tensors),
        storages=len(found.data_files),
        tensor_bytes=size,
        dtypes=dict(sorted(dtypes.items())),
        named_tensors=tuple(NamedTensor(n, d, s) for n, d, s in tensors),
        dcp=found,
    )
