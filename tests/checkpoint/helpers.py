"""Shared by the checkpoint tests: a realistic checkpoint, a strict comparison, isolated runs.

``realistic()`` is what a training loop saves (model and optimizer state,
scheduler, every RNG, hyper-parameters as an argparse.Namespace, paths,
timestamps, numpy arrays, views sharing storage). ``assert_same`` compares
two loaded objects type by type, including which tensors share a storage.
``peak_rss_mb`` runs code in a fresh interpreter and returns its peak RSS.
``storage_reads`` records each zip storage record a load reads. ``legacy_bytes`` is a small
file in torch's legacy (non-zip) format, for the tests that cut it at every byte.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import io
import json
import os
import pathlib
import random
import subprocess
import sys
import textwrap
from typing import Any

import numpy as np
import torch

TESTS = pathlib.Path(__file__).resolve().parent.parent
ROOT = TESTS.parent  # on sys.path of child interpreters: they import tests.checkpoint.*


class Box:
    """A plain user class: refused unless a test allows it."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return type(other) is Box and other.value == self.value

    __hash__ = None  # type: ignore[assignment]


def realistic(seed: int = 0) -> dict[str, Any]:
    """A checkpoint as a training loop writes it; deterministic for a seed."""
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(), torch.nn.Linear(16, 4)
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10)
    model(torch.randn(5, 8)).sum().backward()
    optimizer.step()
    scheduler.step()
    base = torch.arange(24, dtype=torch.float32)
    return {
        "epoch": 3,
        "global_step": 1234,
        "state_dict": model.state_dict(),
        "optimizer_states": [optimizer.state_dict()],
        "lr_schedulers": [scheduler.state_dict()],
        "rng": {
            "python": random.getstate(),
            "numpy": np.random.get_state(),
            "torch": torch.get_rng_state(),
        },
        "hparams": argparse.Namespace(
            lr=1e-3, batch_size=32, name="run-1", betas=(0.9, 0.999), data=[pathlib.Path("/d/a")]
        ),
        "paths": {
            "out": pathlib.PurePosixPath("/tmp/out"),
            "win": pathlib.PureWindowsPath("C:/runs/x"),
            "here": pathlib.Path("relative/file.txt"),
        },
        "saved_at": datetime.datetime(2026, 11, 23, 12, 30, 5, 123, tzinfo=datetime.timezone.utc),
        "day": datetime.date(2026, 11, 23),
        "alarm": datetime.time(7, 15),
        "took": datetime.timedelta(days=1, seconds=5),
        "ordered": collections.OrderedDict([("b", 2), ("a", 1)]),
        "counter": collections.Counter({"x": 3, "y": 1}),
        "history": collections.deque([1.0, 2.0], maxlen=5),
        "by_key": collections.defaultdict(list, {"k": [1, 2]}),
        "nested": {
            "list": [1, (2, 3.5), {"none": None, "flag": True}],
            "bytes": b"\x00\xff",
            "buffer": bytearray(b"ab"),
            "set": {1, 2, 3},
            "frozen": frozenset({"x"}),
            "complex": 1 + 2j,
            "slice": slice(1, 10, 2),
            "big": 2**70,
            "text": "ünïcode",
        },
        "numpy": {
            "f32": np.arange(6, dtype=np.float32).reshape(2, 3),
            "i64": np.arange(3, dtype=np.int64),
            "u8_fortran": np.asfortranarray(np.arange(6, dtype=np.uint8).reshape(2, 3)),
            "big_endian": np.arange(3, dtype=">i4"),
            "bool": np.array([True, False]),
            "str": np.array(["ab", "c"]),
            "when": np.array(["2026-11-23"], dtype="datetime64[D]"),
            "scalar": np.float64(0.25),
            "int_scalar": np.int32(7),
            "dtype": np.dtype("float16"),
        },
        "tensors": {
            "base": base,
            "view": base[2:10],
            "strided": base.view(4, 6)[:, ::2],
            "transposed": base.view(4, 6).t(),
            "expanded": torch.ones(1).expand(4),
            "param": torch.nn.Parameter(torch.ones(3)),
            "frozen_param": torch.nn.Parameter(torch.ones(2), requires_grad=False),
            "bf16": torch.arange(4, dtype=torch.bfloat16),
            "half": torch.arange(4, dtype=torch.float16),
            "int8": torch.arange(-2, 2, dtype=torch.int8),
            "bool": torch.tensor([True, False]),
            "complex": torch.tensor([1 + 2j], dtype=torch.complex64),
            "empty": torch.empty(0, 3),
            "scalar": torch.tensor(3.5),
            "size": torch.Size([2, 3]),
            "device": torch.device("cpu"),
            "dtype": torch.float64,
        },
    }


def legacy_bytes() -> bytes:
    """A tensor, an int, a str and a tuple saved with ``_use_new_zipfile_serialization=False``:
    every kind of legacy record (pickle opcodes, the storage keys, the storage data)."""
    buffer = io.BytesIO()
    state = {"w": torch.arange(10.0), "n": 3, "s": "abc", "t": (1.5, "x" * 40)}
    torch.save(state, buffer, _use_new_zipfile_serialization=False)
    return buffer.getvalue()


def _storage_key(tensor: torch.Tensor) -> Any:
    if tensor.device.type == "meta":
        return None
    return tensor.untyped_storage().data_ptr()


