"""Patch ``torch-gloo-reduce-scatter-op`` against the real torch of this environment.

The collectives run once on two real gloo ranks (:func:`_rank_checks`, cached
for the module): torch's own result unarmed, then armed, then after the revert.
Torch 2.2-2.8 sum whatever op they are given (the defect); 2.9+ do not, and
there the patch is out of range and leaves ``reduce_scatter_tensor`` alone.
"""

from __future__ import annotations

import functools
import subprocess
import sys
import traceback
import warnings
from typing import Any

import pytest

pytest.importorskip("torch")

import torch
import torch.distributed as dist

import compatshim
from compatshim.patches import torch_gloo_reduce_scatter_op as patch_module
from tests.harness.catalogue import a_library_wraps
from tests.harness.dist import python_env, run_ranks

NAME = "torch-gloo-reduce-scatter-op"
WORLD = 2
RELEASE = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])
DEFECT_EXPECTED = (2, 2) <= RELEASE < (2, 9)
pytestmark = [
    pytest.mark.skipif(not dist.is_available(), reason="torch built without distributed"),
    pytest.mark.skipif(RELEASE < (2, 2), reason="gloo has no reduce_scatter_tensor before 2.2"),
]


def _input(rank: int) -> torch.Tensor:
    return torch.tensor([1.0, -2.0, 3.0, 4.0]) * (rank + 1) + rank


def _chunks(op: str) -> list[list[float]]:
    stacked = torch.stack([_input(r) for r in range(WORLD)])
    reduced = {
        "SUM": stacked.sum(0),
        "AVG": stacked.mean(0),
        "MAX": stacked.max(0).values,
        "MIN": stacked.min(0).values,
        "PRODUCT": stacked.prod(0),
    }[op]
    return [chunk.tolist() for chunk in reduced.reshape(WORLD, -1)]


def _scatter(rank: int, op: str, *, async_op: bool = False, base: bool = False) -> Any:
    out = torch.zeros(2)
    call = dist.distributed_c10d._reduce_scatter_base if base else dist.reduce_scatter_tensor
    work = call(out, _input(rank), op=getattr(dist.ReduceOp, op), async_op=async_op)
    if async_op:
        work.wait()
    return out.tolist()


def _outcome(fn: Any) -> Any:
    try:
        return fn()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"


def _checks(rank: int, world: int) -> dict[str, Any]:
    warnings.simplefilter("ignore")  # 2.13+: reduce_scatter_tensor is deprecated
    compatshim.uninstall([NAME])
    got: dict[str, Any] = {"unarmed": _outcome(lambda: _scatter(rank, "AVG"))}
    compatshim.install([NAME])
    try:
        got["row"] = next(r.as_dict() for r in compatshim.status() if r.name == NAME)
        for op in ("SUM", "AVG", "MAX", "MIN", "PRODUCT"):
            got[op] = _outcome(functools.partial(_scatter, rank, op))
        got["AVG async"] = _outcome(lambda: _scatter(rank, "AVG", async_op=True))
        got["MAX async"] = _outcome(lambda: _scatter(rank, "MAX", async_op=True))
        got["AVG base"] = _outcome(lambda: _scatter(rank, "AVG", base=True))

        def integer_average() -> Any:
            out = torch.zeros(1, dtype=torch.int64)
            inp = torch.tensor([rank, rank], dtype=torch.int64)
            dist.reduce_scatter_tensor(out, inp, op=dist.ReduceOp.AVG)
            return out.tolist()

        got["AVG int"] = _outcome(integer_average)

        def premul_sum() -> Any:
            out = torch.zeros(2)
            op = dist._make_nccl_premul_sum(0.5)
            dist.reduce_scatter_tensor(out, _input(rank), op=op)
            return out.tolist()

        got["PREMUL_SUM"] = _outcome(premul_sum)
    finally:
        compatshim.uninstall([NAME])
    got["reverted"] = _outcome(lambda: _scatter(rank, "AVG"))
    got["reverted mark"] = getattr(dist.reduce_scatter_tensor, "__compatshim_patcher__", None)
    got.update(_through_a_library(rank))
    return got


def _through_a_library(rank: int) -> dict[str, Any]:
    """A library wraps the name after install; uninstall leaves its wrapper, and ours under it
    then gives torch's own result."""
    torchs = dist.reduce_scatter_tensor
    compatshim.install([NAME])
    library = a_library_wraps(dist, "reduce_scatter_tensor")
    try:
        compatshim.uninstall([NAME])
        got = {
            "library kept": dist.reduce_scatter_tensor is library,
            "through a library": _outcome(lambda: _scatter(rank, "AVG")),
        }
        compatshim.install([NAME])  # over the library's wrapper: in force again
        got["through a library, armed again"] = _outcome(lambda: _scatter(rank, "AVG"))
        compatshim.uninstall([NAME])
    finally:
        dist.reduce_scatter_tensor = torchs
    return got


