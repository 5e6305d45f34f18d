"""Keys whose class hashes in Python from their attributes are charged what hashing them visits.

DCP's ``MetadataIndex`` is a frozen dataclass (``hash((fqn, offset))``, every use, uncached)
and omegaconf's ``ValueNode`` hashes its value: both allow-listed instances whose state the
file chooses. Charged one unit per use before, a 1.9 KB file (a MetadataIndex whose offset is
a memo-shared tuple of 2**22 leaves, used 200 times as a dict key) took 18 s, and a 1.3 MB one
(an AnyNode holding a 1 MB int, used 40 000 times) 36 s. Each must now be refused quickly;
real files (a DCP ``Metadata`` keyed by MetadataIndex, nodes as keys) still load.
"""

from __future__ import annotations

import io
import pathlib
import pickle
import struct
import time

import pytest

torch = pytest.importorskip("torch")

from compatshim.checkpoint import CheckpointError, load  # noqa: E402

FAST = 5.0  # seconds: the refusals take well under 0.5 s; before, 18-36 s
METADATA = "torch.distributed.checkpoint.metadata"


def _get(i: int) -> bytes:
    return b"j" + struct.pack("<I", i)


def _put(i: int) -> bytes:
    return b"r" + struct.pack("<I", i)


def _shared_tuple(levels: int) -> bytes:
    """T(i+1) = (Ti, Ti) in memo 0: 2**levels leaves from a few bytes a level."""
    body = b"\x80\x04K\x00\x85" + _put(0)
    for _ in range(levels):
        body += _get(0) + _get(0) + b"\x86" + _put(0) + b"0"
    return body


def _metadata_index(offset: bytes) -> bytes:
    """A MetadataIndex (NEWOBJ, BUILD {fqn, offset}) left on the stack."""
    return (
        f"c{METADATA}\nMetadataIndex\n".encode()
        + b")\x81}\x8c\x03fqn\x8c\x01as\x8c\x06offset"
        + offset
        + b"sb"
    )


def _used_as_key(uses: int, memo: int) -> bytes:
    body = b"}("
    for k in range(uses):
        body += _get(memo) + b"K" + bytes([k % 256])
    return body + b"u."


def _timed_refusal(data: bytes) -> str:
    pytest.importorskip("torch.distributed.checkpoint.metadata")
    start = time.process_time()
    with pytest.raises(CheckpointError) as info:
        load(io.BytesIO(data))
    assert time.process_time() - start < FAST
    return str(info.value)


def test_metadata_index_with_a_shared_tuple_offset_used_as_key_many_times() -> None:
    data = _shared_tuple(22) + _metadata_index(_get(0)) + _put(1) + b"0" + _used_as_key(200, 1)
    assert "hashing the file's keys" in _timed_refusal(data)


def test_a_tuple_of_many_uses_of_a_dear_metadata_index_is_refused_when_built() -> None:
    mi = _shared_tuple(21) + _metadata_index(_get(0)) + _put(1) + b"0"
    data = mi + b"(" + _get(1) * 400 + b"t" + _put(2) + b"0" + _used_as_key(20, 2)
    assert "once its shared parts are expanded" in _timed_refusal(data)


def test_state_given_after_the_object_was_hashed_is_refused() -> None:
    # hashed while its offset was (), then given the shared tuple, then hashed again
    data = (
        _shared_tuple(22)
        + f"c{METADATA}\nMetadataIndex\n".encode()
        + b")\x81"
        + _put(1)
        + b"}\x8c\x03fqn\x8c\x01as\x8c\x06offset)sb0"
        + b"}"
        + _get(1)
        + b"K\x00s0"
        + _get(1)
        + b"}\x8c\x06offset"
        + _get(0)
        + b"sb0"
        + _used_as_key(200, 1)
    )
    assert "already hashed" in _timed_refusal(data)


def test_a_value_node_holding_a_long_int_used_as_key_many_times() -> None:
    nodes = pytest.importorskip("omegaconf.nodes")
    node = nodes.AnyNode(1 << 8_000_000)
    data = pickle.dumps([{node: 0} for _ in range(40_000)], 4)
    assert "hashing the file's keys" in _timed_refusal(data)


def test_real_dcp_metadata_and_small_nodes_as_keys_still_load() -> None:
    meta = pytest.importorskip("torch.distributed.checkpoint.metadata")
    nodes = pytest.importorskip("omegaconf.nodes")
    index = {
        meta.MetadataIndex(f"layer{i}.weight", torch.Size([i * 4, 0]), i): f"__{i}_0.distcp"
        for i in range(2000)
    }
    written = meta.Metadata(state_dict_metadata={}, planner_data=None, storage_data=index)
    loaded = load(io.BytesIO(pickle.dumps(written)))
    assert loaded.storage_data == index
    keyed = load(io.BytesIO(pickle.dumps([{nodes.AnyNode(7): 1} for _ in range(1000)], 4)))
    assert len(keyed) == 1000


