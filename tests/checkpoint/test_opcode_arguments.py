"""The opcodes whose argument the machine reads in place (768e502: BININT, BININT1, BININT2,
BINFLOAT, BINPUT, BINGET, LONG_BINPUT, LONG_BINGET): values as pickle reads them, a cut
argument a typed error naming its length, an unset memo entry named, and ``inspect`` still
counting a global each time the memo hands it out (``ScanMachine`` overrides ``_get``)."""

from __future__ import annotations

import io
import pickle
import struct

import pytest

from compatshim import checkpoint

_NUMBERS = [0, 1, 255, 256, 65535, 65536, -1, -(2**31), 2**31 - 1, 0.5, -1e300]


def test_numbers_and_memo_read_as_pickle_reads_them() -> None:
    shared = ["x"]
    value = {"n": _NUMBERS, "shared": [shared] * 3, "many": [[i] for i in range(400)]}
    for protocol in (1, 2, 3):  # BINPUT/BINGET, and LONG_ past 256 memo entries
        data = pickle.dumps(value, protocol=protocol)
        loaded = checkpoint.load(io.BytesIO(data))
        assert loaded == pickle.loads(data) == value
        assert loaded["shared"][0] is loaded["shared"][2]


@pytest.mark.parametrize(
    ("tail", "length", "left"),
    [
        (b"K", 1, 0),
        (b"J\x01\x02", 4, 2),
        (b"M\x01", 2, 1),
        (b"G\x00", 8, 1),
        (b"q", 1, 0),
        (b"r\x01\x00", 4, 2),
        (b"h", 1, 0),
        (b"j\x00\x00", 4, 2),
    ],
)
def test_a_cut_argument_is_a_checkpoint_error(tail: bytes, length: int, left: int) -> None:
    with pytest.raises(checkpoint.CheckpointError, match=f"length of {length} bytes .*{left}"):
        checkpoint.load(io.BytesIO(b"\x80\x02]" + tail))


@pytest.mark.parametrize("get", [b"h\x09", b"j" + struct.pack("<I", 9)])
def test_an_unset_memo_entry_is_named(get: bytes) -> None:
    with pytest.raises(checkpoint.CheckpointError, match="memo entry 9 is used before"):
        checkpoint.load(io.BytesIO(b"\x80\x02" + get + b"."))


@pytest.mark.parametrize("long", [False, True])
def test_inspect_counts_a_global_at_each_memo_read(long: bool) -> None:
    put, get = (b"r\x00\x00\x00\x00", b"j\x00\x00\x00\x00") if long else (b"q\x00", b"h\x00")
    data = b"\x80\x02ccollections\nOrderedDict\n" + put + b"0" + get + b"0" + get + b")R."
    assert checkpoint.load(io.BytesIO(data)) == {}
    uses = {use.name: use.count for use in checkpoint.inspect(io.BytesIO(data)).globals}
    assert uses == {"collections.OrderedDict": 3}
