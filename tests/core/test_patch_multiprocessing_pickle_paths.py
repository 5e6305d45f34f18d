"""Patch ``multiprocessing-pickle-paths``: a child that cannot be started says where.

Real processes under each start method but ``fork`` (``forkserver`` is Python
3.14's default on Linux; below 3.14 the test names it, which is how the default
is emulated; on 3.14+ the DataLoader tests also run with no method named, as
users meet it). Children are started for real and every wait has a deadline.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.reduction
import os
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("torch")

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

import compatshim

PATCH = "multiprocessing-pickle-paths"
START_METHODS = ("spawn", "forkserver")
# None: the DataLoader names no start method, so the interpreter's default applies
WITH_DEFAULT = (
    *START_METHODS,
    pytest.param(
        None,
        id="default",
        marks=pytest.mark.skipif(
            sys.version_info < (3, 14), reason="the default is fork before 3.14: nothing pickled"
        ),
    ),
)
TIMEOUT_S = 120.0

pytestmark = pytest.mark.timeout(300)


class Config:
    """A plain object that holds what a user's dataset config holds."""

    def __init__(self, **items: Any) -> None:
        self.__dict__.update(items)


def _work(*_: Any) -> None:
    return None


@pytest.fixture
def armed() -> Iterator[None]:
    compatshim.install(include=[PATCH])
    yield
    compatshim.uninstall([PATCH])


def _start(method: str, *args: Any) -> BaseException:
    process = multiprocessing.get_context(method).Process(target=_work, args=args)
    try:
        process.start()
    except Exception as exc:
        return exc
    process.join(TIMEOUT_S)
    pytest.fail("the child started although its arguments cannot be pickled")


@pytest.mark.parametrize("method", START_METHODS)
def test_a_lambda_and_a_nested_lock_are_named_in_one_line(armed: None, method: str) -> None:
    dataset = Config(cfg=Config(transform=lambda x: x, cache=Config(lock=threading.Lock())))
    caught = _start(method, dataset)
    lines = str(caught).splitlines()
    assert len(lines) == 2, lines  # pickle's own message, then compatshim's one line
    assert lines[1].startswith("compatshim: the child process cannot be sent "), lines
    assert "_work args[0].cfg.transform (function)" in lines[1]
    assert "_work args[0].cfg.cache.lock (_thread.lock)" in lines[1]
    assert "fix: compatshim.clone_module" in lines[1]  # the lock's known answer


@pytest.mark.parametrize("method", START_METHODS)
def test_the_error_keeps_its_type_and_message(armed: None, method: str) -> None:
    caught = _start(method, Config(lock=threading.Lock()))
    compatshim.uninstall([PATCH])
    plain = _start(method, Config(lock=threading.Lock()))
    assert type(caught) is type(plain)
    assert str(caught).splitlines()[0] == str(plain)
    assert "compatshim" not in str(plain)


def test_uninstall_restores_the_original_function() -> None:
    original = multiprocessing.reduction.dump
    compatshim.install(include=[PATCH])
    assert multiprocessing.reduction.dump is not original
    compatshim.install(include=[PATCH])  # idempotent: one wrapper, not two
    assert multiprocessing.reduction.dump.__compatshim_original__ is original  # type: ignore[attr-defined]
    compatshim.uninstall([PATCH])
    assert multiprocessing.reduction.dump is original


def test_a_wrapper_a_library_put_on_after_install_survives_uninstall() -> None:
    """Uninstall keeps the library's wrapper; compatshim's under it stops annotating. Put
    back by that library, the leftover is not taken for the patch in force: install wraps
    the original again."""
    import io

    original = multiprocessing.reduction.dump
    compatshim.install(include=[PATCH])
    ours = multiprocessing.reduction.dump

    def theirs(obj: Any, file: Any, protocol: Any = None) -> Any:
        return ours(obj, file, protocol)

    multiprocessing.reduction.dump = theirs  # type: ignore[assignment]
    try:
        compatshim.uninstall([PATCH])
        assert multiprocessing.reduction.dump is theirs
        with pytest.raises(TypeError) as caught:
            theirs(Config(lock=threading.Lock()), io.BytesIO())
        assert "compatshim" not in str(caught.value)
        multiprocessing.reduction.dump = ours  # the library unwraps
        compatshim.install(include=[PATCH])
        again = multiprocessing.reduction.dump
        assert again is not ours and again.__compatshim_original__ is original  # type: ignore[attr-defined]
        compatshim.uninstall([PATCH])
        assert multiprocessing.reduction.dump is ours
    finally:
        compatshim.uninstall([PATCH])
        multiprocessing.reduction.dump = original  # type: ignore[assignment]


