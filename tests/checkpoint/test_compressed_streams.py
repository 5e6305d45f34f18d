"""A compressed file object (gzip, bz2, lzma, a zip member) given to ``load`` (and the hardened
``torch.load``) is read at most ``EXPANSION_PER_BYTE`` bytes per stored byte.

Its size, so the budget (8 bytes a byte, the hashing allowance 16), was taken from a seek to
its end, which inflates everything: a 65 KB ``.gz`` of ``EMPTY_SET`` x 64 Mi built ~544 MB of
sets before its refusal (~9,000x the bytes on disk). Checkpoints saved compressed still load.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import zipfile

import pytest

from compatshim.checkpoint import CheckpointError, load


def _bomb(mib: int) -> bytes:
    return gzip.compress(b"\x80\x02" + b"\x8f" * (mib << 20) + b"N.", compresslevel=9)


def test_a_gzip_bomb_is_refused_at_its_inflation_limit(tmp_path) -> None:
    path = tmp_path / "bomb.pt.gz"
    path.write_bytes(_bomb(16))
    with gzip.open(path, "rb") as f, pytest.raises(CheckpointError, match="inflates past"):
        load(f)
    with pytest.raises(CheckpointError, match="inflates past"):
        load(gzip.GzipFile(fileobj=io.BytesIO(_bomb(16))))


@pytest.mark.parametrize("kind", ["gzip", "bz2", "lzma", "zip"])
def test_compressed_checkpoints_still_load(kind: str) -> None:
    torch = pytest.importorskip("torch")
    buffer = io.BytesIO()
    torch.save({"w": torch.arange(6.0), "step": 3, "names": ["a"] * 100}, buffer)
    raw = buffer.getvalue()
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as out:
        out.writestr("model.pt", raw)
    opened = {
        "gzip": lambda: gzip.GzipFile(fileobj=io.BytesIO(gzip.compress(raw))),
        "bz2": lambda: bz2.BZ2File(io.BytesIO(bz2.compress(raw))),
        "lzma": lambda: lzma.LZMAFile(io.BytesIO(lzma.compress(raw))),  # noqa: SIM115
        "zip": lambda: zipfile.ZipFile(archive).open("model.pt"),  # noqa: SIM115
    }
    with opened[kind]() as f:
        loaded = load(f)
    assert loaded["step"] == 3 and loaded["w"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
