"""Corrupt states raise RNGStateError and change nothing: never a crash, never a partial restore."""

from __future__ import annotations

import copy
import warnings
import zipfile
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import compatshim.rng as rng
from compatshim.rng import devices
from tests.harness.dtypes import saves
from tests.rng.workers import draws

BASE = rng.capture()
PATHS = [
    ("python",),
    ("python", "version"),
    ("python", "internal"),
    ("python", "gauss_next"),
    ("numpy",),
    ("numpy", "bit_generator"),
    ("numpy", "key"),
    ("numpy", "pos"),
    ("numpy", "has_gauss"),
    ("numpy", "cached_gaussian"),
    ("torch_cpu",),
    ("cuda",),
    ("xpu",),
    ("mps",),
    ("meta",),
    ("format",),
    ("version",),
]

junk = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.binary(max_size=8),
    st.lists(st.integers(-3, 2**33), max_size=5),
    st.builds(lambda n: torch.zeros(n, dtype=torch.uint8), st.integers(0, 40)),
    st.builds(lambda n: torch.zeros(n, dtype=torch.float32), st.integers(0, 40)),
    st.builds(lambda n: torch.full((n,), 2**33, dtype=torch.int64), st.integers(600, 630)),
    st.just([torch.zeros(15, dtype=torch.uint8)]),
    st.just({"a": 1}),
)


def mutate(state: dict[str, Any], path: tuple[str, ...], action: str, value: Any) -> dict[str, Any]:
    broken = copy.deepcopy(state)
    holder: Any = broken
    for key in path[:-1]:
        holder = holder[key]
    key = path[-1]
    if not isinstance(holder, dict):
        return broken
    if action == "delete":
        holder.pop(key, None)
    elif action == "truncate" and isinstance(holder.get(key), torch.Tensor):
        holder[key] = holder[key][: max(0, holder[key].numel() - 1 - (hash(str(value)) % 7))]
    elif action == "retype" and isinstance(holder.get(key), torch.Tensor):
        holder[key] = holder[key].to(torch.float64)
    else:
        holder[key] = value
    return broken


def snapshot() -> list[Any]:
    return [devices.accessors(label)[0]() for label in ("python", "numpy", "torch_cpu")]


def same(a: list[Any], b: list[Any]) -> bool:
    return (
        a[0] == b[0]
        and a[1][0] == b[1][0]
        and bool((a[1][1] == b[1][1]).all())
        and a[1][2:] == b[1][2:]
        and torch.equal(a[2], b[2])
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    path=st.sampled_from(PATHS),
    action=st.sampled_from(["replace", "delete", "truncate", "retype"]),
    value=junk,
)
def test_fuzzed_corrupt_state_raises_and_changes_nothing(
    path: tuple[str, ...], action: str, value: Any
) -> None:
    broken = mutate(BASE, path, action, value)
    before = snapshot()
    try:
        rng.restore(broken, warn=False)
    except rng.RNGStateError:
        assert same(snapshot(), before), "a failed restore changed a generator"
    # else: the mutation left a valid state (e.g. another finite cached_gaussian); fine


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (("torch_cpu",), torch.zeros(100, dtype=torch.uint8), "torch_cpu"),
        (("torch_cpu",), torch.zeros(5056, dtype=torch.int64), "uint8"),
        (("numpy", "key"), torch.zeros(623, dtype=torch.int64), "624 words"),
        (("numpy", "pos"), 625, r"\[0, 624\]"),
        (("python", "internal"), [1, 2, 3], "625 words"),
        (("cuda",), [torch.zeros(17, dtype=torch.uint8)], "16 bytes"),
        (("format",), "something", "format"),
    ],
)
def test_specific_corruptions_name_the_problem(
    path: tuple[str, ...], value: Any, message: str
) -> None:
    before = snapshot()
    with pytest.raises(rng.RNGStateError, match=message):
        rng.restore(mutate(BASE, path, "replace", value))
    assert same(snapshot(), before)


def zero_key(words: int, top_bit: bool = False) -> torch.Tensor:
    """An MT19937 key of zeros (the first word's top bit set if ``top_bit``: still valid)."""
    key = torch.zeros(words, dtype=torch.int64)
    key[0] = 0x80000000 if top_bit else 0x7FFFFFFF  # the low 31 bits of word 0 are never used
    return key


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("python", "internal"), torch.zeros(625, dtype=torch.int64)),
        (("numpy", "key"), zero_key(624)),
    ],
)
def test_an_all_zero_mt19937_key_is_refused_as_torch_refuses_one(
    path: tuple[str, ...], value: torch.Tensor
) -> None:
    """A zeroed Python or numpy key was accepted and left a generator returning only zeros."""
    before = snapshot()
    with pytest.raises(rng.RNGStateError, match=f"{path[0]}.*all-zero MT19937 key"):
        rng.restore(mutate(BASE, path, "replace", value))
    assert same(snapshot(), before)


