"""safetensors files: the header checked whole before any tensor byte is read.

Layout: an 8-byte little-endian header length N, N bytes of UTF-8 JSON
(``{"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]},
"__metadata__": {str: str}}``), then the data section. Checked in this order:
N against the file size and ``MAX_HEADER`` (the ``safetensors`` package's own
cap) before N bytes are read; the JSON's nesting depth before it is parsed;
duplicate keys while it is parsed; then every dtype (known names only), shape
(non-negative ints, product within int64), and ``data_offsets`` (sorted, they
tile the data section exactly, as the ``safetensors`` reader requires, so no
two tensors overlap and no byte lies outside one). Only then is the data
section read (or mmapped). Nothing here runs code from the file; torch is
imported only by :func:`load`.

``load`` returns what ``torch.load`` returns for a ``.safetensors`` path
(``safetensors.torch.load_file``): a dict of name -> tensor, in data-offset
order, each tensor with its own storage, metadata dropped. Unlike torch,
files are recognised by content, not by suffix, and ``map_location`` takes
every form ``torch.load`` takes for its own formats (the saved location is
"cpu").
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from typing import IO, Any, Callable

from .._text import cut, short
from ._dtypes import BY_SAFETENSORS as DTYPES
from ._limits import check_shape, count
from .errors import CheckpointError

MAX_HEADER = 100_000_000
MAX_PASSES = 4  # each removes >= 1 bracket level; a header needs 2 ({ {[]} }), 2 spare

# A string, or an unclosed one up to the end: the star always stops where its tail matches,
# so no start fails after scanning to the end (``"(...)*"`` alone is quadratic on
# ``{"a\"\"\"...`` unclosed: every later quote starts another scan to the end).
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*(?:"|\\?\Z)', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def looks_like(head: bytes) -> bool:
    """8-byte length below 2**48 (no pickle or zip starts so), then the JSON's opening brace."""
    return len(head) >= 9 and head[8:9] == b"{" and head[6:8] == b"\0\0"


@dataclass(frozen=True)
class Entry:
    name: str
    dtype: str  # the file's name, e.g. "BF16"
    shape: tuple[int, ...]
    begin: int  # within the data section
    end: int

    @property
    def torch_dtype(self) -> str:
        """torch's name for the dtype where it has one (the report uses these), else the file's."""
        return DTYPES[self.dtype].torch or self.dtype


@dataclass(frozen=True)
class Header:
    entries: tuple[Entry, ...]  # in data-offset order
    metadata: dict[str, str] | None
    data_start: int
    data_size: int


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for key, value in pairs:
        if key in found:
            raise CheckpointError(
                f"safetensors header names {short(key)} twice: readers disagree on which counts"
            )
        found[key] = value
    return found


def _no_constant(name: str) -> Any:
    raise CheckpointError(f"safetensors header holds {name}, which JSON does not allow")


def _label(name: str) -> str:
    return f"safetensors tensor {short(name)}"


def _text(value: Any, what: str) -> str:
    if type(value) is not str:
        raise CheckpointError(f"safetensors {what} is a {type(value).__name__}, not a string")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise CheckpointError(f"safetensors {what} holds a lone surrogate") from None
    return value


def _entry(name: str, info: Any, data_size: int) -> Entry:
    if type(info) is not dict:
        raise CheckpointError(f"{_label(name)}: its header entry is not an object")
    dtype = info.get("dtype")
    if type(dtype) is not str or dtype not in DTYPES:
        raise CheckpointError(f"{_label(name)}: unknown dtype {short(dtype)}")
    dims = check_shape(info.get("shape"), _label(name), kinds=(list,))
    offsets = info.get("data_offsets")
    if (
        type(offsets) is not list
        or len(offsets) != 2
        or not all(type(o) is int for o in offsets)
        or not 0 <= offsets[0] <= offsets[1] <= data_size
    ):
        raise CheckpointError(
            f"{_label(name)}: data_offsets are not two ints within the {data_size}-byte data"
        )
    numel = count(dims, _label(name))
    bits = numel * DTYPES[dtype].bits
    if bits % 8 or bits // 8 != offsets[1] - offsets[0]:
        raise CheckpointError(
            f"{_label(name)}: {numel} x {dtype} is {bits / 8:g} bytes, its data_offsets hold "
            f"{offsets[1] - offsets[0]}"
        )
    return Entry(name, dtype, dims, offsets[0], offsets[1])


