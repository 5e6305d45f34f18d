"""Sparse tensors load as ``torch.load(weights_only=True)`` loads them, invariants checked.

torch's weights-only loader admits ``torch._utils._rebuild_sparse_tensor`` and validates
every sparse tensor after the load (torch 2.8-2.13 only where
``torch.sparse.check_sparse_tensor_invariants`` is on): built unchecked, an index outside the
size reads outside memory at the first ``to_dense()``. compatshim builds them through torch's
constructors with ``check_invariants=True``. Real ``torch.save`` files of every layout;
the hostile ones are torch's own test cases (``test_serialization_sparse*_invalid``):
tensors made with ``check_invariants=False`` and saved as they are.
"""

from __future__ import annotations

import io
import pickle
import warnings
from typing import Any, Callable

import pytest

torch = pytest.importorskip("torch")

from compatshim.checkpoint import CheckpointError, UnsafeCheckpointError, inspect, load  # noqa: E402


def _saved(value: Any) -> io.BytesIO:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    buffer.seek(0)
    return buffer


def _quiet(call: Callable[[], Any]) -> Any:
    with warnings.catch_warnings():  # torch's "sparse CSR is beta" / "validating" notices
        warnings.simplefilter("ignore")
        return call()


def _all_layouts() -> dict[str, Any]:
    eye = torch.eye(4) + torch.diag(torch.ones(3), 1)
    indices = torch.tensor([[0, 1, 1], [2, 0, 2]])
    return _quiet(
        lambda: {
            "coo": eye.to_sparse(),
            "coo-uncoalesced": torch.sparse_coo_tensor(indices, torch.ones(3), (2, 3)),
            "coo-hybrid": torch.sparse_coo_tensor(indices, torch.ones(3, 2), (2, 3, 2)),
            "csr": eye.to_sparse_csr(),
            "csc": eye.to_sparse_csc(),
            "bsr": eye.to_sparse_bsr((2, 2)),
            "bsc": eye.to_sparse_bsc((2, 2)),
            "dense": torch.arange(3.0),
        }
    )


def test_every_layout_loads_as_torch_loads_it() -> None:
    saved = _saved(_all_layouts())
    theirs = _quiet(lambda: torch.load(io.BytesIO(saved.getvalue()), weights_only=True))
    ours = _quiet(lambda: load(saved))
    assert sorted(ours) == sorted(theirs)
    for name, tensor in theirs.items():
        got = ours[name]
        assert got.layout == tensor.layout and got.dtype == tensor.dtype, name
        assert torch.equal(got.to_dense(), tensor.to_dense()), name
        if tensor.layout == torch.sparse_coo:
            assert got.is_coalesced() == tensor.is_coalesced(), name


def test_inspect_finds_nothing_to_refuse() -> None:
    info = _quiet(lambda: inspect(_saved(_all_layouts())))
    assert info.refusals == ()
    assert any(g.name == "torch._utils._rebuild_sparse_tensor" for g in info.globals)


def _spoofed(make: Callable[[], Any]) -> io.BytesIO:
    return _saved({"spoofed": _quiet(make)})


HOSTILE = {
    "coo-index-outside-the-size": (
        lambda: torch.sparse_coo_tensor(
            torch.tensor([[0, 3]]), torch.ones(2), (3,), check_invariants=False
        ),
        "size is inconsistent with indices",
    ),
    "coo-claims-to-be-coalesced": (
        lambda: torch.sparse_coo_tensor(
            torch.tensor([[1, 0]]), torch.ones(2), (2,), check_invariants=False, is_coalesced=True
        ),
        "coalesced",
    ),
    "csr-column-outside-the-size": (
        lambda: torch.sparse_csr_tensor(
            torch.tensor([0, 1, 2]),
            torch.tensor([0, 5]),
            torch.ones(2),
            (2, 3),
            check_invariants=False,
        ),
        "col_indices",
    ),
    "csr-rows-out-of-order": (
        lambda: torch.sparse_csr_tensor(
            torch.tensor([0, 2, 1]),
            torch.tensor([0, 1]),
            torch.ones(2),
            (2, 3),
            check_invariants=False,
        ),
        "crow_indices",
    ),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_an_invalid_sparse_tensor_is_refused_as_torch_refuses_it(case: str) -> None:
    make, words = HOSTILE[case]
    saved = _spoofed(make)
    # torch's own validation: RuntimeError (torch < 2.6 weights-only: in UnpicklingError).
    # torch 2.8-2.13 validate only with the invariant checks switched on (up to 2.7 and
    # from 2.14 a weights-only load always does); compatshim always does.
    checked = torch.sparse.check_sparse_tensor_invariants(enable=True)
    with pytest.raises((RuntimeError, pickle.UnpicklingError), match=words), checked:
        _quiet(lambda: torch.load(io.BytesIO(saved.getvalue()), weights_only=True))
    with pytest.raises(CheckpointError, match="not a valid sparse tensor") as caught:
        _quiet(lambda: load(saved))
    assert isinstance(caught.value, RuntimeError) and words in str(caught.value)
    copied = pickle.loads(pickle.dumps(caught.value))
    assert isinstance(copied, RuntimeError) and isinstance(copied, CheckpointError)


def test_indices_that_are_not_tensors_of_the_file_are_refused() -> None:
    class Spoofer:
        def __reduce_ex__(self, protocol: int) -> Any:
            return (
                torch._utils._rebuild_sparse_tensor,
                (torch.sparse_coo, ([[0, 1]], torch.ones(2), torch.Size([2]))),
            )

    with pytest.raises(CheckpointError, match="not a tensor of this file"):
        load(_saved({"spoofed": Spoofer()}))


def test_an_unknown_layout_is_refused() -> None:
    class Spoofer:
        def __reduce_ex__(self, protocol: int) -> Any:
            return (torch._utils._rebuild_sparse_tensor, (torch.strided, (torch.ones(2),)))

    with pytest.raises(CheckpointError, match="_rebuild_sparse_tensor"):
        load(_saved({"spoofed": Spoofer()}))


def test_hardened_torch_load_reads_sparse_files_and_refuses_invalid_ones(torch_own: Any) -> None:
    loaded = _quiet(lambda: torch.load(_saved(_all_layouts())))
    assert loaded["csr"].layout == torch.sparse_csr
    make, words = HOSTILE["coo-index-outside-the-size"]
    with pytest.raises(UnsafeCheckpointError, match=words) as caught:
        _quiet(lambda: torch.load(_spoofed(make)))
    assert isinstance(caught.value, RuntimeError)  # what torch's own validation raises


def test_the_check_is_charged_to_the_budget_at_each_use() -> None:
    """A 2 KB file whose indices and values are one element repeated 2**28 times (stride 0):
    checking them reads 2**28 indices. The check's work is charged first (what the views
    expand to, not what the file stores), so the load stops at the budget in milliseconds;
    torch's own load checks them in 0.14 s here, the one element staying in cache."""
    count = 2**28
    indices = torch.zeros(1, 1, dtype=torch.long).expand(1, count)
    spread = torch.sparse_coo_tensor(
        indices, torch.ones(1).expand(count), (1,), check_invariants=False
    )
    saved = _saved({"s": spread})
    assert len(saved.getvalue()) < 4096
    with pytest.raises(CheckpointError, match="work budget"):
        load(saved)
