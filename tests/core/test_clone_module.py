"""``compatshim.clone_module`` on the real torch of this environment, patched or not.

The multi-rank part (a real subgroup, SyncBatchNorm, DDP, collectives through
the clone) runs once in :mod:`core.pg_workers` without the patch installed;
the tests here read its checks. In-process tests cover the other handles,
hooks, tied weights and thread safety.
"""

from __future__ import annotations

import collections
import copy
import copyreg
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterator

import pytest

pytest.importorskip("torch")

import torch
import torch.distributed as dist
from torch import nn

import compatshim
from compatshim.cloning import shared_handle_types
from compatshim.patches import torch_processgroup_copy as patch_module
from tests.core.pg_workers import distributed_results

NAME = "torch-processgroup-copy"


class Tagged(nn.Module):
    """A model with the things EMA copies must keep: hooks, tied weights, custom state."""

    def __init__(self, group: Any) -> None:
        super().__init__()
        self.embed = nn.Embedding(5, 3)
        self.head = nn.Linear(3, 5, bias=False)
        self.head.weight = self.embed.weight  # tied
        self.frozen = nn.Linear(3, 3)
        self.frozen.requires_grad_(False)
        self.bn = nn.SyncBatchNorm(3, process_group=group)
        self.handles = {
            "lock": threading.Lock(),
            "rlock": threading.RLock(),
            "cond": threading.Condition(),
            "event": threading.Event(),
            "log": logging.getLogger("compatshim.tests.clone"),
            "stream": torch.cpu.Stream(),
        }
        self.parent_ref = [self]  # a cycle
        self.seen: list[int] = []
        self.register_forward_pre_hook(Tagged.record)
        self.config = {"decay": 0.999, "name": "ema"}

    def record(self, args: Any) -> None:
        self.seen.append(args[0].shape[0])

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.frozen(self.embed(ids)))


@pytest.fixture(params=["unpatched", "patched"])
def patch_state(request: pytest.FixtureRequest) -> Iterator[str]:
    compatshim.uninstall([NAME])
    if request.param == "patched":
        compatshim.install([NAME])
    yield request.param
    compatshim.uninstall([NAME])


@pytest.fixture
def model() -> Tagged:
    return Tagged(patch_module._bare_group(dist.ProcessGroup))


def test_shares_handles_copies_data(patch_state: str, model: Tagged) -> None:
    clone = compatshim.clone_module(model)
    assert clone.bn.process_group is model.bn.process_group
    assert all(clone.handles[k] is v for k, v in model.handles.items())
    for (name, p), q in zip(model.named_parameters(), clone.parameters()):
        assert q is not p and q.data_ptr() != p.data_ptr(), name
        assert torch.equal(p, q) and q.requires_grad == p.requires_grad, name
    assert clone.frozen.weight.requires_grad is False
    assert clone.head.weight is clone.embed.weight, "tied weights stay tied"
    assert clone.bn.running_mean is not model.bn.running_mean
    assert clone.parent_ref[0] is clone and clone.config == model.config


def test_hooks_run_on_the_clone(model: Tagged) -> None:
    clone = compatshim.clone_module(model)
    clone(torch.tensor([1, 2, 3]))
    assert clone.seen == [3] and model.seen == []


def test_clone_trains_independently(model: Tagged) -> None:
    clone = compatshim.clone_module(model)
    with torch.no_grad():
        clone.embed.weight.add_(1.0)
    assert not torch.equal(clone.embed.weight, model.embed.weight)


def test_share_argument_objects_and_types(model: Tagged) -> None:
    class Cache:
        pass

    cache, other = Cache(), Cache()
    model.cache, model.other = cache, other
    clone = compatshim.clone_module(model, share=[cache])
    assert clone.cache is cache and clone.other is not other
    clone = compatshim.clone_module(model, share=[Cache])
    assert clone.cache is cache and clone.other is other


def test_an_object_that_cannot_be_copied_is_named_with_the_way_out(model: Tagged) -> None:
    # deepcopy's own words were "cannot pickle '_io.BufferedWriter' object": no path, no share=
    with open(__file__, "rb") as handle:
        model.sink = {"log": handle}
        with pytest.raises(TypeError, match=r"module\.sink\['log'\]: cannot pickle .*share="):
            compatshim.clone_module(model)
        assert compatshim.clone_module(model, share=[handle]).sink["log"] is handle


def test_an_object_passed_in_share_is_shared_wherever_it_hangs(model: Tagged) -> None:
    # it was shared only where the handle walk looks (containers, __dict__, slots)
    with open(__file__, "rb") as handle:
        model.sink = collections.deque([handle])
        assert compatshim.clone_module(model, share=[handle]).sink[0] is handle


def test_a_group_held_in_a_deque_is_shared(model: Tagged) -> None:
    # the handle walk descended lists, tuples and sets only: deepcopy then met the group
    compatshim.uninstall([NAME])  # the patch would copy a group as itself anywhere
    other = patch_module._bare_group(dist.ProcessGroup)  # held nowhere else
    model.recent = collections.deque([other])
    assert compatshim.clone_module(model).recent[0] is other


@pytest.mark.parametrize("share", [None, 3, "group"])
def test_share_that_is_no_collection_is_named(model: Tagged, share: object) -> None:
    # None said "'NoneType' object is not iterable"; a str shared each of its characters
    with pytest.raises(TypeError, match=r"clone_module: share= takes objects or types"):
        compatshim.clone_module(model, share=share)  # type: ignore[arg-type]


def test_unbound_group_from_a_load_is_shared(model: Tagged) -> None:
    model.stale = patch_module.UnboundProcessGroup((0, 1), "gloo", None)
    assert compatshim.clone_module(model).stale is model.stale


def test_no_global_state_changes_and_thread_safe(model: Tagged) -> None:
    compatshim.uninstall([NAME])
    dispatch = dict(copy._deepcopy_dispatch)  # type: ignore[attr-defined]
    table = dict(copyreg.dispatch_table)
    with ThreadPoolExecutor(4) as pool:
        clones = list(pool.map(lambda _: compatshim.clone_module(model), range(16)))
    assert all(c.bn.process_group is model.bn.process_group for c in clones)
    assert dispatch == copy._deepcopy_dispatch and table == copyreg.dispatch_table  # type: ignore[attr-defined]
    with pytest.raises(TypeError):
        copy.deepcopy(model)  # plain deepcopy still behaves as upstream does


def test_handle_types_found_without_importing_anything() -> None:
    types = shared_handle_types()
    assert dist.ProcessGroup in types and type(threading.Lock()) in types


@pytest.mark.dist
@pytest.mark.parametrize("check", ["clone_shares_and_copies", "clone_collectives", "clone_ddp"])
def test_on_two_gloo_ranks_without_patch(check: str) -> None:
    failures = [f"rank {r}: {res[check]}" for r, res in enumerate(distributed_results())]
    failures = [text for text in failures if not text.endswith(": ok")]
    assert not failures, "\n".join(failures)