def _windows_path(memo: int, parts: int) -> bytes:
    return b"cpathlib\nPureWindowsPath\n(" + _get(memo) * parts + b"tR"


def test_equal_windows_paths_as_keys_are_charged_their_text() -> None:
    """A path's ``==`` compares its case-folded text (a fresh string per path; on 3.12+ every
    flavour's), held in slots that the cost of an object's attributes did not see: two
    distinct equal 10 M-character paths from a 10 KB part, the second inserted 10 000 times
    into a dict keyed by the first, took 15 s for a 130 KB file."""
    data = (
        b"\x80\x04X" + struct.pack("<I", 10_000) + b"a" * 10_000 + _put(0)
        + _windows_path(0, 1000) + _put(1) + b"0" + _windows_path(0, 1000) + _put(2) + b"0"
        + b"}" + _get(1) + b"K\x00s" + (_get(2) + b"K\x01s") * 10_000 + b"."
    )  # fmt: skip
    assert "hashing the file's keys" in _timed_refusal(data)
    paths = [pathlib.PureWindowsPath(f"C:/runs/{i}/ckpt.pt") for i in range(100)]
    written = [{p: i, pathlib.PurePosixPath("x"): i} for i, p in enumerate(paths)]
    keyed = load(io.BytesIO(pickle.dumps(written, 4)))
    assert [next(iter(d)) for d in keyed] == paths


def test_equal_numpy_bytes_scalars_as_keys_are_charged_their_length() -> None:
    """numpy's ``bytes_``/``str_`` scalars (``scalar(dtype("S<n>"), raw)``) compare every
    character, but were charged one unit, as any object with a C hash: two equal distinct
    1 MB scalars from one memo-shared 1 MB raw, the second a key 200 000 times in a dict
    keyed by the first (1.8 MB), took 13.5 s, and the time grows as length x uses."""
    np = pytest.importorskip("numpy")
    size = 1_000_000
    scalar = b"cnumpy._core.multiarray\nscalar\nq\x02(h\x00h\x01tR"
    data = (
        b"\x80\x04cnumpy\ndtype\n(X\x08\x00\x00\x00" + f"S{size}".encode() + b"tRq\x000"
        + b"B" + struct.pack("<I", size) + b"a" * size + b"q\x010"
        + scalar + b"q\x030" + b"h\x02(h\x00h\x01tRq\x040"
        + b"}h\x03K\x00s(" + b"h\x04K\x01" * 200_000 + b"u."
    )  # fmt: skip
    assert "comparing the file's keys" in _timed_refusal(data)
    written = [{np.bytes_(b"layer%d" % i): i, np.str_(f"name{i}"): i} for i in range(1000)]
    assert load(io.BytesIO(pickle.dumps(written, 4))) == written


def test_equal_value_nodes_holding_long_text_as_keys_are_charged_its_length() -> None:
    """An object whose class hashes in Python was charged one unit per text attribute, though
    ``==`` with an equal copy reads all of it: two AnyNodes holding distinct equal 1 MB
    strings, the second a key 100 000 times in a dict keyed by the first (2.7 MB), took 20 s."""
    nodes = pytest.importorskip("omegaconf.nodes")
    import pickletools

    first, second = nodes.AnyNode("a" * 1_000_000), nodes.AnyNode("".join(["a" * 1_000_000]))
    written = pickle.dumps([first, second], 4)
    memo, made, previous = -1, [], ""
    for op, _, _ in pickletools.genops(written):
        memo += op.name == "MEMOIZE"
        if op.name == "MEMOIZE" and previous == "NEWOBJ":
            made.append(memo)  # [first, its Metadata, second, its Metadata]
        previous = op.name
    uses = (_get(made[2]) + b"K\x01") * 100_000
    data = written[:-1] + b"0}" + _get(made[0]) + b"K\x00s(" + uses + b"u."
    assert "comparing the file's keys" in _timed_refusal(data)


def test_a_slice_of_long_ints_used_as_key_many_times_is_charged_its_ints() -> None:
    """Python 3.12 made slices hashable: ``hash(slice(a, b, c))`` hashes its three ints at
    every use, uncached, but a slice was charged one unit (a C hash). One slice of three
    100 KB ints used 100 000 times as a dict key is now refused, as a long int or a shared
    tuple is (on 3.9-3.11 a slice key is refused when built as unhashable)."""
    digits = (1 << 800_000) - 1
    raw = digits.to_bytes(100_001, "little", signed=True)
    big = b"\x8b" + struct.pack("<i", len(raw)) + raw  # LONG4
    data = (
        b"\x80\x04cbuiltins\nslice\n(" + big + big + big + b"tR" + _put(0) + b"0"
        + b"}(" + (_get(0) + b"K\x01") * 100_000 + b"u."
    )  # fmt: skip
    assert "hashing the file's keys" in _timed_refusal(data)
