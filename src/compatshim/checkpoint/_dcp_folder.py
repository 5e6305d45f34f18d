"""torch.distributed.checkpoint (DCP) folders: the ``.metadata`` file read safely, and summed up.

The file is a pickle, read by ``load``'s machine with the handlers of ``_dcp``.
Used by the ``torch-dcp-safe-metadata`` patch (hardened mode) and by ``inspect``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import IO, Any

from ._container import read, sniff
from .errors import CheckpointError

METADATA = ".metadata"


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


def ranks_on_disk(folder: Any) -> tuple[int | None, tuple[str, ...]]:
    files = sorted(n for n in os.listdir(folder) if n.endswith(".distcp"))
    ranks = {m.group(1) for m in map(_DATA_FILE.fullmatch, files) if m is not None}
    return len(ranks) or None, tuple(files)
