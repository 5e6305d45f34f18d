"""The zip directory reader (``_container.read_zip_directory``, struct, no ``zipfile``).

It must see exactly the records Python's ``zipfile`` and torch's own reader see on
every file torch writes (zip64 end records included, which torch always writes), and
refuse, with a CheckpointError, the files where zip readers could disagree: a name
``zipfile`` cuts at a NUL byte, a central directory that is not where its end record
says, an entry count that is not the directory's, zip64 end records that are not
where the locator says.
"""

from __future__ import annotations

import io
import struct
import time
import zipfile
import zlib
from pathlib import Path

import pytest

pytest.importorskip("torch")

import torch

from compatshim.checkpoint import CheckpointError, UnsafeCheckpointError, inspect, load
from compatshim.checkpoint._container import read_record, read_zip_directory

PICKLE = b"\x80\x02}q\x00."  # protocol 2: an empty dict


def _torch_bytes(obj: object) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def _zip(entries: list[tuple[str, bytes]], *, zip64: bool = False, comment: bytes = b"") -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.comment = comment
        for name, data in entries:
            with archive.open(zipfile.ZipInfo(name), "w", force_zip64=zip64) as record:
                record.write(data)
    return buffer.getvalue()


def _records(data: bytes) -> dict[str, tuple[str, int]]:
    directory = read_zip_directory(io.BytesIO(data), "f")
    return {key: (record.name, record.size) for key, record in directory.records.items()}


def _zipfile_records(data: bytes) -> dict[str, tuple[str, int]]:
    infos = zipfile.ZipFile(io.BytesIO(data)).infolist()
    return {i.filename.split("/", 1)[1]: (i.filename, i.file_size) for i in infos}


FILES = {
    "empty state dict": lambda: _torch_bytes({}),
    "state dict": lambda: _torch_bytes(torch.nn.Linear(4, 3).state_dict()),
    "zip64 records": lambda: _zip(
        [("archive/data.pkl", PICKLE), ("archive/version", b"3\n")], zip64=True
    ),
    "archive comment": lambda: _zip(
        [("archive/data.pkl", PICKLE), ("archive/version", b"3\n")], comment=b"made by hand"
    ),
}


@pytest.mark.parametrize("kind", FILES)
def test_records_are_the_ones_zipfile_and_torch_see(kind: str) -> None:
    data = FILES[kind]()
    records = _records(data)
    assert records == _zipfile_records(data)
    reader = torch._C.PyTorchFileReader(io.BytesIO(data))
    assert sorted(records) == sorted(reader.get_all_records())


@pytest.mark.parametrize("kind", FILES)
def test_record_bytes_are_the_ones_zipfile_and_torch_read(kind: str) -> None:
    """inspect reads records through ``read_record`` (the one zip reader), not zipfile."""
    data = FILES[kind]()
    directory = read_zip_directory(io.BytesIO(data), "f")
    archive = zipfile.ZipFile(io.BytesIO(data))
    reader = torch._C.PyTorchFileReader(io.BytesIO(data))
    for key, record in directory.records.items():
        got = read_record(io.BytesIO(data), record, "f")
        assert got == archive.read(record.name) == bytes(reader.get_record(key))


def test_a_record_without_its_local_header_is_a_checkpoint_error() -> None:
    data = FILES["state dict"]()
    record = read_zip_directory(io.BytesIO(data), "f").records["data.pkl"]
    broken = data[: record.offset] + b"XX" + data[record.offset + 2 :]
    with pytest.raises(CheckpointError, match="has no local header"):
        read_record(io.BytesIO(broken), record, "f")
    with pytest.raises(CheckpointError, match="runs past the file's end"):
        read_record(io.BytesIO(data[: record.offset + 40]), record, "f")


def test_torch_writes_zip64_end_records_and_they_are_read() -> None:
    data = _torch_bytes({"w": torch.arange(6.0)})
    assert b"PK\x06\x06" in data[-120:] and b"PK\x06\x07" in data[-120:]
    assert torch.equal(load(io.BytesIO(data))["w"], torch.arange(6.0))


def _central_directory_at(data: bytes) -> int:
    return data.rindex(b"PK\x01\x02", 0, data.rindex(b"PK\x05\x06"))


