"""Pure restore planning: device and world-size changes decided without touching a device.

The 7-GPUs-saved case is checked here on CPU through ``build_plan`` with a
stated environment (``Environment(cuda=1)``): the plan says which saved
CUDA entry each current device gets, which are derived and which skipped.
Nothing fakes CUDA; applying a CUDA plan is the GPU-marked test's job. States
are captured here and then given the CUDA entries each case needs (none for a
CPU run), so no case depends on whether this machine has a GPU.
"""

from __future__ import annotations

import struct

import pytest

pytest.importorskip("torch")

import torch

import compatshim.rng as rng
from compatshim.rng.plan import plan_devices, plan_rank
from compatshim.rng.restore import Environment, build_plan
from tests.rng.fixtures.make_fixtures import cuda_states


def state_with_cuda(count: int, legacy: bool = False) -> dict[str, object]:
    """This process's state as saved on a machine with ``count`` GPUs (0: a CPU run)."""
    state = rng.capture()
    state["cuda"] = cuda_states(count, legacy=legacy)
    return state


def cuda_writes(plan: object) -> dict[str, torch.Tensor]:
    return {label: value for label, value in plan.writes if label.startswith("cuda:")}  # type: ignore[attr-defined]


def test_seven_saved_one_present_restores_device_zero_and_skips_the_rest() -> None:
    state = state_with_cuda(7)
    plan = build_plan(state, Environment(cuda=1))
    writes = cuda_writes(plan)
    assert list(writes) == ["cuda:0"]
    assert torch.equal(writes["cuda:0"], state["cuda"][0])  # type: ignore[index]
    assert plan.report is not None
    assert plan.report.skipped == tuple(
        f"cuda:{i} (saved; no such device here)" for i in range(1, 7)
    )
    assert "CUDA device count changed 7 -> 1" in plan.report.notes
    assert plan.report.mismatch and not plan.report.exact


def test_strict_mode_names_both_counts() -> None:
    with pytest.raises(rng.RNGStateError, match=r"7 cuda generator state\(s\).*1 cuda device"):
        build_plan(state_with_cuda(7), Environment(cuda=1), on_device_mismatch="error")


def test_more_devices_than_saved_derive_deterministic_distinct_states() -> None:
    state = state_with_cuda(6)
    first = cuda_writes(build_plan(state, Environment(cuda=8)))
    again = cuda_writes(build_plan(state, Environment(cuda=8)))
    assert list(first) == [f"cuda:{i}" for i in range(8)]
    for index in range(6):
        assert torch.equal(first[f"cuda:{index}"], state["cuda"][index])  # type: ignore[index]
    for label in ("cuda:6", "cuda:7"):
        assert torch.equal(first[label], again[label])
    seeds = {struct.unpack("<QQ", bytes(t.tolist()))[0] for t in first.values()}
    assert len(seeds) == 8  # no device replays another's stream
    plan = build_plan(state, Environment(cuda=8))
    assert plan.report is not None and plan.report.derived == ("cuda:6", "cuda:7")


def test_torch_2_0_cuda_states_are_converted_not_rejected() -> None:
    legacy = state_with_cuda(2, legacy=True)
    modern = state_with_cuda(2)
    assert legacy["cuda"][0].numel() == 816  # type: ignore[index]
    got = cuda_writes(build_plan(legacy, Environment(cuda=2)))
    want = cuda_writes(build_plan(modern, Environment(cuda=2)))
    assert all(torch.equal(got[k], want[k]) for k in want)


def test_cpu_only_state_on_a_cpu_machine_plans_no_cuda() -> None:
    plan = build_plan(state_with_cuda(0), Environment(cuda=0))
    assert not cuda_writes(plan)
    assert plan.report is not None and plan.report.exact and not plan.report.new


def test_cpu_run_resumed_on_a_gpu_machine_continues_exactly_and_reports_cuda_as_new() -> None:
    """A CPU-trained checkpoint on a 2-GPU machine: nothing saved is lost, so it is exact."""
    state = state_with_cuda(0)
    plan = build_plan(state, Environment(cuda=2), on_device_mismatch="error")  # no mismatch
    report = plan.report
    assert report is not None
    assert report.exact and not report.mismatch and not report.notes
    assert report.new == ("cuda:0", "cuda:1") and not report.derived and not report.skipped
    assert {"python", "numpy", "torch_cpu"} <= set(report.restored)
    assert "new (the state held none): cuda:0, cuda:1" in report.summary()
    writes = cuda_writes(plan)
    again = cuda_writes(build_plan(state, Environment(cuda=2)))
    assert all(torch.equal(writes[k], again[k]) for k in writes)  # same checkpoint, same streams
    seeds = {struct.unpack("<QQ", bytes(t.tolist())) for t in writes.values()}
    assert len(seeds) == 2 and all(offset == 0 for _, offset in seeds)