def assert_same(
    expected: Any, got: Any, path: str = "root", pairs: list[Any] | None = None
) -> None:
    """Same types and values all the way down; tensors also same strides and storage sharing."""
    top = pairs is None
    pairs = [] if pairs is None else pairs
    assert type(expected) is type(got), f"{path}: {type(expected)} != {type(got)}"
    if isinstance(expected, torch.Tensor):
        assert expected.dtype == got.dtype, path
        assert expected.shape == got.shape, path
        assert expected.stride() == got.stride(), path
        assert expected.storage_offset() == got.storage_offset(), path
        assert expected.requires_grad == got.requires_grad, path
        assert expected.device == got.device, path
        if expected.device.type != "meta":
            assert torch.equal(expected.resolve_conj(), got.resolve_conj()), path
            pairs.append((path, expected, got))
    elif isinstance(expected, np.ndarray):
        assert expected.dtype == got.dtype and expected.shape == got.shape, path
        assert expected.flags.f_contiguous == got.flags.f_contiguous, path
        assert np.array_equal(expected, got), path
    elif isinstance(expected, dict):
        assert list(expected) == list(got), f"{path}: keys {list(expected)} != {list(got)}"
        for key in expected:
            assert_same(expected[key], got[key], f"{path}[{key!r}]", pairs)
        if isinstance(expected, collections.defaultdict):
            assert expected.default_factory is got.default_factory, path
        extra = getattr(expected, "__dict__", {})
        assert extra.keys() == getattr(got, "__dict__", {}).keys(), path
    elif isinstance(expected, (list, tuple, collections.deque)):
        assert len(expected) == len(got), path
        for index, (a, b) in enumerate(zip(expected, got)):
            assert_same(a, b, f"{path}[{index}]", pairs)
        if isinstance(expected, collections.deque):
            assert expected.maxlen == got.maxlen, path
    elif isinstance(expected, argparse.Namespace):
        assert_same(vars(expected), vars(got), f"{path}.__dict__", pairs)
    else:
        assert expected == got, f"{path}: {expected!r} != {got!r}"
    if top:
        _assert_same_sharing(pairs)


def _assert_same_sharing(pairs: list[Any]) -> None:
    """Tensors that share a storage in ``expected`` share one in ``got``, and no others do."""
    for i, (path_a, exp_a, got_a) in enumerate(pairs):
        for path_b, exp_b, got_b in pairs[i + 1 :]:
            shared = _storage_key(exp_a) == _storage_key(exp_b)
            assert (_storage_key(got_a) == _storage_key(got_b)) == shared, (path_a, path_b)


def digest(value: Any) -> Any:
    """A JSON-able summary equal across torch/numpy releases for equal checkpoints."""
    if isinstance(value, torch.Tensor):
        data = value.detach()
        total = float(data.to(torch.float64).sum()) if data.numel() and not data.is_complex() else 0
        return ["tensor", type(value).__name__, str(value.dtype), list(value.shape), total]
    if isinstance(value, np.ndarray):
        total = float(value.astype(np.float64).sum()) if value.dtype.kind in "biuf" else str(value)
        return ["ndarray", value.dtype.str, list(value.shape), total]
    if isinstance(value, np.dtype):
        return ["npdtype", value.str]
    if isinstance(value, np.generic):
        return ["npscalar", value.dtype.str, value.item()]
    if isinstance(value, dict):
        return [type(value).__name__, [[str(k), digest(v)] for k, v in value.items()]]
    if isinstance(value, (list, tuple, collections.deque)):
        return [type(value).__name__, [digest(v) for v in value]]
    if isinstance(value, argparse.Namespace):
        return ["Namespace", digest(vars(value))]
    if isinstance(value, (set, frozenset)):
        return [type(value).__name__, sorted(map(repr, value))]
    if isinstance(value, (int, float, str, bool, type(None))):
        return value
    return [type(value).__name__, repr(value)]


def versions() -> dict[str, str]:
    return {
        "torch": torch.__version__.split("+")[0],
        "numpy": np.__version__,
        "python": ".".join(map(str, sys.version_info[:3])),
    }


def write_json(path: pathlib.Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=1, sort_keys=True) + "\n")


def storage_reads(monkeypatch: Any) -> list[str]:
    """The zip storage records every load reads from now on, by name ("data/0"): spied at
    ``ZipStorages._read``, which each read takes (through the checked directory, torch's
    reader or an mmap), so nothing read is missed whichever way it goes."""
    from compatshim.checkpoint._load import ZipStorages

    reads: list[str] = []
    real = ZipStorages._read

    def spy(self: Any, torch: Any, record: Any, key: str, nbytes: int) -> Any:
        reads.append(f"data/{key}")
        return real(self, torch, record, key, nbytes)

    monkeypatch.setattr(ZipStorages, "_read", spy)
    return reads


def bytes_read() -> int:
    """Bytes this process has read so far (Linux's ``/proc/self/io`` ``rchar``: every read
    call, page cache or not; a mapped file's pages are not counted); skips the test where
    that count is not available."""
    try:
        text = pathlib.Path("/proc/self/io").read_text()
    except OSError:
        import pytest

        pytest.skip("/proc/self/io is not available: no count of the bytes read")
    return int(text.split("rchar:", 1)[1].split()[0])


def peak_rss_mb(code: str, timeout: float = 300, flags: tuple[str, ...] = ()) -> tuple[float, str]:
    """Run ``code`` in a fresh interpreter; (its peak RSS in MB, its stdout)."""
    script = textwrap.dedent(code) + "\nimport resource as _r\n"
    script += "print('PEAK', _r.getrusage(_r.RUSAGE_SELF).ru_maxrss / 1024)\n"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    done = subprocess.run(
        [sys.executable, *flags, "-c", script],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out, _, peak = done.stdout.rpartition("PEAK")
    return float(peak), out