def test_a_name_zipfile_would_cut_at_nul_is_refused(tmp_path: Path) -> None:
    data = _zip([("archive/data.pkl", PICKLE), ("archive/vers_on", b"3\n")])
    cut_at = data.rindex(b"archive/vers_on")  # the central directory's copy
    forged = data[:cut_at] + b"archive/vers\0on" + data[cut_at + 15 :]
    assert zipfile.ZipFile(io.BytesIO(forged)).namelist()[1] == "archive/vers"
    path = tmp_path / "nul.pt"
    path.write_bytes(forged)
    for read in (load, inspect):
        with pytest.raises(CheckpointError, match="NUL"):
            read(path)


def test_bytes_between_central_directory_and_end_record_are_refused() -> None:
    data = _torch_bytes({})
    end64 = data.rindex(b"PK\x06\x06")
    forged = data[:end64] + b"\0" * 46 + data[end64:]  # zipfile would shift every offset
    with pytest.raises(CheckpointError, match="not where its end record says"):
        load(io.BytesIO(forged))


def test_an_entry_count_that_is_not_the_directorys_is_refused() -> None:
    data = bytearray(_zip([("archive/data.pkl", PICKLE), ("archive/version", b"3\n")]))
    end = data.rindex(b"PK\x05\x06")
    data[end + 8 : end + 12] = (1).to_bytes(2, "little") * 2  # two records, the end says one
    with pytest.raises(CheckpointError, match="counts 1 entries"):
        load(io.BytesIO(bytes(data)))


def test_a_zip64_locator_without_its_end_record_is_refused() -> None:
    data = bytearray(_torch_bytes({}))
    end64 = data.rindex(b"PK\x06\x06")
    data[end64 : end64 + 4] = b"PK\x00\x00"
    with pytest.raises(CheckpointError, match="zip64 end record"):
        load(io.BytesIO(bytes(data)))


@pytest.mark.parametrize("cut", [1, 21, 22, 60, 100], ids=lambda n: f"{n} bytes cut from the end")
def test_a_truncated_file_is_a_checkpoint_error(cut: int) -> None:
    data = _torch_bytes({"w": torch.ones(3)})
    with pytest.raises(CheckpointError):
        load(io.BytesIO(data[:-cut]))


def test_a_huge_entry_count_is_refused_before_any_work() -> None:
    data = bytearray(_torch_bytes({}))
    end64 = data.rindex(b"PK\x06\x06")
    data[end64 + 32 : end64 + 40] = (1 << 60).to_bytes(8, "little")  # entries in all
    with pytest.raises(CheckpointError, match="central directory is smaller"):
        load(io.BytesIO(bytes(data)))


def test_duplicate_and_escaping_names_are_still_refused() -> None:
    duplicate = _zip([("archive/data.pkl", PICKLE), ("archive/data.pkl", PICKLE)])
    with pytest.raises(UnsafeCheckpointError, match="same name"):
        load(io.BytesIO(duplicate))
    for name in ("archive/../x", "archive/./x", "archive//x", "other/x", "archive/a\\b"):
        escaping = _zip([("archive/data.pkl", PICKLE), (name, b"x")])
        with pytest.raises(UnsafeCheckpointError, match="outside the archive folder"):
            load(io.BytesIO(escaping))
    # records are keyed inside the first name's folder while the directory is read: a name in
    # another folder may share that key ("other/data.pkl"), which is no duplicate
    other = _zip([("archive/data.pkl", PICKLE), ("other/data.pkl", PICKLE)])
    with pytest.raises(UnsafeCheckpointError, match="outside the archive folder"):
        load(io.BytesIO(other))
    for first in ("..", "\\x", "a\\b"):  # escaping names first: still refused
        with pytest.raises(UnsafeCheckpointError, match="outside the archive folder"):
            load(io.BytesIO(_zip([(first, b"x"), ("archive/data.pkl", PICKLE)])))
    flat = _zip([("x.npy", b"x"), ("archive/data.pkl", PICKLE)])  # no folder: no torch file
    with pytest.raises(CheckpointError, match="not a torch zip checkpoint") as caught:
        load(io.BytesIO(flat))
    assert not isinstance(caught.value, UnsafeCheckpointError)


