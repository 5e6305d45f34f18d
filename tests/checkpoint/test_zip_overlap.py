"""Overlapping zip records are refused (issue 37, item 3): many storage records of a torch
zip file pointed at one stored record, with no overlap check and no charge, so a 1.27 MB file
cost +1.5 GB in ``load`` and in hardened ``torch.load`` (plain torch does the same; hardened
mode promises better). Each record must end before the next begins, as every zip writer,
torch's included, lays them out."""

from __future__ import annotations

import io
import struct
import zipfile
import zlib

import pytest

torch = pytest.importorskip("torch")

from compatshim import checkpoint  # noqa: E402


def _stored_zip(
    records: list[tuple[str, bytes]], aliases: dict[str, str], order: str = "as written"
) -> bytes:
    """A stored zip of ``records``; each name in ``aliases`` gets a central directory entry
    pointing at the local record of the name it maps to (no bytes of its own). ``order``
    of the central directory: "as written" (aliases last), "by offset" or "reversed"."""
    out = io.BytesIO()
    placed: dict[str, tuple[int, int, int]] = {}  # name -> (offset, size, crc)
    for name, data in records:
        raw = name.encode()
        crc = zlib.crc32(data)
        placed[name] = (out.tell(), len(data), crc)
        out.write(
            struct.pack(
                "<4s5H3L2H", b"PK\x03\x04", 20, 0, 0, 0, 0, crc, len(data), len(data), len(raw), 0
            )
        )
        out.write(raw + data)
    central = io.BytesIO()
    names = [name for name, _ in records] + list(aliases)
    if order == "by offset":
        names.sort(key=lambda name: placed[aliases.get(name, name)][0])
    elif order == "reversed":
        names.reverse()
    for name in names:
        offset, size, crc = placed[aliases.get(name, name)]
        raw = name.encode()
        central.write(
            struct.pack(
                "<4s4B4HL2L5H2L",
                b"PK\x01\x02",
                20,
                3,
                20,
                0,
                0,
                0,
                0,
                0,
                crc,
                size,
                size,
                len(raw),
                0,
                0,
                0,
                0,
                0,
                offset,
            )
        )
        central.write(raw)
    start = out.tell()
    out.write(central.getvalue())
    out.write(
        struct.pack(
            "<4s4H2LH",
            b"PK\x05\x06",
            0,
            0,
            len(names),
            len(names),
            len(central.getvalue()),
            start,
            0,
        )
    )
    return out.getvalue()


def _one_record_read_many(count: int, nbytes: int, order: str = "as written") -> bytes:
    """A genuine torch.save of ``count`` tensors, rewritten so every storage record is the
    first one's bytes: the file holds one record, ``load`` would allocate ``count``."""
    saved = io.BytesIO()
    torch.save([torch.zeros(nbytes // 4) for _ in range(count)], saved)
    with zipfile.ZipFile(saved) as archive:
        infos = archive.infolist()
        prefix = infos[0].filename.split("/", 1)[0] + "/"
        first = prefix + "data/0"
        kept = [
            (i.filename, archive.read(i))
            for i in infos
            if not (i.filename.startswith(prefix + "data/") and i.filename != first)
        ]
        aliases = {
            i.filename: first
            for i in infos
            if i.filename.startswith(prefix + "data/") and i.filename != first
        }
    return _stored_zip(kept, aliases, order)


@pytest.mark.parametrize("order", ["as written", "by offset", "reversed"])
def test_records_sharing_bytes_are_refused(order: str) -> None:
    """In any central directory order: the check reads the offsets in C where they come in
    order, and sorts them where they do not."""
    data = _one_record_read_many(64, 1 << 20, order)  # ~1 MB file, 64 MB if each were read
    assert len(data) < 2 << 20
    with pytest.raises(checkpoint.UnsafeCheckpointError, match="overlap"):
        checkpoint.load(io.BytesIO(data))
    assert "overlap" in " ".join(checkpoint.inspect(io.BytesIO(data)).refusals)


@pytest.mark.parametrize("order", ["as written", "reversed"])
def test_the_rewriter_keeps_a_genuine_file_loadable(order: str) -> None:
    """The same rewriting with no alias is an ordinary stored zip: it loads, its central
    directory in the records' order or not (so the refusal above is the overlap)."""
    data = _one_record_read_many(1, 1 << 10, order)
    assert torch.equal(checkpoint.load(io.BytesIO(data))[0], torch.zeros(256))
