"""One dtype table and one shape check, held to the real libraries and attacked through
every reader that uses them.

The table's facts are compared with what the installed torch, numpy and safetensors
say (a row names a dtype the running release lacks: skipped, not guessed); the shape
bounds are the same in the torch, numpy, safetensors and DCP readers, so a file that
one reader refuses for its shape no other reader takes.
"""

from __future__ import annotations

import collections
import io
import json
import pickle
import struct
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

import numpy as np
import torch

from compatshim._text import named
from compatshim.checkpoint import CheckpointError, load
from compatshim.checkpoint._dtypes import BY_SAFETENSORS, BY_TORCH, DTYPES, STORAGES
from compatshim.checkpoint._limits import MAX_DIMS, MAX_ITEMS, Quota, check_shape, count

IN_TORCH = [d for d in DTYPES if d.torch is not None and hasattr(torch, d.torch)]


@pytest.mark.parametrize("row", IN_TORCH, ids=lambda d: d.name)
def test_torch_names_and_item_sizes_are_torchs(row: Any) -> None:
    dtype = getattr(torch, row.torch)
    assert isinstance(dtype, torch.dtype)
    assert str(dtype) == f"torch.{row.name}"  # the name DCP metadata and reports print
    assert torch.empty((), dtype=dtype).element_size() == row.torch_bytes
    for alias in row.aliases:
        assert getattr(torch, alias) is dtype


@pytest.mark.parametrize("row", [d for d in DTYPES if d.numpy], ids=lambda d: d.name)
def test_numpy_codes_are_numpys(row: Any) -> None:
    made = np.dtype(row.numpy)
    assert made.name == row.name
    assert made.itemsize * 8 == row.bits


NUMPY_DTYPES_MODULE = tuple(int(p) for p in np.__version__.split(".")[:2]) >= (1, 25)
needs_numpy_dtypes = pytest.mark.skipif(not NUMPY_DTYPES_MODULE, reason="numpy.dtypes: 1.25+")


@needs_numpy_dtypes
@pytest.mark.parametrize("row", [d for d in DTYPES if d.numpy_classes], ids=lambda d: d.name)
def test_numpy_dtype_classes_are_numpys(row: Any) -> None:
    """The sized class is the name numpy's pickle writes and makes the row's dtype; numpy's
    C-type names make the same kind of dtype (of the same size or the platform's)."""
    import numpy.dtypes

    sized, *c_names = (getattr(numpy.dtypes, name) for name in row.numpy_classes)
    assert sized.__name__ == row.numpy_classes[0] and sized.__module__ == "numpy.dtypes"
    assert load(io.BytesIO(pickle.dumps({"class": sized})))["class"] is sized  # admitted
    made = np.dtype(sized.type)
    if row.numpy is not None:
        assert made == np.dtype(row.numpy)
    for alias in c_names:
        assert np.dtype(alias.type).kind == made.kind


@needs_numpy_dtypes
def test_every_numpy_dtype_class_of_plain_data_is_in_the_table() -> None:
    """What numpy's pickle can write for a dtype class, less object, void and StringDType
    (whose items are arbitrary objects or records), is a table row's, and so admitted."""
    import numpy.dtypes

    from compatshim.checkpoint._dtypes import NUMPY_CLASSES
    from compatshim.checkpoint.allowlist import lookup

    written = {
        getattr(numpy.dtypes, name).__name__ for name in dir(numpy.dtypes) if name.endswith("DType")
    }
    assert written - set(NUMPY_CLASSES) == {"ObjectDType", "VoidDType", "StringDType"} & written
    assert all(lookup("numpy.dtypes", name) is not None for name in NUMPY_CLASSES)


@pytest.mark.parametrize("name", sorted(STORAGES), ids=str)
def test_legacy_storages_name_their_dtype(name: str) -> None:
    dtype_name, item_size = STORAGES[name]
    if name == "UntypedStorage":
        assert (dtype_name, item_size) == ("uint8", 1)
        return
    storage_class = getattr(torch, name)
    assert storage_class.dtype is getattr(torch, dtype_name)
    assert BY_TORCH[dtype_name].torch_bytes == item_size