def test_generators_of_other_accelerators_the_state_never_held_are_new_and_left_alone() -> None:
    plan = build_plan(state_with_cuda(0), Environment(xpu=1, mps=True))
    assert plan.report is not None and plan.report.exact
    assert plan.report.new == ("xpu:0 (left as it is)", "mps (left as it is)")
    assert [label for label, _ in plan.writes] == ["python", "numpy", "torch_cpu"]


def test_a_changed_gpu_count_is_still_a_mismatch_not_new() -> None:
    plan = build_plan(state_with_cuda(1), Environment(cuda=2))
    assert plan.report is not None and not plan.report.new
    assert plan.report.derived == ("cuda:1",) and plan.report.mismatch


@pytest.mark.parametrize(
    ("saved", "world", "rank", "expected"),
    [(3, 3, 2, 2), (3, 2, 1, 1), (3, 4, 3, None), (7, 6, 5, 5), (3, 1, 0, 0), (2, 4, 2, None)],
)
def test_rank_plan(saved: int, world: int, rank: int, expected: int | None) -> None:
    assert plan_rank(saved, rank, world, "derive").saved_rank == expected


def test_rank_plan_policies() -> None:
    assert plan_rank(3, 0, 2, "derive_all").saved_rank is None
    assert plan_rank(3, 0, 3, "derive_all").saved_rank == 0  # same size: always exact
    with pytest.raises(rng.RNGStateError, match=r"3 rank.*job has 4"):
        plan_rank(3, 0, 4, "error")
    with pytest.raises(ValueError, match="on_world_size_mismatch"):
        plan_rank(3, 0, 4, "rank0")  # type: ignore[arg-type]


def test_device_plan_shapes() -> None:
    assert plan_devices("cuda", 7, 6, "derive").skip_saved == (6,)
    assert plan_devices("cuda", 2, 4, "derive").derive == (2, 3)
    assert plan_devices("cuda", 0, 0, "error").restore == ()


def test_derived_rank_gets_every_generator_derived() -> None:
    file = {
        "format": "compatshim.rng.file",
        "version": 1,
        "source": "compatshim",
        "world_size": 2,
        "ranks": [state_with_cuda(2), state_with_cuda(2)],
    }
    plan = build_plan(file, Environment(rank=3, world_size=4, cuda=2))
    assert plan.report is not None
    assert plan.report.restored == ()
    assert set(plan.report.derived) == {"python", "numpy", "torch_cpu", "cuda:0", "cuda:1"}
    again = build_plan(file, Environment(rank=3, world_size=4, cuda=2))
    other = build_plan(file, Environment(rank=2, world_size=4, cuda=2))
    cpu = dict(plan.writes)["torch_cpu"]
    assert torch.equal(cpu, dict(again.writes)["torch_cpu"])
    assert not torch.equal(cpu, dict(other.writes)["torch_cpu"])


def single_rank_file(saved_rank: int | None) -> dict[str, object]:
    """One rank's state as saved by a CPU run (no CUDA entries, whatever this machine has)."""
    from compatshim.rng.formats import single_rank_file as make
    from compatshim.rng.state import parse_state

    return make(parse_state(state_with_cuda(0)), "sana", saved_rank)


def test_one_job_wide_state_goes_to_rank_zero_only() -> None:
    """Sana keeps rank 0's state and restores it on every rank; compatshim derives the others."""
    file = single_rank_file(None)
    zero = build_plan(file, Environment(rank=0, world_size=4))
    two = build_plan(file, Environment(rank=2, world_size=4))
    assert zero.report is not None and two.report is not None
    assert "torch_cpu" in zero.report.restored and "torch_cpu" in two.report.derived
    alone = build_plan(file, Environment(rank=0, world_size=1))
    assert alone.report is not None and alone.report.exact and not alone.report.notes


def test_per_rank_file_restores_on_its_rank_and_derives_elsewhere() -> None:
    file = single_rank_file(1)
    own = build_plan(file, Environment(rank=1, world_size=3))
    other = build_plan(file, Environment(rank=2, world_size=3))
    assert own.report is not None and own.report.exact
    assert other.report is not None and "torch_cpu" in other.report.derived
    assert "saved rank 1's state; rank 2 derived" in other.report.notes[0]
    with pytest.raises(rng.RNGStateError, match="saved rank 1's state and this is rank 2"):
        build_plan(file, Environment(rank=2, world_size=3), on_world_size_mismatch="error")