def test_an_all_zero_mt19937_key_in_another_frameworks_dict_is_refused() -> None:
    import random

    import numpy as np

    numpy_state = ("MT19937", np.zeros(624, dtype=np.uint32), 624, 0, 0.0)
    with pytest.raises(rng.RNGStateError, match=r"state\.numpy.*all-zero MT19937 key"):
        rng.restore({"python": random.getstate(), "numpy": numpy_state, "cpu": BASE["torch_cpu"]})
    python_state = (3, (0,) * 624 + (624,), None)
    with pytest.raises(rng.RNGStateError, match=r"state\.python.*all-zero MT19937 key"):
        rng.restore({"python": python_state, "numpy": np.random.get_state()})


def test_a_key_whose_only_set_bit_is_the_top_of_word_0_is_valid() -> None:
    """MT19937 uses only that bit of word 0: numpy seeds so, and the stream is not zeros."""
    state = mutate(BASE, ("numpy", "key"), "replace", zero_key(624, top_bit=True))
    rng.restore(state)
    import numpy as np

    assert np.random.rand(4).any()


@pytest.mark.parametrize("trusted", [False, True])
def test_a_flipped_bit_in_a_saved_file_is_refused(tmp_path: Path, trusted: bool) -> None:
    """Neither torch's reader nor compatshim.checkpoint.load checks the zip CRC32s: one flipped
    bit in the numpy key changed its stream while the report said exact."""
    path = rng.save(tmp_path / "rng.pt")
    raw = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as archive:
        record = next(i for i in archive.infolist() if i.filename.endswith("data/1"))
    raw[record.header_offset + 30 + len(record.filename) + len(record.extra) + 100] ^= 0x01
    path.write_bytes(bytes(raw))
    before = snapshot()
    with pytest.raises(rng.RNGStateError, match=r"data/1.*CRC"):
        rng.load(path, trusted=trusted)
    assert same(snapshot(), before)


def test_missing_key_is_reported() -> None:
    with pytest.raises(rng.RNGStateError, match="missing key 'torch_cpu'"):
        rng.restore(mutate(BASE, ("torch_cpu",), "delete", None))


def test_failure_while_setting_puts_back_what_was_set(monkeypatch: pytest.MonkeyPatch) -> None:
    """If a late write fails (a device error), the earlier writes are undone."""
    state = rng.capture()
    draws()  # move every generator on, so a partial restore would show
    before = snapshot()
    real = devices.accessors

    def failing(label: str) -> Any:
        get, set_ = real(label)
        if label == "torch_cpu":

            def broken(_: Any) -> None:
                raise RuntimeError("device lost")

            return get, broken
        return get, set_

    monkeypatch.setattr(devices, "accessors", failing)
    with pytest.raises(rng.RNGStateError, match=r"restoring torch_cpu failed.*put back"):
        rng.restore(state)
    monkeypatch.undo()
    assert same(snapshot(), before)


UNSIGNED = [getattr(torch, name) for name in ("uint16", "uint32", "uint64") if hasattr(torch, name)]


@pytest.mark.skipif(not UNSIGNED, reason="torch < 2.3 has no uint16/32/64")
@pytest.mark.parametrize("path", [("python", "internal"), ("numpy", "key")])
@pytest.mark.parametrize("dtype", UNSIGNED, ids=str)
def test_unsigned_word_tensors_whose_values_fit_restore_exactly(
    path: tuple[str, ...], dtype: torch.dtype
) -> None:
    """``torch.from_numpy(np.random.get_state()[1])`` is a uint32 tensor: torch's min() raised
    NotImplementedError ("min_all" not implemented for 'UInt32') instead of reading it."""
    words = BASE[path[0]][path[1]]
    if dtype == torch.uint16:
        words = words % 65536  # a valid key that fits 16 bits
    expected_state = mutate(BASE, path, "replace", words)
    rng.restore(expected_state, warn=False)
    want = draws()
    rng.restore(mutate(BASE, path, "replace", words.to(dtype)), warn=False)
    assert draws() == want


@pytest.mark.skipif(not hasattr(torch, "uint64"), reason="torch < 2.3 has no uint64")
@pytest.mark.parametrize("path", [("python", "internal"), ("numpy", "key")])
def test_unsigned_word_tensors_past_uint32_are_refused(path: tuple[str, ...]) -> None:
    listed = BASE[path[0]][path[1]].tolist()
    listed[3] = 2**63 + 5  # would wrap to a negative int64, or read as a huge word
    words = torch.tensor(listed, dtype=torch.uint64)
    before = snapshot()
    with pytest.raises(rng.RNGStateError, match=rf"{path[1]}.*uint32 range"):
        rng.restore(mutate(BASE, path, "replace", words))
    assert same(snapshot(), before)


