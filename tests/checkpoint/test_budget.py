"""The work budget, tried as an attacker would: each case failed before the budget existed.

Every hostile file is read in a fresh interpreter (``load``, ``inspect`` and the
``compatshim inspect`` CLI), with a time limit and a peak-memory bound, because
the failures these cases caught were crashes (a C recursion in ``hash`` kills
the process), minutes of work on a 470-byte file, or a gigabyte allocated from a
300 KB file. The only acceptable outcomes are a load that returns harmless data
or one of the library's two errors, quickly and within memory.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

pytest.importorskip("torch")

import torch

from tests.checkpoint.corpus import P2, STOP, b, call, g, get, legacy, n, put, t, torch_zip, u

SRC = Path(__file__).resolve().parents[2] / "src"
SECONDS = 60
RSS_BUDGET_MB = 300

Builder = Callable[[Path], Path]
CASES: dict[str, tuple[Builder, str]] = {}


def case(expect: str) -> Callable[[Builder], Builder]:
    """``expect``: "damaged" (CheckpointError only), "unsafe" or "either"."""

    def register(build: Builder) -> Builder:
        CASES[build.__name__] = (build, expect)
        return build

    return register


# --------------------------------------------------------------------------- 1: C recursion


@case("damaged")
def deep_tuple_as_dict_key(folder: Path) -> Path:
    """TUPLE1 200 000 deep (no MARK) as a dict key: hashing it recursed in C and segfaulted."""
    data = P2 + b"}" + n(0) + b"\x85" * 200_000 + b"N" + b"s" + STOP
    return _write(folder, data)


@case("damaged")
def deep_tuple_in_frozenset(folder: Path) -> Path:
    data = P2 + b"(" + n(0) + b"\x85" * 200_000 + b"\x91" + STOP
    return _write(folder, data)


@case("damaged")
def deep_tuple_as_legacy_view_key(folder: Path) -> Path:
    """A legacy storage view whose key is a deep tuple: the view table hashed it."""
    key = n(0) + b"\x85" * 200_000
    view = b"(" + key + n(0) + n(1) + b"t"
    pid = t(u("storage"), g("torch", "FloatStorage"), u("0"), u("cpu"), n(1), view) + b"Q"
    return legacy(
        folder / "legacy.pt", P2 + pid + STOP, ["0"], (1).to_bytes(8, "little") + b"\0" * 4
    )


@case("damaged")
def deep_tuple_as_datetime_unit(folder: Path) -> Path:
    """numpy datetime metadata whose unit is a deep tuple: the unit table hashed it."""
    unit = n(0) + b"\x85" * 200_000
    dtype = call(g("numpy", "dtype"), u("M8"), b"\x89", b"\x88")
    meta = b"(" + unit + n(1) + n(1) + n(1) + b"t"
    state = b"(" + n(4) + u("<") + b"N" + b"N" + b"N" + n(-1) + n(-1) + n(0) + meta + b"t"
    return _write(folder, P2 + dtype + state + b"b" + STOP)


@case("damaged")
def deep_tuple_with_shortcuts(folder: Path) -> Path:
    """200 001 links, every 900th memoized and referenced from the top: the old depth check
    walked the shortcuts first and measured the chain from them."""
    body = bytearray(n(0))  # bytearray: += on bytes copies the whole, quadratic in the length
    memo = []
    for index in range(200_001):
        body += b"\x85"
        if index % 900 == 0:
            body += put(len(memo))
            memo.append(index)
    # The old check walked children last-first: listing the shortcuts from the top link down
    # made it measure each stretch of 900 from a shortcut already seen, never the whole chain.
    shortcuts = b"".join(get(i) for i in reversed(range(len(memo))))
    data = P2 + b"(" + bytes(body) + shortcuts + b"l" + STOP  # [chain, shortcut_k, ..., shortcut_0]
    return _write(folder, data)


@case("damaged")
def deep_list_with_shortcuts(folder: Path) -> Path:
    """The same with lists (each link a list holding the previous one), which ``hash`` cannot
    reach but ``repr``, ``==`` and ``copy.deepcopy`` of the result do."""
    links = 150_000
    body = bytearray(b"]" + put(0))  # bytearray: += on bytes would be quadratic (51 s here)
    for index in range(1, links + 1):
        body += b"](" + get(index - 1) + b"e" + put(index) + b"0"
    shortcuts = b"".join(get(i) for i in reversed(range(0, links, 900)))
    return _write(folder, P2 + bytes(body) + b"0" + b"(" + get(links) + shortcuts + b"l" + STOP)


# --------------------------------------------------------------------------- 2: exponential text


def _memo_dag(depth: int) -> bytes:
    """L0 = [], L(i+1) = [Li, Li]: 2**depth paths in a few hundred bytes (30: ~2**31 characters
    of text for whoever renders it)."""
    out = b"]" + put(0)
    for index in range(1, depth + 1):
        out += b"](" + get(index - 1) + get(index - 1) + b"e" + put(index) + b"0"
    return out + get(depth)


@case("either")
def memo_dag_as_persistent_id_plain(folder: Path) -> Path:
    return _write(folder, P2 + b"(" + _memo_dag(30) + b"tQ" + STOP)


@case("either")
def memo_dag_as_persistent_id_zip(folder: Path) -> Path:
    return torch_zip(folder / "zip.pt", P2 + b"(" + _memo_dag(30) + b"tQ" + STOP)


@case("either")
def memo_dag_as_storage_key_zip(folder: Path) -> Path:
    pid = b"(" + u("storage") + g("torch", "FloatStorage") + _memo_dag(30) + u("cpu") + n(1)
    return torch_zip(folder / "zip.pt", P2 + pid + b"tQ" + STOP)


@case("either")
def memo_dag_as_storage_key_legacy(folder: Path) -> Path:
    pid = b"(" + u("storage") + g("torch", "FloatStorage") + _memo_dag(30) + u("cpu") + n(1)
    return legacy(folder / "legacy.pt", P2 + pid + b"N" + b"tQ" + STOP, ["0"], b"")


@case("damaged")
def memo_dag_as_legacy_protocol(folder: Path) -> Path:
    """The legacy header's second pickle (its protocol number) is a file value too: the
    message about a wrong protocol rendered it whole before cutting it to 20 characters."""
    magic = pickle.dumps(0x1950A86A20F9469CFC6C, 2)
    return _write(folder, magic + P2 + _memo_dag(30) + STOP)


@case("either")
def memo_dag_in_refused_call(folder: Path) -> Path:
    """A refused global called with the DAG: error paths must not render the argument."""
    return _write(folder, P2 + g("os", "system") + b"(" + _memo_dag(30) + b"tR" + STOP)


@case("either")
def memo_dag_as_bad_constructor_argument(folder: Path) -> Path:
    return _write(folder, P2 + g("builtins", "slice") + b"(" + _memo_dag(30) + b"tR" + STOP)


@case("either")
def chained_calls_on_call_results(folder: Path) -> Path:
    """``f()()()...`` 150 000 times: the scanner named each result after the previous one."""
    return _write(folder, P2 + g("os", "system") + b")R" * 150_000 + STOP)


# --------------------------------------------------------------------------- 3: memo reuse

BLOB = 256 * 1024
REUSE = 4000


def _legacy_storage_bytes() -> bytes:
    buffer = io.BytesIO()
    torch.save(
        torch.zeros(BLOB // 4).untyped_storage(), buffer, _use_new_zipfile_serialization=False
    )
    return buffer.getvalue()


def _reused(func: bytes, arg: bytes) -> bytes:
    head = P2 + func + put(0) + arg + put(1) + b"0" + b"0" + b"]" + b"("
    body = (get(0) + b"(" + get(1) + b"tR") * REUSE
    return head + body + b"e" + STOP


@case("damaged")
def load_from_bytes_reused(folder: Path) -> Path:
    """One 256 KiB legacy storage blob passed 4 000 times: +1 GB from a 310 KB file."""
    blob = _legacy_storage_bytes()
    return _write(folder, _reused(g("torch.storage", "_load_from_bytes"), b(blob)))


@case("damaged")
def bytearray_of_reused_bytes(folder: Path) -> Path:
    return _write(folder, _reused(g("builtins", "bytearray"), b(b"\0" * BLOB)))


@case("damaged")
def codecs_encode_of_reused_text(folder: Path) -> Path:
    text = u("a" * BLOB) + u("latin1")
    head = P2 + g("_codecs", "encode") + put(0) + b"(" + text + b"t" + put(1) + b"0" + b"0"
    body = (get(0) + get(1) + b"R") * REUSE
    return _write(folder, head + b"](" + body + b"e" + STOP)


@case("damaged")
def frozenset_of_reused_list(folder: Path) -> Path:
    items = b"](" + b"".join(n(i) for i in range(20_000)) + b"e"
    return _write(folder, _reused(g("builtins", "frozenset"), items))


# --------------------------------------------------------------------------- 5: live callables


def _value(module: str, name: str) -> Callable[[Path], Path]:
    def build(folder: Path) -> Path:
        return _write(folder, P2 + b"}" + u("f") + g(module, name) + b"s" + STOP)

    build.__name__ = f"callable_as_value_{module.replace('.', '_')}_{name}"
    return build


for _module, _name in (
    ("torch.storage", "_load_from_bytes"),
    ("copyreg", "_reconstructor"),
    ("torch._utils", "_rebuild_tensor_v2"),
    ("torch._utils", "_rebuild_parameter"),
    ("torch._tensor", "_rebuild_from_type_v2"),
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"),
):
    case("unsafe")(_value(_module, _name))


# --------------------------------------------------------------------------- the child process

CHILD = textwrap.dedent(
    """
    import json, resource, sys, time
    import numpy, torch  # imported before the clock starts: the limit is on the load's own work
    from compatshim.checkpoint import CheckpointError, UnsafeCheckpointError, inspect, load
    path = sys.argv[1]
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    for mode, read in (("load", load), ("inspect", inspect)):
        start = time.perf_counter()
        outcome = "loaded"
        try:
            read(path)
        except UnsafeCheckpointError:
            outcome = "unsafe"
        except CheckpointError:
            outcome = "damaged"
        except BaseException as exc:
            outcome = "escaped " + type(exc).__name__
        seconds = time.perf_counter() - start
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - base
        print(json.dumps({"mode": mode, "outcome": outcome, "seconds": seconds, "rss": rss}))
        sys.stdout.flush()
    """
)


def _write(folder: Path, data: bytes) -> Path:
    path = folder / "hostile.pkl"
    path.write_bytes(data)
    return path


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")])
    return env


def _run(path: Path) -> dict[str, dict[str, object]]:
    """One interpreter loads, then inspects; its peak memory over both is held to the budget
    (the peak is monotonic, so each read is under it when the last one is)."""
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(path)],
        capture_output=True,
        text=True,
        timeout=2 * SECONDS,
        env=_env(),
    )
    assert done.returncode == 0, f"crashed (exit {done.returncode}): {done.stderr[-800:]}"
    lines = [json.loads(line) for line in done.stdout.strip().splitlines()]
    return {str(line["mode"]): line for line in lines}


@pytest.mark.slow
@pytest.mark.timeout(4 * SECONDS)
@pytest.mark.parametrize("name", sorted(CASES))
def test_hostile_file_is_refused_quickly_within_memory(name: str, tmp_path: Path) -> None:
    build, expect = CASES[name]
    path = build(tmp_path)
    found = _run(path)
    allowed = {"damaged": {"damaged"}, "unsafe": {"unsafe"}, "either": {"damaged", "unsafe"}}
    loaded, inspected = found["load"], found["inspect"]
    assert loaded["outcome"] in allowed[expect], loaded
    assert not str(inspected["outcome"]).startswith("escaped"), inspected
    for read in (loaded, inspected):
        assert float(read["rss"]) < RSS_BUDGET_MB, read  # type: ignore[arg-type]
        assert float(read["seconds"]) < 0.75 * SECONDS, read  # type: ignore[arg-type]


@pytest.mark.timeout(SECONDS)
def test_cli_survives_the_deep_key(tmp_path: Path) -> None:
    path = deep_tuple_as_dict_key(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "compatshim", "inspect", str(path)],
        capture_output=True,
        text=True,
        timeout=SECONDS,
        env=_env(),
    )
    assert done.returncode in (0, 1, 2), done.stderr[-800:]
    assert "Traceback" not in done.stderr


def test_budget_counts_memo_reuse_not_only_each_call(tmp_path: Path) -> None:
    """A real file reusing one small argument a few times still loads (the budget has room)."""
    head = P2 + g("builtins", "bytearray") + put(0) + b(b"x" * 100) + put(1) + b"0" + b"0"
    body = (get(0) + b"(" + get(1) + b"tR") * 50
    path = _write(tmp_path, head + b"](" + body + b"e" + STOP)
    from compatshim.checkpoint import load

    value = load(path)
    assert len(value) == 50 and value[0] == bytearray(b"x" * 100)


def test_harmless_classes_may_still_be_values(tmp_path: Path) -> None:
    """Classes and constants as values are data (torch's own loader returns them too)."""
    data = P2 + b"(" + g("collections", "OrderedDict") + g("torch", "float32") + b"l" + STOP
    from compatshim.checkpoint import load

    value = load(_write(tmp_path, data))
    import collections

    assert value == [collections.OrderedDict, torch.float32]


def test_pickle_of_the_cases_is_what_python_writes() -> None:
    """The assembler's TUPLE1 chain is what pickle itself writes for nested 1-tuples."""
    nested: object = 0
    for _ in range(3):
        nested = (nested,)
    assert pickle.loads(P2 + n(0) + b"\x85" * 3 + STOP) == nested
