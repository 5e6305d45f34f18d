"""Containers the pickle's own opcodes build are charged (issue 37, item 6): 5 MB of
EMPTY_SET opcodes took +1.45 GB and 44 s (290x the file, against the documented 8x + 32 MiB).
Now each container an opcode makes counts what it takes; a genuine file stays far below."""

from __future__ import annotations

import io
import pickle

import pytest

from compatshim import checkpoint


def _many(opcode: bytes, count: int) -> bytes:
    """``count`` containers made by ``opcode``, each left on the stack, then one list: the
    stack itself keeps every one alive (as the attack file did)."""
    return b"\x80\x04" + b"(" + opcode * count + b"l."


@pytest.mark.timeout(120)
@pytest.mark.parametrize("opcode", [b"\x8f", b"}", b"]", b"(\x91", b"(l", b"(d"])
def test_opcode_built_containers_are_charged(opcode: bytes) -> None:
    data = _many(opcode, 1_000_000)  # 1-2 MB of file; 56-216 MB of containers unbounded
    with pytest.raises(checkpoint.CheckpointError, match="opcodes build more containers"):
        checkpoint.load(io.BytesIO(data))


def test_genuine_containers_still_load() -> None:
    value = {"layers": [{"w": [1.0] * 8, "tags": {"a", "b"}} for _ in range(20_000)]}
    for protocol in (2, 4):
        assert checkpoint.load(io.BytesIO(pickle.dumps(value, protocol=protocol))) == value
    empties = [set() for _ in range(100_000)]  # 216 bytes each from 2 bytes: within the floor
    assert len(checkpoint.load(io.BytesIO(pickle.dumps(empties, protocol=4)))) == 100_000