@functools.cache
def _rank_checks() -> tuple[dict[str, Any], ...]:
    return tuple(run_ranks(_checks, WORLD, timeout=180))


def test_unarmed_torch_sums_exactly_where_the_patch_is_in_range() -> None:
    for rank, got in enumerate(_rank_checks()):
        expected = _chunks("SUM" if DEFECT_EXPECTED else "AVG")[rank]
        assert got["unarmed"] == expected, got["unarmed"]


def test_armed_reduce_scatter_applies_the_op() -> None:
    for rank, got in enumerate(_rank_checks()):
        for op in ("SUM", "AVG", "MAX", "MIN", "PRODUCT"):
            assert got[op] == _chunks(op)[rank], (op, got[op])
        assert got["AVG async"] == _chunks("AVG")[rank], got["AVG async"]
        assert got["MAX async"] == _chunks("MAX")[rank], got["MAX async"]
        assert got["AVG base"] == _chunks("AVG")[rank], got["AVG base"]


def test_status_row_on_this_torch() -> None:
    row = _rank_checks()[0]["row"]
    if DEFECT_EXPECTED:
        assert (row["defect"], row["applied"], row["fixed"], row["error"]) == (
            "present",
            True,
            True,
            None,
        ), row
    else:
        assert row["applied"] is False and row["in_range"] is False, row


def test_integer_average_is_a_clear_error_where_patched() -> None:
    got = _rank_checks()[0]["AVG int"]
    if DEFECT_EXPECTED:
        assert isinstance(got, str) and got.startswith("GlooReduceScatterOpError"), got
        assert "floating-point" in got
    else:
        assert not isinstance(got, str) or "GlooReduceScatterOpError" not in got


def test_premul_sum_is_an_error_never_a_sum() -> None:
    for rank, got in enumerate(_rank_checks()):
        if isinstance(got["PREMUL_SUM"], str):
            assert "Error" in got["PREMUL_SUM"].splitlines()[0], got["PREMUL_SUM"]
        else:  # torch applied it: half the sum
            assert got["PREMUL_SUM"] == [x / 2 for x in _chunks("SUM")[rank]]
    if DEFECT_EXPECTED:
        assert _rank_checks()[0]["PREMUL_SUM"].startswith("GlooReduceScatterOpError")


def test_revert_restores_torchs_function_and_result() -> None:
    for got in _rank_checks():
        assert got["reverted"] == got["unarmed"]
        assert got["reverted mark"] is None


def test_a_wrapper_a_library_put_on_after_install_survives_uninstall_and_ours_under_it_is_off() -> (
    None
):
    for rank, got in enumerate(_rank_checks()):
        assert got["library kept"] is True
        assert got["through a library"] == got["unarmed"], got["through a library"]
        assert got["through a library, armed again"] == _chunks("AVG")[rank]


def test_the_declared_range_is_where_gloo_sums_live() -> None:
    """The patch decides by its range; a private loopback gloo group checks the range."""
    assert patch_module.loopback_sums(dist) is DEFECT_EXPECTED
    assert patch_module.loopback_sums(dist, through_fix=True) is False


def test_arming_prints_nothing_and_probes_cheaply() -> None:
    """A live gloo probe would print on stdout inside the user's import; the patch does not."""
    code = (
        f"import compatshim; compatshim.install([{NAME!r}]); import torch.distributed as dist; "
        f"row = [r for r in compatshim.status() if r.name == {NAME!r}][0]; "
        "import sys; sys.stderr.write(repr((row.applied, row.defect)))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=python_env(), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    applied = "(True, 'present')" if DEFECT_EXPECTED else "(False, 'not probed')"
    assert done.stderr.strip().endswith(applied), done.stderr


@pytest.mark.skipif(not DEFECT_EXPECTED, reason="out of the patch's range: never applied")
def test_install_twice_is_once_and_uninstall_restores_exact_objects() -> None:
    compatshim.uninstall([NAME])
    before = (dist.reduce_scatter_tensor, dist.distributed_c10d.reduce_scatter_tensor)
    assert compatshim.install([NAME]) == [NAME]
    assert compatshim.install([NAME]) == [NAME]
    wrapped = dist.reduce_scatter_tensor
    assert wrapped is not before[0] and wrapped.__wrapped__ is before[0]
    assert patch_module.probe(dist) is False  # through the fix
    assert compatshim.uninstall([NAME]) == [NAME]
    assert (dist.reduce_scatter_tensor, dist.distributed_c10d.reduce_scatter_tensor) == before
    assert patch_module.probe(dist) is True
