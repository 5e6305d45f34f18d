"""The fuzz run, in its own interpreter so that its peak RSS can be measured on its own.

``python -m checkpoint.fuzz_child FOLDER EXAMPLES`` mutates real torch.save
files (zip and legacy) and plain pickles: byte flips, truncations, inserted
opcodes and hostile snippets, both in the raw bytes and inside a zip's
data.pkl. Every mutant must load or raise a library error (same for
``inspect``), and the marker file must never appear. Prints the peak RSS.
"""

from __future__ import annotations

import contextlib
import io
import pickle
import resource
import sys
import zipfile
from pathlib import Path

import numpy as np
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compatshim.checkpoint import CheckpointError, inspect, load
from tests.checkpoint.corpus import call, g, u

FOLDER = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(".")
EXAMPLES = int(sys.argv[2]) if len(sys.argv) > 2 else 100
MARKER = FOLDER / "PWNED"


def _bases() -> dict[str, bytes]:
    small = {
        "w": torch.arange(6.0).view(2, 3),
        "v": torch.arange(6.0)[1:4],
        "np": np.arange(4, dtype=np.uint32),
        "od": {"a": [1, 2.5, "x", None, (True, b"y")]},
    }
    bases = {}
    for name, zip_format, protocol in (("zip2", True, 2), ("zip5", True, 5), ("legacy", False, 2)):
        buffer = io.BytesIO()
        torch.save(
            small, buffer, _use_new_zipfile_serialization=zip_format, pickle_protocol=protocol
        )
        bases[name] = buffer.getvalue()
    plain = {"np": np.arange(3), "state": np.random.get_state(), "t": (1, 2.0, "s")}
    bases["pickle2"] = pickle.dumps(plain, 2)
    bases["pickle5"] = pickle.dumps(plain, 5)
    return bases


BASES = _bases()
SNIPPETS = [
    g("os", "system"),
    g("builtins", "eval"),
    u(f"touch {MARKER}"),
    call(g("os", "system"), u(f"touch {MARKER}")),
    b"R",
    b"b",
    b"\x81",
    b"s",
    b"a",
    b"(",
    b"t",
    b"0",
    b"2",
    b"Q",
    b"\x93",
    b"\x82\x01",
    b"\x8e\xff\xff\xff\xff\xff\xff\xff\x7f",
    b"\x8b\xff\xff\xff\x7f",
    b"J\xff\xff\xff\xff",
]


def _replace_data_pkl(archive: bytes, mutate: object) -> bytes:
    source = zipfile.ZipFile(io.BytesIO(archive))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as target:
        for info in source.infolist():
            data = source.read(info.filename)
            if info.filename.endswith("data.pkl"):
                data = mutate(data)  # type: ignore[operator]
            target.writestr(info.filename, data)
    return out.getvalue()


@st.composite
def mutants(draw: st.DrawFn) -> bytes:
    base = BASES[draw(st.sampled_from(sorted(BASES)))]
    inner = base.startswith(b"PK") and draw(st.booleans())

    def mutate(data: bytes) -> bytes:
        data = bytearray(data)
        for _ in range(draw(st.integers(1, 4))):
            kind = draw(st.sampled_from(["flip", "truncate", "insert", "snippet"]))
            at = draw(st.integers(0, max(len(data) - 1, 0)))
            if kind == "flip" and data:
                data[at] = draw(st.integers(0, 255))
            elif kind == "truncate":
                del data[at:]
            elif kind == "insert":
                data[at:at] = draw(st.binary(min_size=1, max_size=9))
            else:
                data[at:at] = draw(st.sampled_from(SNIPPETS))
        return bytes(data)

    return _replace_data_pkl(base, mutate) if inner else mutate(base)


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)
@given(data=mutants())
def fuzz(data: bytes) -> None:
    path = FOLDER / "mutant.pt"
    path.write_bytes(data)
    for run in (load, inspect):
        with contextlib.suppress(CheckpointError):
            run(path)
    assert not MARKER.exists(), "code from a mutant ran"


if __name__ == "__main__":
    fuzz()
    print("PEAK", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