def _parse(file: IO[bytes], length: int) -> Any:
    """The JSON, after a linear check that it nests no deeper than a header does."""
    raw = file.read(length)
    if len(raw) != length:
        raise CheckpointError("safetensors header ends early")
    brackets = _STRING.sub(b"", raw).translate(None, _NOT_BRACKETS)
    for _ in range(MAX_PASSES):
        brackets = brackets.replace(b"[]", b"").replace(b"{}", b"")
    if brackets:
        raise CheckpointError("safetensors header is nested too deeply or unbalanced")
    try:
        text = raw.decode("utf-8")
        del raw  # parsing holds up to ~32x the header in objects (tiny metadata entries;
        # ~18x zero-size tensors; the safetensors library's reader alike): not these bytes too
        return json.loads(text, object_pairs_hook=_pairs, parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise CheckpointError(f"safetensors header is not JSON ({cut(str(exc), 120)})") from None


def read_header(file: IO[bytes]) -> Header:
    """The checked header of the file from its position on; leaves it at the data section."""
    start = file.tell()
    size = file.seek(0, 2) - start
    file.seek(start)
    head = file.read(8)
    if len(head) != 8:
        raise CheckpointError("safetensors file shorter than its 8-byte header length")
    length = int.from_bytes(head, "little")
    if length > MAX_HEADER or 8 + length > size:
        raise CheckpointError(
            f"safetensors header claims {length} bytes; the file holds {size - 8} after the "
            f"length and headers are capped at {MAX_HEADER}"
        )
    parsed = _parse(file, length)
    if type(parsed) is not dict:
        raise CheckpointError(f"safetensors header is a JSON {type(parsed).__name__}, not object")
    metadata = parsed.pop("__metadata__", None)
    if metadata is not None:
        if type(metadata) is not dict:
            raise CheckpointError("safetensors __metadata__ is not an object of strings")
        for key, value in metadata.items():
            _text(key, "metadata key")
            _text(value, "metadata value")
    data_start = start + 8 + length
    data_size = size - 8 - length
    entries = sorted(
        (_entry(_text(name, "tensor name"), info, data_size) for name, info in parsed.items()),
        key=lambda e: (e.begin, e.end),
    )
    reached = 0
    for entry in entries:
        if entry.begin != reached:
            problem = "overlaps the tensor before it" if entry.begin < reached else "leaves a gap"
            raise CheckpointError(
                f"{_label(entry.name)} at bytes {entry.begin}..{entry.end} "
                f"{problem} (tensors must tile the data section)"
            )
        reached = entry.end
    if reached != data_size:
        raise CheckpointError(
            f"safetensors data section holds {data_size} bytes, its tensors cover {reached}"
        )
    file.seek(data_start)
    return Header(tuple(entries), metadata, data_start, data_size)


def read_into(file: IO[bytes], view: memoryview) -> int:
    """Bytes of ``file`` read into ``view`` (in chunks where the file has no ``readinto``):
    as many as it holds, fewer only where the file ends first. One copy, where ``read``
    and a copy would make two; zip storages are read so too."""
    readinto = getattr(file, "readinto", None)
    got = 0
    while got < len(view):
        if readinto is not None:  # all of it at once, most often
            count = readinto(view[got:] if got else view)
        else:
            chunk = file.read(min(len(view) - got, 1 << 24))
            count = len(chunk)
            view[got : got + count] = chunk
        if not count:
            break
        got += count
    return got


def read_exactly(file: IO[bytes], size: int) -> bytearray:
    """Exactly ``size`` bytes into one buffer (:func:`read_into`); the legacy format's
    storages are read so too."""
    buffer = bytearray(size)
    if read_into(file, memoryview(buffer)) != size:
        raise CheckpointError("the data ends early")
    return buffer


def load(
    file: IO[bytes], path: str | None, restore: Callable[[Any, str], Any], mmap: bool
) -> dict[str, Any]:
    """Name -> tensor, as ``safetensors.torch.load_file``; each saved location is "cpu"."""
    try:
        import torch
    except ImportError:  # the cause, not "damaged or unsupported file (ModuleNotFoundError...)"
        raise CheckpointError("its tensors need torch, which is not installed") from None

    header = read_header(file)
    dtypes = {}
    for entry in header.entries:
        torch_name = DTYPES[entry.dtype].torch
        dtype = getattr(torch, torch_name, None) if torch_name else None
        if dtype is None:
            raise CheckpointError(
                f"{_label(entry.name)}: dtype {entry.dtype} has no torch "
                f"dtype in torch {torch.__version__}"
            )
        if entry.dtype == "F4" and (not entry.shape or entry.shape[-1] % 2):
            raise CheckpointError(
                f"{_label(entry.name)}: F4 needs an even last dimension (torch packs two per byte)"
            )
        dtypes[entry.name] = dtype
    if mmap:
        if path is None:
            raise CheckpointError("mmap=True needs a file path, not a file object")
        whole = torch.UntypedStorage.from_file(path, False, header.data_start + header.data_size)
        data = whole[header.data_start :]
    elif header.data_size:
        data = torch.frombuffer(read_exactly(file, header.data_size), dtype=torch.uint8)
        data = data.untyped_storage()
    else:
        data = torch.empty(0, dtype=torch.uint8).untyped_storage()
    swap = sys.byteorder == "big"
    out: dict[str, Any] = {}
    empty: Any = torch.empty
    for entry in header.entries:
        dtype = dtypes[entry.name]
        untyped = data[entry.begin : entry.end]
        if swap and dtype.itemsize > 1:
            untyped.byteswap(dtype)
        untyped = restore(untyped, "cpu")
        shape = (*entry.shape[:-1], entry.shape[-1] // 2) if entry.dtype == "F4" else entry.shape
        out[entry.name] = empty(0, dtype=dtype, device=untyped.device).set_(untyped, 0, shape)
    return out