def _zip64_everywhere(data: bytes) -> bytes:
    """``data``'s records rewritten with every size and offset in a zip64 extra field (what
    torch writes for records or offsets past 4 GiB), 32-bit fields saturated."""
    records = [(i.filename, zipfile.ZipFile(io.BytesIO(data)).read(i)) for i in
               zipfile.ZipFile(io.BytesIO(data)).infolist()]  # fmt: skip
    body, central = b"", b""
    for name, payload in records:
        raw, crc, offset = name.encode(), zlib.crc32(payload), len(body)
        extra = struct.pack("<HHQQQ", 1, 24, len(payload), len(payload), offset)
        body += struct.pack("<4s5H3L2H", b"PK\x03\x04", 45, 0, 0, 0, 0, crc, 0xFFFFFFFF,
                            0xFFFFFFFF, len(raw), 20) + raw + struct.pack(
            "<HHQQ", 1, 16, len(payload), len(payload)) + payload  # fmt: skip
        central += struct.pack("<4s4B4HL2L5H2L", b"PK\x01\x02", 45, 3, 45, 0, 0, 0, 0, 0, crc,
                               0xFFFFFFFF, 0xFFFFFFFF, len(raw), len(extra), 0, 0, 0, 0,
                               0xFFFFFFFF) + raw + extra  # fmt: skip
    count, at = len(records), len(body)
    end64 = struct.pack("<4sQ2H2L4Q", b"PK\x06\x06", 44, 45, 45, 0, 0, count, count,
                        len(central), at)  # fmt: skip
    locator = struct.pack("<4sLQL", b"PK\x06\x07", 0, at + len(central), 1)
    end = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF,
                      0xFFFFFFFF, 0)  # fmt: skip
    return body + central + end64 + locator + end


def test_zip64_extra_fields_give_the_sizes_and_offsets() -> None:
    """Past 4 GiB torch writes sizes and offsets in zip64 extra fields: read as zipfile and
    torch's reader read them, and the file loads."""
    state = torch.nn.Linear(4, 3).state_dict()
    data = _zip64_everywhere(_torch_bytes(state))
    records = _records(data)
    assert records == _zipfile_records(data)
    assert all(size < 0xFFFFFFFF for _, size in records.values())
    loaded = load(io.BytesIO(data))
    assert all(torch.equal(loaded[k], state[k]) for k in state)


def test_a_zip64_extra_field_missing_a_value_is_refused() -> None:
    data = bytearray(_zip64_everywhere(_torch_bytes({})))
    at = data.index(b"PK\x01\x02")  # the first central directory entry
    name_len = struct.unpack_from("<H", data, at + 28)[0]
    struct.pack_into("<HH", data, at + 46 + name_len, 1, 8)  # holds the size only
    with pytest.raises(CheckpointError, match="corrupt zip64 extra field"):
        load(io.BytesIO(bytes(data)))


def test_extra_fields_cost_what_they_weigh() -> None:
    """64 KiB extra fields made of empty fields (16 383 each, 40 records): walked by position,
    in time linear in their size (~0.1 s here; zipfile's re-slicing walk took 0.34 s)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for index in range(40):
            info = zipfile.ZipInfo("archive/data.pkl" if index == 0 else f"archive/r{index}")
            info.extra = b"\x99\x99\x00\x00" * 16_383
            archive.writestr(info, PICKLE)
    data = buffer.getvalue()
    start = time.process_time()
    assert len(read_zip_directory(io.BytesIO(data), "f").records) == 40
    assert time.process_time() - start < 5


def _with_version(data: bytes, version: bytes) -> bytes:
    """``data`` (a torch.save file) with its version record's bytes replaced in place."""
    record = read_zip_directory(io.BytesIO(data), "f").records["version"]
    start = data.index(read_record(io.BytesIO(data), record, "f"), record.offset)
    assert len(version) == record.size
    return data[:start] + version + data[start + record.size :]


