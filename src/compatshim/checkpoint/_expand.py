"""Compressed bytes read bounded: a DCP item through its stream transforms (zstd, torch
2.8+), an ``.npz`` member or a gzip stream hardened ``numpy.load`` reads.

torch reads a transformed item whole (``io.BytesIO(transform_from.read(-1))``), so a
small frame that expands without end (33 KB of zstd: 1 GiB of zeros) costs what it
expands to; so did an ``.npz`` member's pickle (300 KB of deflate: 300 MB). Each reader here
(hardened ``dcp.load``, hardened ``numpy.load``, ``inspect``, the dry run) reads such bytes
through :class:`Bounded`: past its limit the read stops with CheckpointError.
"""

from __future__ import annotations

import io
from typing import IO, Any

from .._text import names, short
from ._container import plain_text
from ._limits import EXPANSION_PER_BYTE
from .errors import CheckpointError


def limit(stored: int, declared: int = 0) -> int:
    """The most bytes an item of ``stored`` bytes may expand to (``declared``: what
    ``.metadata`` says a tensor's item holds, which the template holds already)."""
    return EXPANSION_PER_BYTE * max(stored, 0) + max(declared, 0)


class Bounded(io.RawIOBase):
    """``stream`` read to at most ``most`` bytes; one more is CheckpointError naming ``what``
    (``how``: what expands it; ``also``: what else ``most`` counts)."""

    def __init__(
        self,
        stream: IO[bytes],
        most: int,
        what: str,
        how: str = "its stream transforms expand it",
        also: str = ", and a tensor's declared size",
    ) -> None:
        super().__init__()
        self._stream, self._most, self._got, self._what = stream, most, 0, what
        self._how, self._also = how, also

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        data = self._next(len(view))
        view[: len(data)] = data
        return len(data)

    def readall(self) -> bytes:  # torch's read(-1): in large steps, not 8 KiB ones
        parts = []
        while data := self._next(1 << 22):
            parts.append(data)
        return b"".join(parts)

    def _next(self, size: int) -> bytes:
        data: bytes = self._stream.read(min(size, self._most + 1 - self._got))
        self._got += len(data)
        if self._got > self._most:
            raise CheckpointError(
                f"{self._what}: {self._how} past {self._most} bytes (at most "
                f"{EXPANSION_PER_BYTE} per stored byte{self._also}): hardened mode reads no "
                "more; a file you trust loads without it"
            )
        return data


def transformed(view: IO[bytes], descriptors: Any, stored: int, what: str) -> IO[bytes]:
    """The non-tensor item ``view`` (``stored`` bytes) through the transforms its
    descriptors name, as torch's ``FileSystemReader`` reads it (torch's registry), read
    whole into memory, bounded by :func:`limit`."""
    from torch.distributed.checkpoint import filesystem

    if not (isinstance(descriptors, (list, tuple)) and all(type(t) is str for t in descriptors)):
        raise CheckpointError(f"{what}: transform descriptors {short(descriptors)} are not strings")
    made = getattr(filesystem, "_StorageReaderTransforms", None)
    if made is None:
        raise CheckpointError(f"{what}: this torch reads no DCP transforms ({short(descriptors)})")
    try:
        stream = made().transform_load_stream(None, descriptors, view)
        data = io.BytesIO(Bounded(stream, limit(stored), what).read())
    except CheckpointError:
        raise
    except Exception as exc:  # the extension's own (an unknown name, a damaged frame)
        raise CheckpointError(
            f"{what}: its transforms ({names(list(descriptors), 5)}) cannot read it "
            f"({type(exc).__name__}: {plain_text(exc)})"
        ) from None
    data.name = what  # type: ignore[attr-defined]  # what messages call it
    return data