def test_status_row_says_applied_and_fixed(armed: None) -> None:
    row = next(s for s in compatshim.status() if s.name == PATCH)
    assert row.applied and row.fixed, row
    assert row.distribution == "python"
    assert any("confirmed" in line for line in row.decisions), row.decisions  # by the probe


def test_confirm_checks_that_the_wrapper_is_in_place() -> None:
    from compatshim.patches import multiprocessing_pickle_paths as patch

    compatshim.uninstall([PATCH])
    assert not patch.confirm(multiprocessing.reduction)
    compatshim.install(include=[PATCH])
    assert patch.confirm(multiprocessing.reduction)
    compatshim.uninstall([PATCH])
    assert not patch.confirm(multiprocessing.reduction)


class GroupDataset(Dataset):  # type: ignore[type-arg]
    """A dataset that keeps the process group it was built with (Megatron-Energon style)."""

    def __init__(self, group: Any) -> None:
        self.group = group
        self.data = torch.arange(16, dtype=torch.float32)

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.data[index * 2 : index * 2 + 2] + torch.rand(1)


def _batches(method: str | None, dataset: Dataset) -> list[torch.Tensor]:  # type: ignore[type-arg]
    if method is None:
        assert multiprocessing.get_start_method() == "forkserver"  # Linux, Python 3.14+
    loader = DataLoader(
        dataset,
        batch_size=2,
        num_workers=2,
        multiprocessing_context=method,
        generator=torch.Generator().manual_seed(7),
        timeout=TIMEOUT_S,
    )
    return list(loader)


@pytest.fixture
def gloo_group(tmp_path: Any) -> Iterator[Any]:
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield dist.new_group([0])
    finally:
        dist.destroy_process_group()


@pytest.mark.dist
@pytest.mark.parametrize("method", WITH_DEFAULT)
def test_dataset_holding_a_group_reaches_its_first_batch(
    gloo_group: Any, method: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With torch-processgroup-copy the workers get an unbound group; batches equal those of
    the same seed without the group, unarmed. The reference is not taken under ``fork``: a
    fork from this process, which runs gloo's threads, can deadlock in the child on CPython
    3.11.7 and older 3.11s (gh-112275)."""
    compatshim.uninstall(["torch-processgroup-copy", PATCH])
    monkeypatch.delenv("COMPATSHIM_AUTO", raising=False)  # the reference's workers: unarmed
    expected = _batches("spawn", GroupDataset(None))
    monkeypatch.setenv("COMPATSHIM_AUTO", "1")
    compatshim.install(include=["torch-processgroup-copy", PATCH])
    try:
        got = _batches(method, GroupDataset(gloo_group))
    finally:
        compatshim.uninstall(["torch-processgroup-copy", PATCH])
    assert len(got) == len(expected) == 4
    for left, right in zip(got, expected):
        assert torch.equal(left, right)


@pytest.mark.dist
@pytest.mark.parametrize("method", WITH_DEFAULT)
def test_without_the_group_patch_the_error_names_the_group(
    gloo_group: Any, method: str | None
) -> None:
    compatshim.install(include=[PATCH])
    try:
        with pytest.raises((TypeError, RuntimeError)) as caught:
            _batches(method, GroupDataset(gloo_group))
    finally:
        compatshim.uninstall([PATCH])
    line = str(caught.value).splitlines()[-1]
    assert "_worker_loop args[1]" in line and ".group (torch" in line, line  # torch 2.15: [1][0]
    assert "patch torch-processgroup-copy" in line, line
    assert os.getpid() > 0
