"""CUDA legs: run only where a GPU exists (conftest skips them with a reason elsewhere)."""

from __future__ import annotations

import warnings

import pytest

pytest.importorskip("torch")

import torch

import compatshim.rng as rng
from tests.rng.fixtures.make_fixtures import cuda_states


@pytest.mark.gpu
def test_cuda_draws_continue_after_a_same_device_round_trip() -> None:
    torch.cuda.manual_seed_all(5)
    state = rng.capture()
    assert len(state["cuda"]) == torch.cuda.device_count()
    first = torch.rand(8, device="cuda").cpu()
    report = rng.restore(state)
    assert report.exact and "cuda:0" in report.restored
    assert torch.equal(torch.rand(8, device="cuda").cpu(), first)


@pytest.mark.gpu
def test_seven_cuda_states_restore_on_the_gpus_present() -> None:
    state = rng.capture()
    state["cuda"] = cuda_states(7)
    count = torch.cuda.device_count()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = rng.restore(state)
    assert len([w for w in caught if issubclass(w.category, rng.RNGStateWarning)]) == (count != 7)
    for device in range(min(count, 7)):
        assert torch.equal(torch.cuda.get_rng_state(device), state["cuda"][device])
    assert len(report.skipped) == max(0, 7 - count)
    assert len(report.derived) == max(0, count - 7)


@pytest.mark.gpu
def test_torch_2_0_layout_sets_the_same_seed_and_offset() -> None:
    state = rng.capture()
    state["cuda"] = cuda_states(1, legacy=True)
    rng.restore(state, warn=False)
    assert torch.equal(torch.cuda.get_rng_state(0), cuda_states(1)[0])


@pytest.mark.gpu
def test_a_cpu_run_resumed_here_continues_exactly_and_seeds_cuda_as_new() -> None:
    state = rng.capture()
    state["cuda"] = []  # saved by a run without GPUs
    expected_cpu = torch.rand(4)
    with warnings.catch_warnings():
        warnings.simplefilter("error", rng.RNGStateWarning)  # nothing was lost: no warning
        report = rng.restore(state)
    assert report.exact and report.new == tuple(
        f"cuda:{i}" for i in range(torch.cuda.device_count())
    )
    assert torch.equal(torch.rand(4), expected_cpu)
    first = torch.rand(8, device="cuda").cpu()
    rng.restore(state)
    assert torch.equal(
        torch.rand(8, device="cuda").cpu(), first
    )  # the same checkpoint, same stream