@pytest.mark.parametrize("row", IN_TORCH, ids=lambda d: d.name)
def test_every_torch_dtype_of_the_table_loads_from_torch_save(row: Any) -> None:
    """The allowlist's dtype constants come from the table: torch.save of each dtype loads."""
    dtype = getattr(torch, row.torch)
    tensor = torch.arange(16, dtype=torch.uint8).view(dtype)
    buffer = io.BytesIO()
    try:
        torch.save({"t": tensor}, buffer)
    except KeyError:  # torch 2.1 cannot save complex32 and float8 storages itself
        pytest.skip(f"torch {torch.__version__} cannot save {row.name}")
    loaded = load(io.BytesIO(buffer.getvalue()))["t"]
    assert loaded.dtype is dtype
    assert torch.equal(loaded.view(torch.uint8), tensor.view(torch.uint8))


@pytest.mark.parametrize("row", IN_TORCH, ids=lambda d: d.name)
def test_safetensors_codes_are_the_safetensors_packages(row: Any) -> None:
    st = pytest.importorskip("safetensors.torch")
    tensor = torch.arange(16, dtype=torch.uint8).view(getattr(torch, row.torch))
    try:
        raw = st.save({"t": tensor})
    except Exception:  # the package cannot write this dtype: the table's code stays unchecked
        pytest.skip(f"safetensors cannot write {row.name}")
    (length,) = struct.unpack("<Q", raw[:8])
    code = json.loads(raw[8 : 8 + length])["t"]["dtype"]
    assert BY_SAFETENSORS[code] is row


# ------------------------------------------------------------------ the one shape check
def test_shape_check_bounds() -> None:
    assert check_shape((0, 1, MAX_ITEMS), "t") == (0, 1, MAX_ITEMS)
    assert check_shape([2, 3], "t", kinds=(list,)) == (2, 3)
    for bad in [(1,) * (MAX_DIMS + 1), (-1,), (MAX_ITEMS + 1,), (True,), (1.0,), [2], "ab"]:
        with pytest.raises(CheckpointError, match="t: shape"):
            check_shape(bad, "t")
    with pytest.raises(CheckpointError, match="more than any array holds"):
        count((MAX_ITEMS, 2), "t")


def test_a_shape_of_one_huge_int_shared_64_times_is_refused_at_once() -> None:
    huge = 1 << 200_000  # each dim is checked before any product
    started = time.perf_counter()
    with pytest.raises(CheckpointError):
        check_shape((huge,) * MAX_DIMS, "t")
    assert time.perf_counter() - started < 1


class _Forged:
    """Pickles as ``ctor(*args)`` then BUILD ``state``: what a file may write, by hand."""

    def __init__(self, ctor: Any, args: Any, state: Any = None) -> None:
        self.reduced = (ctor, args) if state is None else (ctor, args, state)

    def __reduce__(self) -> Any:
        return self.reduced


def test_every_reader_refuses_too_many_dims(tmp_path: Path) -> None:
    dims = (1,) * (MAX_DIMS + 1)
    # torch: a view of 65 dims over a one-item storage (64 load)
    storage = torch.zeros(1).untyped_storage()
    for n, ok in ((MAX_DIMS, True), (MAX_DIMS + 1, False)):
        rebuild = (storage, 0, (1,) * n, (1,) * n, False, collections.OrderedDict())
        forged = _Forged(torch._utils._rebuild_tensor_v2, rebuild)
        buffer = io.BytesIO()
        torch.save({"t": forged}, buffer)
        if ok:
            assert load(io.BytesIO(buffer.getvalue()))["t"].dim() == n
        else:
            with pytest.raises(CheckpointError, match="size is"):
                load(io.BytesIO(buffer.getvalue()))
    # numpy: an array state of 65 dims over 4 bytes (one float32)
    ctor, args, state = np.zeros(1, dtype=np.float32).__reduce__()  # type: ignore[misc]
    forged_array = _Forged(ctor, args, (state[0], dims, *state[2:]))
    with pytest.raises(CheckpointError, match="shape is"):
        load(io.BytesIO(pickle.dumps(forged_array, protocol=2)))
    # safetensors: a header of 65 dims
    header = json.dumps({"a": {"dtype": "F32", "shape": list(dims), "data_offsets": [0, 4]}})
    path = tmp_path / "a.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header.encode() + b"\0" * 4)
    with pytest.raises(CheckpointError, match="shape is"):
        load(path)


def test_quota_counts_units() -> None:
    quota = Quota(3, "things")
    quota.take(2)
    quota.take()
    with pytest.raises(CheckpointError, match=r"more things than one file may hold \(3 units\)"):
        quota.take()


def test_named_cuts_a_long_qualname() -> None:
    cls = type("C" * 100_000, (), {})
    text = named(cls)
    assert len(text) < 400 and "100000 characters" in text
    assert named(3) == "a int"
