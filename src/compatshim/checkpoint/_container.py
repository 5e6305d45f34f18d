"""What kind of file it is, and the zip directory read and checked before any record is used.

torch.save's zip format stores every record uncompressed under one folder
(``archive/data.pkl``, ``archive/data/0`` ...). The directory is read with
Python's ``zipfile`` (headers only) and refused when it has duplicate or
escaping names, compressed records, records past the end of the file, or is a
TorchScript archive (``constants.pkl`` / ``code/``), which ``torch.load``
would hand to ``torch.jit.load``. Nothing here imports torch.
"""

from __future__ import annotations

import collections
import zipfile
from dataclasses import dataclass
from typing import IO, Literal

from . import _safetensors
from .errors import CheckpointError, UnsafeCheckpointError

Container = Literal["zip", "legacy", "pickle", "torchscript", "tar", "safetensors", "other"]
ZIP_MAGICS = (b"PK\x03\x04", b"PK\x05\x06")
LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
LEGACY_PROTOCOL = 1001
_PICKLE_FIRST_BYTES = frozenset(b"\x80(}]).NIJKLFGSTUVXcdlt")


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


@dataclass(frozen=True)
class Record:
    name: str
    size: int


@dataclass(frozen=True)
class ZipDirectory:
    """The records of a torch zip file, by name without the archive folder."""

    archive: str
    records: dict[str, Record]

    @property
    def is_torchscript(self) -> bool:
        return "constants.pkl" in self.records or any(n.startswith("code/") for n in self.records)

    def record(self, name: str, what: str) -> Record:
        found = self.records.get(name)
        if found is None:
            raise CheckpointError(f"{what}: the zip has no record {self.archive}/{name}")
        return found


def read_zip_directory(file: IO[bytes], what: str) -> ZipDirectory:
    """Headers only; raises CheckpointError / UnsafeCheckpointError on anything odd."""
    size = file.seek(0, 2)
    file.seek(0)
    try:
        infos = zipfile.ZipFile(file).infolist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError, EOFError) as exc:
        raise CheckpointError(f"{what}: not a readable zip file ({exc})") from None
    finally:
        file.seek(0)
    if not infos:
        raise CheckpointError(f"{what}: the zip file holds no records")
    counts = collections.Counter(info.filename for info in infos)
    duplicates = sorted(name for name, count in counts.items() if count > 1)
    if duplicates:
        raise UnsafeCheckpointError(
            f"{what}: zip records with the same name ({', '.join(duplicates[:5])}): readers "
            "disagree on which one counts",
            tuple(f"duplicate zip record {n}" for n in duplicates[:5]),
        )
    archive = infos[0].filename.split("/", 1)[0]
    records: dict[str, Record] = {}
    for info in infos:
        name = info.filename
        parts = name.split("/")
        if (
            len(parts) < 2
            or parts[0] != archive
            or any(p in ("", ".", "..") for p in parts[1:])
            or "\\" in name
            or name.startswith("/")
        ):
            raise UnsafeCheckpointError(
                f"{what}: zip record name {name[:80]!r} is outside the archive folder "
                f"{archive!r} (torch files keep every record in one folder)",
                (f"zip record {name[:80]}",),
            )
        records[name[len(archive) + 1 :]] = Record(name, info.file_size)
    directory = ZipDirectory(archive, records)
    if directory.is_torchscript:
        return directory  # refused by the caller; its code records are compressed
    for info in infos:
        if info.compress_type != zipfile.ZIP_STORED or info.compress_size != info.file_size:
            raise CheckpointError(
                f"{what}: zip record {info.filename!r} is compressed (torch never does)"
            )
        if info.header_offset + info.file_size > size:
            raise CheckpointError(
                f"{what}: zip record {info.filename!r} runs past the end of the file"
            )
    if "data.pkl" not in records:
        raise CheckpointError(f"{what}: a zip file without {archive}/data.pkl is no torch file")
    return directory


def refuse_torchscript(what: str) -> UnsafeCheckpointError:
    return UnsafeCheckpointError(
        f"{what} is a TorchScript archive (torch.jit.save): torch.load would pass it to "
        "torch.jit.load, which runs the scripted code (e.g. __setstate__); compatshim never "
        "does. Load it with torch.jit.load only if you trust it.",
        ("TorchScript archive",),
    )
