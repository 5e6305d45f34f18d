"""The format reader ``load`` and ``inspect`` share, so they never judge a file differently.

:func:`read` opens the file and is the one error boundary (behind the one entry,
``request.read``): only :class:`CheckpointError` / :class:`UnsafeCheckpointError` leave
it, naming the file; a refusal carries what was refused, and no advice (its caller's).
:func:`sniff` tells the container kind from the first bytes.

zip
    torch.save's zip format stores every record uncompressed under one folder
    (``archive/data.pkl``, ``archive/data/0`` ...). The directory is read with
    ``struct`` (headers only; zip64 too) and refused when it has duplicate or
    escaping names, compressed records, records past the end of the file, or is a
    TorchScript archive (``constants.pkl`` / ``code/``), which ``torch.load``
    would hand to ``torch.jit.load``.
storage ids
    every persistent id a pickle names is checked by :func:`declare_storage`
    (fields, key, location, size, legacy view) against every other declaration
    of its key; a zip storage's size is compared with its record.
symbolic pass
    :class:`ScanMachine`: what ``inspect`` reports, how ``load`` names every
    refused global at once, and how the legacy reader learns storage sizes.
legacy
    :func:`read_legacy`: the header pickles (protocol, system info) are read as
    plain values; the main pickle is run symbolically to learn every storage's
    size; the key list must name exactly those; the size written before each
    storage's bytes must match and fit in the bytes left.

Nothing here imports torch.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import io
import os
import re
import stat
import struct
import sys
from dataclasses import dataclass, field
from typing import IO, Any, Callable, Literal, NamedTuple, TypeVar

from .._text import cut, names, short
from . import _safetensors
from ._gate import ALLOWLIST, NOT_REBUILT, Verdict, judge
from ._machine import Machine, Source
from ._objects import GETATTR_NAME
from ._tensors import REBUILDS
from .allowlist import STORAGE_DTYPES, lookup, storage_type
from .errors import CheckpointError, UndecodableTextError, UnsafeCheckpointError, as_well

T = TypeVar("T")

Container = Literal["zip", "legacy", "pickle", "torchscript", "tar", "safetensors", "other"]
ZIP_MAGICS = (b"PK\x03\x04", b"PK\x05\x06")
LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
LEGACY_PROTOCOL = 1001
_PICKLE_FIRST_BYTES = frozenset(b"\x80(}]).NIJKLFGSTUVXcdlt")
_KEY = re.compile(r"[A-Za-z0-9_]{1,64}")
LOCATION = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,31}(:\d{1,5})?")


def describe_source(f: Any) -> str:
    if isinstance(f, (str, os.PathLike)):
        return os.fspath(f)  # type: ignore[return-value]
    return str(getattr(f, "name", None) or f"<{type(f).__name__}>")


def read(
    f: Any, reader: Callable[[IO[bytes], str, str | None], T], *, name: str | None = None
) -> T:
    """``reader(file, what, path)`` on the path or seekable binary file ``f``; every error
    but a missing path becomes CheckpointError / UnsafeCheckpointError naming ``what``
    (``name``, else the path or the file's ``.name``)."""
    what = describe_source(f) if name is None else name
    if isinstance(f, (str, os.PathLike)):
        with open_regular(f, what) as file:
            return _guarded(reader, file, what, os.fspath(f))
    if not (hasattr(f, "read") and hasattr(f, "seek") and hasattr(f, "tell")):
        raise TypeError("expected a path or a seekable binary file object")
    if isinstance(f, io.TextIOBase):  # read() gives str: "damaged (UnicodeDecodeError)" was said
        raise TypeError(f"{what}: a file opened in text mode; open it with open(path, 'rb')")
    stored = compressed_size(f)
    if stored is not None:  # a budget is a multiple of the bytes read: not of what inflates
        inner = reader

        def reader(file: IO[bytes], what: str, path: str | None) -> T:
            return inner(_inflated(file, stored, what), what, path)

    return _guarded(reader, f, what, None)


#: streams that inflate what they read (a file object of these, given to load or the hardened
#: torch.load, seeks by inflating: its size, so its budget, was what it inflates to)
_COMPRESSED = (("gzip", "GzipFile"), ("bz2", "BZ2File"), ("lzma", "LZMAFile"),
               ("zipfile", "ZipExtFile"))  # fmt: skip


def compressed_size(f: Any) -> int | None:
    """The bytes a compressed stream ``f`` reads from, or None: not such a stream, or its
    store cannot be measured (read as before). A zip member (an ``.npz`` member) claims its
    compressed size in the archive, which the file wrote: it is held to the size of the
    archive it lies in (a member claiming 4 GB of a 3 MB file); gzip, bz2 and lzma read
    from a file on disk or a ``BytesIO``. The hardened ``numpy.load`` asks too."""
    kinds = tuple(
        k for m, n in _COMPRESSED if isinstance(k := getattr(sys.modules.get(m), n, None), type)
    )
    if not kinds or not isinstance(f, kinds):
        return None
    claimed = getattr(f, "_orig_compress_size", None)  # zipfile.ZipExtFile
    if type(claimed) is int:
        return min(claimed, _archive_size(getattr(f, "_fileobj", None), claimed))
    under = getattr(f, "fileobj", None) or getattr(f, "_fp", None)  # gzip; bz2, lzma
    return stored_size(under) if under is not None else None


def _archive_size(shared: Any, claimed: int) -> int:
    """The size of the archive a zip member is read from (its ``_SharedFile``'s file: by
    ``fileno()``, a ``BytesIO``'s buffer, or a seek to its end under the ZipFile's lock, as
    ``_SharedFile`` itself seeks before each read); ``claimed`` where none of them tells."""
    archive = getattr(shared, "_file", None)
    if archive is None:
        return claimed
    size = stored_size(archive)
    lock = getattr(shared, "_lock", None)
    if size is None and lock is not None:
        try:
            with lock:
                here = archive.tell()
                size = archive.seek(0, 2)
                archive.seek(here)
        except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
            return claimed
    return claimed if type(size) is not int else size


def stored_size(file: Any) -> int | None:
    """The size of the file under ``file`` (``fileno()``'s, or a ``BytesIO``'s), if known."""
    if isinstance(file, io.BytesIO):
        return file.getbuffer().nbytes
    try:
        return os.fstat(file.fileno()).st_size
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return None


def _inflated(file: IO[bytes], stored: int, what: str) -> IO[bytes]:
    """The rest of the compressed stream ``file``, read once, at most ``EXPANSION_PER_BYTE``
    bytes per byte it is stored in (``_expand.Bounded``), as a stream of its own."""
    from ._expand import Bounded, limit

    data = io.BytesIO(Bounded(file, limit(stored), what, "it inflates", "").read())
    name = getattr(file, "name", None)
    if isinstance(name, str):
        data.name = name  # type: ignore[attr-defined]
    return data


def open_regular(path: Any, what: str, buffering: int = -1) -> IO[bytes]:
    """``path`` opened to read, if it is a regular file: a FIFO (a name in a downloaded
    folder) would block the open, then the read, forever; a device may never end. Opened
    without blocking and checked on the open file, so nothing swapped in after a check
    blocks either. A folder is IsADirectoryError (and CheckpointError) saying what reads it."""
    try:
        file = open(path, "rb", buffering=buffering, opener=_nonblocking)  # noqa: SIM115
    except IsADirectoryError:  # a DCP folder, most likely: say what reads it
        raise as_well(CheckpointError, IsADirectoryError)(_folder_given(what)) from None
    try:
        if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
            raise CheckpointError(f"{what}: not a regular file (a FIFO, a device or a socket)")
        if _NONBLOCK:
            os.set_blocking(file.fileno(), True)
        return file
    except BaseException:
        file.close()
        raise


_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


def _nonblocking(path: str, flags: int) -> int:
    return os.open(path, flags | _NONBLOCK)


def _folder_given(what: str) -> str:
    if os.path.isfile(os.path.join(what, ".metadata")):
        return (
            f"{what}: a DCP checkpoint folder, not a file: torch.distributed.checkpoint.load "
            "reads it (hardened with COMPATSHIM_SAFE_LOAD=1; compatshim.checkpoint.inspect "
            "judges it)"
        )
    return f"{what}: a folder, not a checkpoint file"


def _guarded(
    reader: Callable[[IO[bytes], str, str | None], T],
    file: IO[bytes],
    what: str,
    path: str | None,
) -> T:
    try:
        return reader(file, what, path)
    except UnsafeCheckpointError as exc:  # as_well: a type torch would raise is kept
        unsafe = as_well(UnsafeCheckpointError, type(exc))
        raise unsafe(_prefixed(str(exc), what), exc.refused) from None
    except UndecodableTextError as exc:  # UnicodeDecodeError too: a caller's retry catches it
        raise UndecodableTextError(exc, _prefixed(str(exc), what)) from None
    except CheckpointError as exc:
        raise as_well(CheckpointError, type(exc))(_prefixed(str(exc), what)) from None
    except RecursionError:
        raise CheckpointError(f"{what}: nested too deeply to load") from None
    except MemoryError:
        raise CheckpointError(f"{what}: not enough memory for what the file holds") from None
    except Exception as exc:
        raise CheckpointError(
            f"{what}: damaged or unsupported file ({type(exc).__name__}: {plain_text(exc)})"
        ) from None


def plain_text(exc: BaseException) -> str:
    """An exception's message only when every argument is a short string: ``str(KeyError(x))``
    is ``repr(x)``, and ``x`` may be a file value whose text is exponential in its size."""
    if all(type(arg) is str for arg in exc.args):
        return cut(str(exc), 300)
    if isinstance(exc, OSError) and type(exc.strerror) is str:  # errno is an int: say it
        name = exc.filename if type(exc.filename) is str else None
        return cut(exc.strerror + (f": {name}" if name else ""), 300)
    return "message not shown: it holds values from the file"


def _prefixed(message: str, what: str) -> str:
    return message if message.startswith(what) else f"{what}: {message}"


def sniff(file: IO[bytes]) -> Container:
    """The container kind from the first bytes ("pickle" may still turn out legacy)."""
    here = file.tell()
    head = file.read(512)
    size = file.seek(0, 2) - here
    file.seek(here)
    if head[:4] in ZIP_MAGICS:
        return "zip"
    if _safetensors.looks_like(head) and (
        8 + int.from_bytes(head[:8], "little") <= size or head[0] not in _PICKLE_FIRST_BYTES
    ):
        return "safetensors"  # a pickle may start so, but then its "length" exceeds the file
    if len(head) >= 262 and head[257:262] == b"ustar":
        return "tar"
    if head and head[0] in _PICKLE_FIRST_BYTES:
        return "pickle"
    return "other"


class Record(NamedTuple):  # one per zip record: cheaper to make than a frozen dataclass
    name: str
    size: int
    offset: int  # of its local header, from the start of the file (not of the archive)


class ZipDirectory(NamedTuple):  # made once per load: a tuple, as Record
    """The records of a torch zip file, by name without the archive folder."""

    archive: str
    records: dict[str, Record]
    is_torchscript: bool  # a ``constants.pkl`` or ``code/`` record: TorchScript, not torch.save
    has_storages: bool  # a ``data/`` record

    def record(self, name: str, what: str) -> Record:
        found = self.records.get(name)
        if found is None:
            raise CheckpointError(f"{what}: the zip has no record {self.archive}/{name}")
        return found

    def storage_record(self, decl: StorageDecl, what: str) -> Record:
        """The record of a declared storage, holding exactly the bytes it declares."""
        record = self.record(f"data/{decl.key}", what)
        if record.size != decl.nbytes:
            raise CheckpointError(
                f"{what}: storage {decl.key} declares {decl.nbytes} bytes ({decl.numel} x "
                f"{decl.dtype}), its record holds {record.size}"
            )
        return record


def read_zip_directory(file: IO[bytes], what: str) -> ZipDirectory:
    """Headers only; raises CheckpointError / UnsafeCheckpointError on anything odd.

    The archive starts where ``file`` stands (as for torch's reader: a file object may
    hold other data first, e.g. a ``pickle.dump`` before ``torch.save``); offsets in it
    count from there, and ``file`` is left there.
    """
    base = file.tell()
    size = file.seek(0, 2) - base
    try:
        found = _central_directory(file, base, size, what)
    finally:
        file.seek(base)
    all_names, records, odd, unordered = found
    if not all_names:
        raise CheckpointError(f"{what}: the zip file holds no records")
    joined = "\0" + "\0".join(all_names) + "\0"
    if joined.count("\0") != len(all_names) + 1:  # zipfile cuts a name at NUL, miniz does not
        name = next(name for name in all_names if "\0" in name)
        raise CheckpointError(
            f"{what}: not a readable zip file (record name {short(name)} holds a NUL character)"
        )
    if len(records) != len(all_names) and len(set(all_names)) != len(all_names):
        counts = collections.Counter(all_names)
        duplicates = sorted(name for name, count in counts.items() if count > 1)
        raise UnsafeCheckpointError(
            f"{what}: zip records with the same name ({names(duplicates, 5)}): readers "
            "disagree on which one counts",
            tuple(f"duplicate zip record {cut(n)}" for n in duplicates[:5]),
        )
    first = all_names[0]
    if "/" not in first and "\\" not in first and first not in _BAD_PARTS:
        raise CheckpointError(  # torch's reader refuses it as well: the first record's folder
            f"{what}: not a torch zip checkpoint: its first record {short(first)} lies in no "
            "folder, where torch keeps every record in one (a numpy .npz, another zip?)"
        )
    archive = first.split("/", 1)[0]
    prefix = archive + "/"
    if (
        not archive  # an absolute name
        or joined.count("\0" + prefix) != len(all_names)
        or _OUTSIDE.search(joined)
    ):
        for name in all_names:
            rest = name[len(prefix) :].split("/")
            if (
                not archive
                or not name.startswith(prefix)
                or "\\" in name
                or not _BAD_PARTS.isdisjoint(rest)
            ):
                raise UnsafeCheckpointError(
                    f"{what}: zip record name {short(name)} is outside the archive folder "
                    f"{short(archive)} (torch files keep every record in one folder)",
                    (f"zip record {cut(name, 80)}",),
                )
    directory = _directory(  # found in the joined names, in C, not by a loop over them
        (
            archive,
            records,
            "constants.pkl" in records or f"\0{prefix}code/" in joined,
            f"\0{prefix}data/" in joined,
        )
    )
    if directory.is_torchscript:
        return directory  # refused by the caller; its code records are compressed
    if odd:  # named in the central directory's order
        for name, method, packed, file_size, offset in odd:
            if method != _STORED or packed != file_size:
                raise CheckpointError(
                    f"{what}: zip record {name!r} is compressed (torch never does)"
                )
            if offset + file_size > size:
                raise CheckpointError(f"{what}: zip record {name!r} runs past the end of the file")
    if "data.pkl" not in records:
        raise CheckpointError(f"{what}: a zip file without {archive}/data.pkl is no torch file")
    if unordered:  # out of order, or one record starts before the last one ends
        placed = [(r.offset - base, r.size, r.name) for r in records.values()]
        _refuse_overlaps(sorted(placed), what)  # names the two
    return directory


def _refuse_overlaps(placed: list[tuple[int, int, str]], what: str) -> None:
    """Each record, by local header offset, must end (at the least, a bare local header and its
    bytes) before the next begins, as every zip writer lays them out: records that share
    bytes let a small file read one large record many times (1.27 MB in, +1.5 GB out)."""
    for (offset, size, name), (following, _, other) in zip(placed, placed[1:]):
        if following < offset + _LOCAL.size + size:
            raise UnsafeCheckpointError(
                f"{what}: zip records {short(name)} and {short(other)} overlap in the file "
                "(one stored record read as many): no zip writer lays records out so",
                (f"overlapping zip record {cut(other, 80)}",),
            )


# The zip directory, read with struct (APPNOTE 4.3; what zipfile.ZipFile reads, without
# building a ZipFile and a ZipInfo per record: a third of load's fixed cost). Where zip
# readers could disagree (torch's miniz reads the central directory where the end record
# points and counts its entries; zipfile walks it by size and shifts it by any bytes that
# are not where the end record says), the file is refused instead.
_STORED = 0
_END = struct.Struct("<4s4H2LH")  # end of central directory record
_END64_LOCATOR = struct.Struct("<4sLQL")
_END64 = struct.Struct("<4sQ2H2L4Q")  # zip64 end of central directory record (no extension)
_ENTRY = struct.Struct("<4s4B4HL2L5H2L")  # central directory file header
_U16_PAIR = struct.Struct("<HH")
_U64 = struct.Struct("<Q")
_MAX_COMMENT = 0xFFFF
_UTF8_NAME = 0x800  # general purpose flag bit 11: the name is UTF-8 (else cp437)
_MAX_EXTRACT_VERSION = 63  # zipfile's: 6.3
_ZIP64_EXTRA = 0x0001
_MASK32 = 0xFFFFFFFF
_BAD_PARTS = frozenset(("", ".", ".."))  # in a record's path inside the archive folder
# the same, and a backslash, found at once in the names joined with NUL (names hold none)
_OUTSIDE = re.compile(r"/\.{0,2}[/\0]|\\")
_record = functools.partial(tuple.__new__, Record)  # Record(...) without its Python __new__
_directory = functools.partial(tuple.__new__, ZipDirectory)

_LOCAL = struct.Struct("<4s5H3L2H")  # local file header


def seek_record(file: IO[bytes], record: Record, what: str) -> None:
    """``file`` at a stored record's first byte, found through its local header as torch's
    reader (miniz) finds it: after the header's own name and extra field."""
    file.seek(record.offset)
    head = file.read(_LOCAL.size)
    if len(head) != _LOCAL.size or head[:4] != b"PK\x03\x04":
        raise CheckpointError(f"{what}: zip record {short(record.name)} has no local header")
    name_length, extra_length = _U16_PAIR.unpack_from(head, 26)
    file.seek(record.offset + _LOCAL.size + name_length + extra_length)


def past_end(record: Record, what: str) -> CheckpointError:
    return CheckpointError(f"{what}: zip record {short(record.name)} runs past the file's end")


def read_record(file: IO[bytes], record: Record, what: str) -> bytes:
    """A stored record's bytes (:func:`seek_record`)."""
    seek_record(file, record, what)
    data = file.read(record.size)
    if len(data) != record.size:
        raise past_end(record, what)
    return data


# (name, compression method, compressed size, size, local header offset)
_Entry = tuple[str, int, int, int, int]


def _central_directory(
    file: IO[bytes], base: int, size: int, what: str
) -> tuple[list[str], dict[str, Record], list[_Entry], bool]:
    """The central directory read in one pass (CheckpointError when it cannot be read):
    every name in order, the records by name inside the first name's folder (the caller
    refuses names outside it), the entries compressed or running past the end, and
    whether any record starts before the one listed before it ends (the caller sorts and
    looks for overlaps only then). ``size`` bytes from ``base`` are the archive; offsets
    count from ``base``, the records' from the file's start.
    """

    def damaged(why: str) -> CheckpointError:
        return CheckpointError(f"{what}: not a readable zip file ({why})")

    if size < _END.size:
        raise damaged("File is not a zip file")
    end_at = size - _END.size
    file.seek(base + end_at)
    tail = file.read(_END.size)
    if tail[:4] != b"PK\x05\x06" or tail[-2:] != b"\0\0":  # an archive comment: search for it
        back = min(size, _MAX_COMMENT + _END.size)
        file.seek(base + size - back)
        data = file.read(back)
        found = data.rfind(b"PK\x05\x06")
        if found < 0 or found + _END.size > len(data):
            file.seek(base)
            if file.read(4) == b"PK\x03\x04":  # a zip's start, no end: the save was cut
                raise damaged(
                    "it starts as one but has no end record: cut short, by an interrupted "
                    "save or copy?"
                )
            raise damaged("File is not a zip file")
        end_at = size - back + found
        tail = data[found : found + _END.size]
    _, disk, cd_disk, _, count, cd_size, cd_offset, _ = _END.unpack(tail)
    records_end = end_at  # where the central directory must end
    if end_at >= _END64_LOCATOR.size:
        file.seek(base + end_at - _END64_LOCATOR.size)
        locator = file.read(_END64_LOCATOR.size)
        if locator[:4] == b"PK\x06\x07":  # zip64: its end record just before the locator
            _, disk64, _, disks = _END64_LOCATOR.unpack(locator)
            if disk64 != 0 or disks > 1:
                raise damaged("zipfiles that span multiple disks are not supported")
            records_end = end_at - _END64_LOCATOR.size - _END64.size
            head = b""
            if records_end >= 0:
                file.seek(base + records_end)
                head = file.read(_END64.size)
            if head[:4] != b"PK\x06\x06":  # miniz would look where the locator points
                raise damaged("its zip64 end record is not before its locator")
            wide = _END64.unpack(head)
            disk, cd_disk, count, cd_size, cd_offset = wide[4], wide[5], *wide[7:10]
    if disk != 0 or cd_disk != 0:
        raise damaged("zipfiles that span multiple disks are not supported")
    if cd_offset + cd_size != records_end:
        raise damaged("its central directory is not where its end record says")
    if count > cd_size // _ENTRY.size:
        raise damaged(f"its end record counts {count} entries, its central directory is smaller")
    file.seek(base + cd_offset)
    directory = file.read(cd_size)
    if len(directory) != cd_size:
        raise damaged("truncated central directory")
    all_names: list[str] = []
    records: dict[str, Record] = {}
    odd: list[_Entry] = []
    unordered, end, skip, local = False, 0, -1, _LOCAL.size
    unpack = _ENTRY.unpack_from
    header = _ENTRY.size
    position = 0
    while position < cd_size:
        if position + header > cd_size:
            raise damaged("truncated central directory")
        (sig, _, _, extract_version, _, flags, method, _, _, _, compressed, file_size, name_len,
         extra_len, comment_len, _, _, _, offset) = unpack(directory, position)  # fmt: skip
        if sig != b"PK\x01\x02":
            raise damaged("Bad magic number for central directory")
        if extract_version > _MAX_EXTRACT_VERSION:
            raise damaged(f"zip file version {extract_version / 10:.1f}")
        start = position + header
        position = start + name_len + extra_len + comment_len
        if position > cd_size:
            raise damaged("truncated central directory")
        raw = directory[start : start + name_len]
        try:
            name = raw.decode("utf-8" if flags & _UTF8_NAME else "cp437")
        except UnicodeDecodeError:
            raise damaged(f"undecodable record name {short(raw)}") from None
        if extra_len:
            extra = directory[start + name_len : start + name_len + extra_len]
            file_size, compressed, offset = _zip64_sizes(extra, file_size, compressed, offset)
        if skip < 0:  # the first name: its folder is the archive's
            skip = name.find("/") + 1
        all_names.append(name)
        records[name[skip:]] = _record((name, file_size, base + offset))
        if method or compressed != file_size or offset + file_size > size:
            odd.append((name, method, compressed, file_size, offset))
        if offset < end:
            unordered = True
        end = offset + local + file_size
    if len(all_names) != count:
        raise damaged(
            f"its end record counts {count} entries, its central directory holds {len(all_names)}"
        )
    return all_names, records, odd, unordered


def _zip64_sizes(
    extra: bytes, file_size: int, compressed: int, offset: int
) -> tuple[int, int, int]:
    """Sizes and offset, their zip64 values where the 32-bit fields say so (zipfile's rules:
    every extra field must fit, the zip64 one must hold each value asked of it, in order).
    Walked by position, never re-sliced: linear in the field's length."""
    field = 0
    while field + 4 <= len(extra):
        kind, length = _U16_PAIR.unpack_from(extra, field)
        end = field + 4 + length
        if end > len(extra):
            raise CheckpointError(f"not a readable zip file (corrupt extra field {kind:04x})")
        if kind == _ZIP64_EXTRA:
            at = field + 4
            values = []
            for value in (file_size, compressed, offset):
                if value == _MASK32:
                    if at + 8 > end:
                        raise CheckpointError("not a readable zip file (corrupt zip64 extra field)")
                    value = _U64.unpack_from(extra, at)[0]
                    at += 8
                values.append(value)
            file_size, compressed, offset = values
        field = end
    return file_size, compressed, offset


def refuse_torchscript(what: str) -> UnsafeCheckpointError:
    """A RuntimeError too: torch's weights-only load raises one for the same file, which code
    catches to fall back to ``torch.jit.load`` (its own choice of trust)."""
    return as_well(UnsafeCheckpointError, RuntimeError)(
        f"{what} is a TorchScript archive (torch.jit.save): torch.load would pass it to "
        "torch.jit.load, which runs the scripted code (e.g. __setstate__); compatshim never "
        "does. Load it with torch.jit.load only if you trust it.",
        ("TorchScript archive",),
    )


# --------------------------------------------------------------------------- storage ids


class StorageDecl(NamedTuple):
    """A storage as a persistent id declares it (no data read); ``view`` is a legacy
    ``(key, offset, size)`` in elements. (A named tuple: one is made per storage, and a
    frozen dataclass costs three times as much to make.)"""

    key: str
    type_name: str  # a STORAGE_DTYPES key
    numel: int
    location: str
    view: tuple[str, int, int] | None = None

    @property
    def dtype(self) -> str:
        return STORAGE_DTYPES[self.type_name][0]

    @property
    def item_size(self) -> int:
        return STORAGE_DTYPES[self.type_name][1]

    @property
    def nbytes(self) -> int:
        return self.numel * self.item_size


def declare_storage(
    declared: dict[str, StorageDecl], type_name: str | None, rest: tuple[Any, ...], legacy: bool
) -> StorageDecl:
    """``("storage", type, *rest)`` checked, and the same as every earlier id of its key.

    zip: ``rest`` is (key, location, numel); legacy: (key, location, numel, view).
    ``type_name`` is the storage type the id's global names through the allowlist.
    """
    fields = 4 if legacy else 3
    if len(rest) != fields:
        raise CheckpointError(f"a storage id has {len(rest) + 2} fields, not {fields + 2}")
    key, location, numel = rest[:3]
    key, location = _ascii(key), _ascii(location)  # Python 2 str read with encoding="bytes"
    if type(key) is not str or not _KEY.fullmatch(key):
        raise CheckpointError(f"storage key {short(key)} is malformed")
    if type_name is None:
        raise CheckpointError(f"storage {key} does not name a storage type")
    if type(location) is not str or (location != "cpu" and not LOCATION.fullmatch(location)):
        raise CheckpointError(f"storage {key}: location {short(location)} is not a device name")
    if type(numel) is not int or numel < 0:
        raise CheckpointError(f"storage {key}: size {short(numel)} is not a count")
    view = rest[3] if legacy else None
    if view is not None:
        if type(view) is not tuple or len(view) != 3:
            raise CheckpointError(f"storage {key}: legacy view is malformed")
        view_key, offset, size = view
        view_key = _ascii(view_key)
        if type(view_key) is not str or type(offset) is not int or type(size) is not int:
            raise CheckpointError(f"storage {key}: legacy view is malformed")
        if offset < 0 or size < 0 or offset + size > numel:
            raise CheckpointError(f"storage {key}: legacy view reaches past the storage")
    decl = StorageDecl(key, type_name, numel, location, view)
    known = declared.setdefault(key, decl)
    if (known.type_name, known.numel) != (type_name, numel) and (known.numel or numel):
        # an empty storage may be named with several types: torch.save writes one key for
        # an empty tensor and a TypedStorage of another dtype over its storage (no bytes
        # to disagree on; torch refuses to save any other type clash)
        raise CheckpointError(f"storage {key} declared twice with different types or sizes")
    return decl


def _ascii(value: Any) -> Any:
    """Bytes as ASCII text, as torch's ``_maybe_decode_ascii`` reads a storage id's fields."""
    return value.decode("ascii", "replace") if type(value) is bytes else value


# --------------------------------------------------------------------------- legacy files


@dataclass(frozen=True)
class Legacy:
    """A legacy file's layout: its main pickle, what it names, where each storage's bytes are."""

    main: int
    found: ScanResult  # of the main pickle
    offsets: dict[str, int]


def read_legacy(file: IO[bytes], encoding: str = "utf-8") -> Legacy:
    """The rest of a legacy file after its magic number (see the module docstring);
    leaves the file at the main pickle. ``encoding``: Python 2 ``str`` in its pickles but
    the system info and the key list (their own records: ASCII names)."""
    source = Source(file)
    protocol = ScanMachine(source, encoding=encoding).run()
    if type(protocol) is not int or protocol != LEGACY_PROTOCOL:
        raise CheckpointError(f"legacy torch file with protocol version {short(protocol)}")
    info = ScanMachine(source).run()
    if type(info) is not dict or info.get("little_endian") is not True:
        raise CheckpointError(
            "legacy torch file written on a big-endian machine or without system info"
        )
    main = file.tell()
    scanner = ScanMachine(source, "legacy", encoding)
    scanner.run()
    declared = scanner.found.storages
    keys = ScanMachine(source).run()
    if type(keys) is not list or not all(type(k) is str for k in keys):
        raise CheckpointError("legacy storage key list is malformed")
    if sorted(keys) != sorted(declared) or len(set(keys)) != len(keys):
        unknown = scanner.found.unknown_storages
        if unknown and unknown <= NOT_REBUILT.keys():  # declared none: refused by name, as in zip
            first, *others = sorted(unknown)
            also = f"; the file also names {names(others)}, refused as well" if others else ""
            raise UnsafeCheckpointError(
                f"global {first} refused: no storage type compatshim reads{also}", (first, *others)
            )
        raise CheckpointError(
            "legacy storage key list does not match the storages the pickle names"
        )
    offsets: dict[str, int] = {}
    position = file.tell()
    # storage data cut short is a RuntimeError too, as torch says it ("unexpected EOF")
    cut = as_well(CheckpointError, RuntimeError)
    for key in keys:
        decl = declared[key]
        if source.remaining() < 8:
            raise cut(f"legacy storage {key}: the file ends before its data section")
        header = int.from_bytes(source.read(8), "little", signed=True)
        if header != decl.numel:
            raise CheckpointError(
                f"legacy storage {key}: the data section says {header} elements, "
                f"the pickle declared {decl.numel}"
            )
        if decl.nbytes > source.remaining():
            raise cut(
                f"legacy storage {key}: declares {decl.nbytes} bytes, only "
                f"{source.remaining()} bytes are left in the file"
            )
        offsets[key] = position + 8
        position += 8 + decl.nbytes
        file.seek(position)
    file.seek(main)
    return Legacy(main, scanner.found, offsets)


# --------------------------------------------------------------------------- symbolic pass


TENSOR_REBUILDS = frozenset(k for k in REBUILDS if "parameter" not in k)  # each makes a tensor


class Symbol:
    """A global, or the result of calling one, standing in for the real object."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<{self.name}>"


@dataclass
class ScanResult:
    globals: collections.Counter[str] = field(default_factory=collections.Counter)
    storages: dict[str, StorageDecl] = field(default_factory=dict)
    tensor_dtypes: collections.Counter[str] = field(default_factory=collections.Counter)
    persistent_kinds: collections.Counter[str] = field(default_factory=collections.Counter)
    reached: set[str] = field(default_factory=set)  # names reached through builtins.getattr
    split: dict[str, tuple[str, str]] = field(default_factory=dict)  # name -> (module, name)
    protocol: int = 0
    problems: list[str] = field(default_factory=list)  # what load refuses whatever it allows
    unknown_storages: set[str] = field(default_factory=set)  # storage types it declares none of


# results of a call that load may call in turn, under the rule of their global (its
# arguments are checked by load, not here): functools.partial(object.__new__, cls, ...)()
CALLED_RESULTS = frozenset({"functools.partial()"})
CONSTANTS = ("constant", "method", "staticmethod")  # allowlist kinds load never calls


class ScanMachine(Machine):
    """Runs a pickle symbolically: it constructs nothing the file names. Globals become
    :class:`Symbol` values, calls symbols of their result, BUILD does nothing. It records
    every global with how often the pickle refers to it, every storage declared, every
    tensor rebuild with its dtype, and what load refuses whatever it allows.
    ``container``: "zip" or "legacy" where storage ids are read (checked by
    :func:`declare_storage`, as ``load`` checks them), None for a plain pickle."""

    def __init__(
        self, source: Source, container: str | None = None, encoding: str = "utf-8"
    ) -> None:
        super().__init__(source, encoding)
        self.container = container
        self.found = ScanResult()
        self._symbols: dict[str, Symbol] = {}
        self._verdicts: dict[str, Verdict] = {}

    def run(self) -> Any:
        value = super().run()
        self.found.protocol = self.proto
        return value

    def find_global(self, module: str, name: str) -> Any:
        qualname = f"{module}.{name}"
        self.found.globals[qualname] += 1
        self.found.split.setdefault(qualname, (module, name))  # as load looks it up
        symbol = self._symbols.get(qualname)
        if symbol is None:
            symbol = self._symbols[qualname] = Symbol(qualname)
        return symbol

    def _get(self, index: int) -> None:
        super()._get(index)
        top = self.stack[-1]
        if type(top) is Symbol and self._symbols.get(top.name) is top:
            self.found.globals[top.name] += 1

    def call(self, func: Any, args: tuple[Any, ...]) -> Any:
        name = func.name if type(func) is Symbol else f"<{type(func).__name__}>"
        rule = name  # the canonical name its rules know it by
        if type(func) is not Symbol or (name.endswith(")") and name not in CALLED_RESULTS):
            self.found.problems.append(f"call of {short(name)}: only globals may be called")
        elif not name.endswith(")"):
            verdict = self._verdict(name)
            rule = verdict.name
            entry = verdict.entry
            if verdict.source == ALLOWLIST and entry is not None and entry.kind in CONSTANTS:
                self.found.problems.append(f"call of {name}: it may not be called")
        if rule == "functools.partial" and not (
            len(args) == 1 and type(args[0]) is Symbol and args[0].name == "builtins.object.__new__"
        ):  # its rule (load also checks the partial's state, which this scan does not)
            self.found.problems.append("functools.partial of anything but object.__new__")
        if rule == "builtins.getattr":  # the one rule entry: what it reaches is judged as a name
            # load reads getattr(class, short name) only: anything else is one fixed name, so
            # getattr(getattr(...(object, S)..., S), S) cannot grow a name by len(S) a level
            # (7 KB of file held 500 MB of names)
            if (
                len(args) == 2
                and type(args[0]) is Symbol
                and args[0].name not in self.found.reached
                and not args[0].name.endswith(")")
                and type(args[1]) is str
                and len(args[1]) <= GETATTR_NAME
            ):
                reached = f"{args[0].name}.{args[1]}"
            else:
                reached = "builtins.getattr(<anything but a global and a short name>)"
            self.found.globals[reached] += 1
            self.found.reached.add(reached)
            return Symbol(reached)
        if rule in TENSOR_REBUILDS:
            self.found.tensor_dtypes[self._tensor_dtype(name, args)] += 1
        elif rule == "torch._tensor._rebuild_from_type_v2" and len(args) == 4:
            inner = args[2] if type(args[2]) is tuple else ()
            self.call(args[0], inner)
        return Symbol(_called(name, "()"))

    def _verdict(self, name: str) -> Verdict:
        """``load``'s verdict on a called global (``_gate.judge``), once per name."""
        verdict = self._verdicts.get(name)
        if verdict is None:
            module, _, attr = name.rpartition(".")
            verdict = self._verdicts[name] = judge(module, attr, None, name in self.found.reached)
        return verdict

    def _tensor_dtype(self, name: str, args: tuple[Any, ...]) -> str:
        if name.endswith("_v3") and len(args) > 6 and type(args[6]) is Symbol:
            return args[6].name.rpartition(".")[2]
        if name.endswith("no_storage") and args and type(args[0]) is Symbol:
            return args[0].name.rpartition(".")[2]
        if args and type(args[0]) is StorageDecl:
            return args[0].dtype
        return "?"

    def new_object(self, cls: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        name = cls.name if type(cls) is Symbol else f"<{type(cls).__name__}>"
        return Symbol(_called(name, ".__new__()"))

    def build(self, inst: Any, state: Any) -> None:
        return None

    def persistent_load(self, pid: Any) -> Any:
        if type(pid) is not tuple or not pid:
            self.found.persistent_kinds["<not a tuple>"] += 1
            return Symbol("<persistent id>")
        first = pid[0]
        if type(first) is bytes:
            kind = first.decode("ascii", "replace")
        else:
            kind = first if type(first) is str else short(first)
        self.found.persistent_kinds[kind] += 1
        if kind != "storage" or self.container is None:
            return Symbol(f"<persistent {kind}>")
        type_name = None
        if len(pid) > 1 and type(pid[1]) is Symbol:
            module, _, name = pid[1].name.rpartition(".")
            entry = lookup(module, name)
            if entry is None and name not in STORAGE_DTYPES:
                self.found.unknown_storages.add(pid[1].name)
                return Symbol("<persistent storage>")  # an unknown global: judged by its name
            type_name = storage_type(entry) if entry is not None else name
        return declare_storage(self.found.storages, type_name, pid[2:], self.container == "legacy")

    def set_items(self, target: Any, pairs: list[Any]) -> None:
        if type(target) is dict:
            for index in range(0, len(pairs), 2):
                with contextlib.suppress(TypeError):
                    target[pairs[index]] = pairs[index + 1]

    def append_items(self, target: Any, items: list[Any]) -> None:
        if type(target) is list:
            target.extend(items)

    def add_items(self, target: Any, items: list[Any]) -> None:
        return None


def _called(name: str, suffix: str) -> str:
    """The name of a call's result; a result called again keeps its name (``f()()()`` would
    grow by two characters a call: quadratic text from a linear file)."""
    return name if name.endswith(")") else name + suffix