def test_torchs_reader_is_opened_only_for_a_format_version_this_torch_does_not_write(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The archive is parsed once, by compatshim's directory reader, which reads the
    storages too (one copy into each). torch's own reader (a second parse) is opened where
    the format version is not the one this torch's torch.save writes, so that its check
    decides (torch reads 1 to 10, refuses 99), and for mmap (it gives the offsets)."""
    real = torch._C.PyTorchFileReader
    opened: list[object] = []

    def counting(source: object) -> object:
        opened.append(source)
        return real(source)

    monkeypatch.setattr(torch._C, "PyTorchFileReader", counting)
    assert load(io.BytesIO(_torch_bytes({"step": 3, "names": ["a"]}))) == {
        "step": 3,
        "names": ["a"],
    }
    assert opened == []
    state = {"a": torch.arange(4.0), "b": torch.ones(2, 3), "c": torch.arange(4.0)[1:]}
    data = _torch_bytes(state)
    for source in (io.BytesIO(data), io.BufferedReader(io.BytesIO(data), buffer_size=3)):
        loaded = load(source)  # read into the storages in one call, or in many short reads
        assert all(torch.equal(loaded[k], state[k]) for k in state)
    assert opened == []
    older = _with_version(data, b"2\n")
    loaded = load(io.BytesIO(older))
    assert all(torch.equal(loaded[k], state[k]) for k in state) and len(opened) == 1
    with pytest.raises(CheckpointError, match="version 99"):
        load(io.BytesIO(_with_version(data, b"99")))
    assert len(opened) == 2
    (tmp_path / "f.pt").write_bytes(data)
    loaded = load(tmp_path / "f.pt", mmap=True)
    assert all(torch.equal(loaded[k], state[k]) for k in state) and len(opened) == 3


@pytest.mark.parametrize("count", [1000, 4000])  # read then copied; read into the storage
def test_a_storage_record_cut_short_is_a_checkpoint_error(count: int) -> None:
    """A storage whose bytes the file does not hold in full is refused, never handed back
    with the rest of its memory unread."""
    data = _torch_bytes({"w": torch.arange(float(count))})
    record = read_zip_directory(io.BytesIO(data), "f").records["data/0"]
    end = data.index(read_record(io.BytesIO(data), record, "f"), record.offset) + 100

    class Short(io.BytesIO):  # a file object that stops giving bytes inside the storage
        def read(self, size: int | None = -1) -> bytes:  # only reads across ``end`` are cut
            if size is not None and self.tell() < end < self.tell() + size:
                size = end - self.tell()
            return super().read(size)

        def readinto(self, buffer: object) -> int:
            view = memoryview(buffer)  # type: ignore[arg-type]
            if self.tell() < end < self.tell() + len(view):
                view = view[: end - self.tell()]
            return super().readinto(view) if self.tell() != end else 0

    with pytest.raises(CheckpointError, match="runs past the file's end"):
        load(Short(data))


def test_the_view_a_storage_is_read_through_is_released() -> None:
    """A file object that keeps the buffer it was given to fill cannot write into the
    storage's memory later: the view is released once the read is done."""
    data = _torch_bytes({"w": torch.arange(4000.0)})  # 16 kB: read into the storage
    kept: list[memoryview] = []

    class Keeping(io.BytesIO):
        def readinto(self, buffer: object) -> int:
            kept.append(buffer)  # type: ignore[arg-type]
            return super().readinto(buffer)  # type: ignore[arg-type]

    loaded = load(Keeping(data))
    assert torch.equal(loaded["w"], torch.arange(4000.0)) and kept
    with pytest.raises(ValueError, match="released"):
        kept[0][0] = 1


@pytest.mark.timeout(120)
def test_storages_read_alike_from_threads_loading_at_once() -> None:
    """Threads loading at once, the first of them finding this torch's format version
    (worked out once per process) while the others wait or work it out too: every load
    gets the saved tensors, small (read then copied) and large (read into the storage)."""
    from concurrent.futures import ThreadPoolExecutor

    from compatshim.checkpoint import _load

    state = {"small": torch.arange(10.0), "large": torch.arange(5000.0).reshape(50, 100)}
    data = _torch_bytes(state)
    _load._own_version.cache_clear()
    _load._memory_from.cache_clear()
    with ThreadPoolExecutor(4) as pool:
        loaded = list(pool.map(lambda _: load(io.BytesIO(data)), range(40)))
    assert all(torch.equal(got[k], state[k]) for got in loaded for k in state)


def test_a_torch_save_cut_short_says_so(tmp_path: Path) -> None:
    """Half a torch.save file read "not a readable zip file (File is not a zip file)"."""
    path = tmp_path / "cut.pt"
    torch.save({"w": torch.ones(64)}, path)
    path.write_bytes(path.read_bytes()[:300])
    with pytest.raises(CheckpointError, match="has no end record: cut short"):
        load(path)


def test_a_file_opened_in_text_mode_is_a_type_error_that_says_so(tmp_path: Path) -> None:
    """``load(open(path))``: "damaged or unsupported file (UnicodeDecodeError ...)"."""
    path = tmp_path / "w.pt"
    torch.save({"w": 1}, path)
    for call in (load, inspect):
        with open(path) as text, pytest.raises(TypeError, match="opened in text mode"):
            call(text)
