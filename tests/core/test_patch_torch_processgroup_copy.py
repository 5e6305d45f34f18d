"""Patch ``torch-processgroup-copy`` against the real torch of this environment.

In-process tests use a bare, unregistered ``ProcessGroup`` (no group needs to
be initialised); the multi-rank behaviour (deepcopy, DDP, torch.save/load
re-binding, collectives through the copy) runs once on two real gloo ranks
in :mod:`core.pg_workers` and each test here reads its own check.
"""

from __future__ import annotations

import copy
import io
import json
import pickle
import subprocess
import sys
import textwrap
from typing import Any, Iterator

import pytest

pytest.importorskip("torch")

import torch
import torch.distributed as dist

import compatshim
from compatshim.patches import torch_processgroup_copy as patch_module
from tests.core.pg_workers import Holder, cuda_ddp_sync_batchnorm_checks, distributed_results
from tests.harness.catalogue import alone, status_row
from tests.harness.dist import python_env, run_ranks

NAME = "torch-processgroup-copy"
PATCHED = ("__deepcopy__", "__copy__", "__reduce_ex__")
pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch built without distributed")


@pytest.fixture
def patched() -> Iterator[None]:
    with alone(NAME, armed=True):
        yield


@pytest.fixture
def bare_group() -> Any:
    return patch_module._bare_group(dist.ProcessGroup)


def test_probe_finds_the_defect_on_this_torch(bare_group: Any) -> None:
    compatshim.uninstall([NAME])
    assert patch_module.probe(dist) is True
    with pytest.raises(TypeError, match="pickle"):
        copy.deepcopy(bare_group)


def test_status_rows_before_and_after(bare_group: Any) -> None:
    compatshim.uninstall([NAME])
    row = status_row(NAME)
    assert row["armed"] is False and row["applied"] is False and row["defect"] == "not probed"
    assert row["distribution"] == "torch" and row["in_range"] is True
    compatshim.install([NAME])
    try:
        row = status_row(NAME)
        assert (row["armed"], row["defect"], row["applied"], row["fixed"]) == (
            True,
            "present",
            True,
            True,
        )
        assert row["applied_targets"] == ["torch.distributed"] and row["error"] is None
    finally:
        compatshim.uninstall([NAME])


def test_install_twice_is_once_and_uninstall_restores_exact_objects(bare_group: Any) -> None:
    compatshim.uninstall([NAME])
    cls = dist.ProcessGroup
    own_before = {name: vars(cls).get(name) for name in PATCHED}
    resolved_before = {name: getattr(cls, name, None) for name in PATCHED}
    assert compatshim.install([NAME]) == [NAME]
    assert compatshim.install([NAME]) == [NAME]
    assert vars(cls)["__deepcopy__"] is patch_module._share
    assert status_row(NAME)["applied_targets"] == ["torch.distributed"]
    assert copy.deepcopy(bare_group) is bare_group and copy.copy(bare_group) is bare_group
    assert compatshim.uninstall([NAME]) == [NAME]
    assert {name: vars(cls).get(name) for name in PATCHED} == own_before
    assert all(getattr(cls, name, None) is resolved_before[name] for name in PATCHED)
    assert patch_module.probe(dist) is True
    assert compatshim.uninstall([NAME]) == []


def test_the_probe_leaves_no_copyreg_cache_on_the_class() -> None:
    """A deepcopy through copyreg caches ``__slotnames__`` on the class; the probe's own
    copies must not, or uninstall would leave an attribute behind."""
    compatshim.uninstall([NAME])
    cls = dist.ProcessGroup
    cached = vars(cls).get("__slotnames__")
    if cached is not None:
        del cls.__slotnames__  # a copy made earlier in this process cached it
    try:
        assert patch_module.probe(dist) is True
        assert "__slotnames__" not in vars(cls)
    finally:
        if cached is not None:
            cls.__slotnames__ = cached