@pytest.mark.parametrize("path", [("python", "internal"), ("numpy", "key"), ("torch_cpu",)])
def test_sparse_word_tensors_are_refused_naming_the_field(path: tuple[str, ...]) -> None:
    """A sparse key reached torch's min(), which raised NotImplementedError for SparseCPU."""
    holder: Any = BASE
    for key in path:
        holder = holder[key]
    before = snapshot()
    with pytest.raises(rng.RNGStateError, match=rf"{path[-1]}.*sparse"):
        rng.restore(mutate(BASE, path, "replace", holder.to_sparse()))
    assert same(snapshot(), before)


def test_a_quantized_word_tensor_is_refused() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # quantize_per_tensor is deprecated in newer torch
        words = torch.quantize_per_tensor(torch.ones(624), 1.0, 0, torch.quint8)
    with pytest.raises(rng.RNGStateError, match=r"key.*integer tensor"):
        rng.restore(mutate(BASE, ("numpy", "key"), "replace", words))


@pytest.mark.skipif(not saves("uint32"), reason="this torch cannot torch.save uint32 tensors")
def test_a_transformers_numpy_key_from_torch_from_numpy_loads(tmp_path: Path) -> None:
    """The realistic case: numpy's uint32 key turned into a tensor before torch.save."""
    import random

    import numpy as np

    name, key, pos, has_gauss, cached = np.random.get_state()
    numpy_state = (name, torch.from_numpy(key.copy()), pos, has_gauss, cached)
    torch.save(
        {"python": random.getstate(), "numpy": numpy_state, "cpu": torch.get_rng_state()},
        tmp_path / "rng_state.pth",
    )
    want = draws()
    assert rng.load(tmp_path / "rng_state.pth", warn=False).exact
    assert draws() == want


def own_file(**changes: Any) -> dict[str, Any]:
    found: dict[str, Any] = {
        "format": "compatshim.rng.file",
        "version": 1,
        "source": "compatshim",
        "world_size": 1,
        "ranks": [copy.deepcopy(BASE)],
    }
    found.update(changes)
    return found


@pytest.mark.parametrize("version", [9, 2, 0, None, "1", True, 1.0])
def test_a_file_of_an_unknown_version_is_refused_naming_both(tmp_path: Path, version: Any) -> None:
    """Detect, don't guess: version 9 was read as if it were version 1."""
    before = snapshot()
    found = own_file(version=version)
    with pytest.raises(rng.RNGStateError, match=r"version .*known: 1"):
        rng.restore(found)
    for name in ("rng.pt", "rng_state.pth"):  # rng_state.pth was rebuilt as a version 1 file
        torch.save(found, tmp_path / name)
        with pytest.raises(rng.RNGStateError, match=r"version .*known: 1"):
            rng.load(tmp_path / name)
    assert same(snapshot(), before)


@pytest.mark.parametrize(
    ("world_size", "saved_rank", "message"),
    [
        (None, -3, "saved_rank"),
        (None, 10**7, "saved_rank"),
        (None, True, "saved_rank"),
        (None, "0", "saved_rank"),
        (None, 1.0, "saved_rank"),
        (1, 0, "saved_rank.*world_size"),
        (1, 5, "saved_rank.*world_size"),
    ],
)
def test_a_saved_rank_the_format_cannot_hold_is_refused(
    tmp_path: Path, world_size: Any, saved_rank: Any, message: str
) -> None:
    """saved_rank -3 was accepted and reported as "state of saved rank -3"; a non-int one was
    dropped silently. It is written only beside world_size None, as a rank number."""
    before = snapshot()
    found = own_file(world_size=world_size, saved_rank=saved_rank)
    with pytest.raises(rng.RNGStateError, match=message):
        rng.restore(found)
    torch.save(found, tmp_path / "rng.pt")
    with pytest.raises(rng.RNGStateError, match=message):
        rng.load(tmp_path / "rng.pt")
    assert same(snapshot(), before)


@pytest.mark.parametrize("saved_rank", [None, 0, 3, 10**7 - 1])
def test_a_saved_rank_the_format_writes_is_read(saved_rank: int | None) -> None:
    found = own_file(world_size=None, saved_rank=saved_rank)
    report = rng.restore(found, warn=False)
    assert report.exact and report.saved_rank == (0 if saved_rank is None else saved_rank)


def test_a_captured_rank_past_any_job_reads_as_unknown_on_both_paths(tmp_path: Path) -> None:
    """restore(state) and read() of the same state agree on an implausible captured rank
    (read's file check refuses a saved_rank past MAX_SAVED_RANK): rank 0's, as when unknown."""
    state = copy.deepcopy(BASE)
    state["meta"] = {**state["meta"], "rank": 10**8, "world_size": None}
    assert rng.restore(state, warn=False).saved_rank == 0
    torch.save(state, tmp_path / "rng.pt")
    assert rng.load(tmp_path / "rng.pt", warn=False).saved_rank == 0
