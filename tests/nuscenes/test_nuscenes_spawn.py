"""A real ``DetectionConfig`` crossing process boundaries, the way UniAD training sends it.

The parent arms the patch with ``compatshim.install()``; the spawned children
get it only from ``COMPATSHIM_AUTO=1`` (the start-up hook the wheel ships).
DataLoader workers run under ``spawn`` and ``forkserver`` (Python 3.14's default
on Linux; compatshim never switches the start method), four of them.
Each child pickles the config again (worker results back to the parent; the
``all_gather_object`` between ranks), so an unpatched child fails the test.
Every wait has a deadline and ends in an error.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Iterator

import pytest

pytest.importorskip("nuscenes.eval.common.config", reason="no nuscenes-devkit")

import torch.multiprocessing as torch_mp
from nuscenes.eval.common.config import config_factory
from torch.utils.data import DataLoader

import compatshim
from tests.harness.dist import free_port
from tests.nuscenes.nuscenes_workers import (
    EvalConfigDataset,
    gather_config_rank,
    keep_samples,
)

PATCH = "nuscenes-dict-views"
PATHS = "multiprocessing-pickle-paths"
TIMEOUT_S = 240.0

pytestmark = pytest.mark.dist


@pytest.fixture
def children_auto(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Parent armed explicitly; spawned children armed by the environment only."""
    monkeypatch.setenv("COMPATSHIM_AUTO", "1")
    monkeypatch.delenv("COMPATSHIM_DISABLE", raising=False)
    compatshim.install(include=[PATCH])
    yield
    compatshim.uninstall([PATCH])


def _dataset() -> EvalConfigDataset:
    return EvalConfigDataset(config_factory("detection_cvpr_2019"))


START_METHODS = ("spawn", "forkserver")


def _loader(dataset: EvalConfigDataset, method: str = "spawn") -> DataLoader:  # type: ignore[type-arg]
    return DataLoader(
        dataset,
        batch_size=2,
        num_workers=4,
        multiprocessing_context=method,
        collate_fn=keep_samples,
        timeout=TIMEOUT_S,
    )


@pytest.mark.parametrize("method", START_METHODS)
def test_dataloader_workers_without_the_patch_fail_with_the_dict_keys_error(method: str) -> None:
    compatshim.uninstall([PATCH, PATHS])
    with pytest.raises(TypeError, match="cannot pickle 'dict_keys' object"):
        next(iter(_loader(_dataset(), method)))


@pytest.mark.parametrize("method", START_METHODS)
def test_without_the_patch_the_error_names_the_path_and_the_fix(method: str) -> None:
    """multiprocessing-pickle-paths alone: same error type, plus where and which fix."""
    compatshim.uninstall([PATCH])
    compatshim.install(include=[PATHS])
    try:
        with pytest.raises(TypeError, match="cannot pickle 'dict_keys' object") as caught:
            next(iter(_loader(_dataset(), method)))
    finally:
        compatshim.uninstall([PATHS])
    line = str(caught.value).splitlines()[-1]
    assert "_worker_loop args[1]" in line, line  # torch 2.15 passes it as args[1][0]
    assert ".eval_cfg.class_names (dict_keys)" in line, line
    assert "fix: patch nuscenes-dict-views" in line, line


@pytest.mark.parametrize("method", START_METHODS)
def test_dataloader_workers_get_the_config_and_send_it_back(
    children_auto: None, method: str
) -> None:
    dataset = _dataset()
    cfg = dataset.eval_cfg
    samples = [sample for batch in _loader(dataset, method) for sample in batch]
    assert sorted(s["index"] for s in samples) == list(range(len(dataset)))
    assert {s["pid"] for s in samples}.isdisjoint({os.getpid()})
    names = list(cfg.class_names)
    for sample in samples:
        assert sample["patched"] is True, "COMPATSHIM_AUTO=1 did not arm the worker"
        assert sample["class_name"] == names[sample["index"] % len(names)]
        assert sample["car_in_class_names"] is True
        assert sample["class_names_type"] == "dict_keys"
        back = sample["eval_cfg"]
        assert back.serialize() == cfg.serialize()
        assert list(back.class_names) == names


def test_mp_spawn_ranks_receive_and_exchange_the_config(
    children_auto: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    world = 2
    dataset = _dataset()
    monkeypatch.setenv("CS_TEST_PORT", str(free_port()))
    context = torch_mp.spawn(
        gather_config_rank, args=(dataset, str(tmp_path), world), nprocs=world, join=False
    )
    assert context is not None
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while not context.join(timeout=1):
            if time.monotonic() > deadline:
                pytest.fail(f"mp.spawn ranks still running after {TIMEOUT_S:.0f}s")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
                process.join(5)
    names = list(dataset.eval_cfg.class_names)
    for rank in range(world):
        report = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert report["patched"] is True, f"rank {rank}: COMPATSHIM_AUTO=1 did not arm it"
        assert report["serialized_equal"] == [True] * world
        assert report["class_names"] == [names] * world
        assert report["class_names_type"] == ["dict_keys"] * world