def test_patch_armed_before_torch_is_imported() -> None:
    code = textwrap.dedent(
        f"""
        import copy, json, sys
        import compatshim
        compatshim.install([{NAME!r}])
        assert "torch" not in sys.modules, "install() imported torch"
        import torch
        import torch.distributed as dist
        from compatshim.patches.torch_processgroup_copy import _bare_group
        group = _bare_group(dist.ProcessGroup)
        assert copy.deepcopy([group])[0] is group
        model = torch.nn.SyncBatchNorm(2, process_group=group)
        assert copy.deepcopy(model).process_group is group
        print(json.dumps([r.as_dict() for r in compatshim.status() if r.name == {NAME!r}][0]))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=python_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    row = json.loads(done.stdout.strip().splitlines()[-1])
    assert (row["defect"], row["applied"], row["fixed"]) == ("present", True, True)


def test_armed_after_import_sync_batchnorm_deepcopy(patched: None, bare_group: Any) -> None:
    model = torch.nn.Sequential(torch.nn.SyncBatchNorm(3, process_group=bare_group))
    duplicate = copy.deepcopy({"ema": [model]})["ema"][0]
    assert duplicate[0].process_group is bare_group
    assert duplicate[0].weight is not model[0].weight


def test_pickling_a_group_torch_does_not_know_is_a_clear_error(
    patched: None, bare_group: Any
) -> None:
    with pytest.raises(patch_module.ProcessGroupPickleError, match="neither WORLD nor made by"):
        pickle.dumps(bare_group)


def test_pickle_error_is_one_picklable_pickling_error() -> None:
    """Made on first use (install() must not import _pickle), it is still one class."""
    error = patch_module.ProcessGroupPickleError
    assert error is patch_module.ProcessGroupPickleError is patch_module._pickle_error()
    assert issubclass(error, pickle.PicklingError)
    assert f"{error.__module__}.{error.__qualname__}" == f"{patch_module.__name__}.{error.__name__}"
    assert pickle.loads(pickle.dumps(error("x"))).args == ("x",)
    with pytest.raises(AttributeError):
        patch_module.NoSuchName  # noqa: B018


def test_unknown_registry_layout_names_torch_version_and_layouts(
    patched: None, bare_group: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(patch_module, "_REGISTRY_LAYOUTS", ("distributed_c10d._moved_away",))
    with pytest.raises(RuntimeError, match=r"torch 2\.\d+.*_moved_away"):
        pickle.dumps(bare_group)


def _rank_check(name: str) -> None:
    failures = [f"rank {r}: {res[name]}" for r, res in enumerate(distributed_results())]
    failures = [text for text in failures if not text.endswith(": ok")]
    assert not failures, "\n".join(failures)


@pytest.mark.dist
@pytest.mark.parametrize(
    "check",
    [
        "defect_is_real",
        "deepcopy_shares_and_copies",
        "deepcopy_ddp",
        "save_load_rebinds",
        "ddp_save_load",
        "other_ranks_group_fails_at_load",
        "weights_only_load",
        "uninstall_restores",
    ],
)
def test_on_two_gloo_ranks(check: str) -> None:
    _rank_check(check)


@pytest.mark.dist
def test_spawned_ranks_get_the_patch_from_compatshim_auto() -> None:
    reason = distributed_results()[0].get("auto_skip")
    if reason:
        pytest.skip(reason)
    _rank_check("armed_by_auto_in_spawned_rank")


@pytest.mark.dist
def test_loading_where_no_group_exists_fails_on_first_use_naming_ranks() -> None:
    """A checkpoint of a whole model loads for evaluation; only communicating fails."""
    assert not dist.is_initialized(), "another test left a process group in the pytest process"
    data = distributed_results()[0]["saved_model"]
    loaded = torch.load(io.BytesIO(data), weights_only=False)  # our own file: trusted
    assert isinstance(loaded, Holder)
    assert isinstance(loaded.group, patch_module.UnboundProcessGroup)
    assert loaded.bn.process_group is loaded.group
    assert loaded.eval()(torch.ones(2, 4)).shape == (2, 4)
    with pytest.raises(patch_module.ProcessGroupUnavailableError) as info:
        loaded.group.size()
    text = str(info.value)
    assert "global ranks [0, 1]" in text and "not initialised" in text
    assert "new_group(ranks=[0, 1])" in text
    with pytest.raises(patch_module.ProcessGroupUnavailableError, match=r"ranks \[0, 1\]"):
        dist.all_reduce(torch.ones(1), group=loaded.group)
    assert copy.deepcopy(loaded).group is loaded.group  # a stand-in is shared, like a group
    again = pickle.loads(pickle.dumps(loaded.group))
    assert isinstance(again, patch_module.UnboundProcessGroup) and again.ranks == (0, 1)


@pytest.mark.dist
@pytest.mark.multigpu
def test_cuda_ddp_with_sync_batchnorm_subgroup_copies_and_trains() -> None:
    """The real EMA case (DDP refuses SyncBatchNorm on CPU): NCCL, one GPU per rank."""
    world_size = min(torch.cuda.device_count(), 4)
    results = run_ranks(cuda_ddp_sync_batchnorm_checks, world_size, backend="nccl", timeout=300)
    failures = [f"rank {r}: {k}: {v}" for r, res in enumerate(results) for k, v in res.items()]
    failures = [text for text in failures if not text.endswith(": ok")]
    assert not failures, "\n".join(failures)
