"""``torch-processgroup-copy`` with subgroups at world size 1024 (fake) and 32 (threaded).

Modules hold subgroups the way tensor/data-parallel code does (a SyncBatchNorm
over the tensor-parallel group, the data-parallel group as an attribute).
Deep copies share the very group objects; pickles re-bind on load to the
group with the same global ranks, whatever order the groups were made in,
and a rank outside that group gets ProcessGroupUnavailableError naming them.
"""

from __future__ import annotations

import copy
import pickle
from typing import Any, Iterator

import pytest

torch = pytest.importorskip("torch")
dist = torch.distributed

import compatshim  # noqa: E402
from compatshim.patches.torch_processgroup_copy import ProcessGroupUnavailableError  # noqa: E402
from tests.scale.worlds import fake_world, run_threaded  # noqa: E402

NAME = "torch-processgroup-copy"


@pytest.fixture(autouse=True)
def patched() -> Iterator[None]:
    compatshim.uninstall([NAME])
    compatshim.install([NAME])
    yield
    compatshim.uninstall([NAME])


class Parallel(torch.nn.Module):
    """A block holding its tensor-parallel group (in SyncBatchNorm) and data-parallel group."""

    def __init__(self, tp: Any, dp: Any) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.norm = torch.nn.SyncBatchNorm(4, process_group=tp)
        self.dp_group = dp
        self.groups = {"tp": tp, "dp": [dp]}


def _layout(world: int, tp_size: int) -> tuple[list[list[int]], list[list[int]]]:
    """Megatron-style groups: tensor-parallel blocks of ``tp_size``, data-parallel strides."""
    tp = [list(range(start, start + tp_size)) for start in range(0, world, tp_size)]
    dp = [list(range(offset, world, tp_size)) for offset in range(tp_size)]
    return tp, dp


def _make_groups(layouts: list[list[int]], rank: int) -> dict[tuple[int, ...], Any]:
    """Every rank calls new_group for every group, in the same order; keep this rank's."""
    mine = {}
    for ranks in layouts:
        group = dist.new_group(ranks)
        if rank in ranks:
            mine[tuple(ranks)] = group
    return mine


def _global_ranks(group: Any) -> list[int]:
    return sorted(dist.get_process_group_ranks(group))


WORLD, ME, TP = 1024, 6, 8


@pytest.mark.timeout(120)
def test_fake_world_1024_deepcopy_shares_and_pickle_rebinds_by_ranks() -> None:
    tp_layout, dp_layout = _layout(WORLD, TP)
    with fake_world(WORLD, ME):
        groups = _make_groups(tp_layout + dp_layout, ME)
        tp, dp = groups[tuple(range(0, TP))], groups[tuple(range(ME, WORLD, TP))]
        assert dist.get_world_size(dp) == WORLD // TP and dist.get_rank(dp) == 0
        assert dist.get_rank(tp) == ME
        model = Parallel(tp, dp)
        twin = copy.deepcopy(model)
        assert twin.norm.process_group is tp and twin.dp_group is dp
        assert twin.groups["dp"][0] is dp and twin.linear.weight is not model.linear.weight
        blob = pickle.dumps(model)
        loaded = pickle.loads(blob)
        assert loaded.norm.process_group is tp and loaded.dp_group is dp
        assert torch.equal(loaded.linear.weight, model.linear.weight)
    # a new job: same world, groups made in reverse order -> re-bound by ranks, not by order
    with fake_world(WORLD, ME):
        groups = _make_groups(list(reversed(dp_layout + tp_layout)), ME)
        loaded = pickle.loads(blob)
        assert loaded.norm.process_group is groups[tuple(range(0, TP))]
        assert loaded.dp_group is groups[tuple(range(ME, WORLD, TP))]
        assert _global_ranks(loaded.dp_group) == list(range(ME, WORLD, TP))
    # rank 9 of the same job is in other groups: the load names the ranks it lacks
    with fake_world(WORLD, 9):
        _make_groups(tp_layout + dp_layout, 9)
        with pytest.raises(ProcessGroupUnavailableError, match=r"global ranks \[0, 1, 2, 3, 4"):
            pickle.loads(blob)


def _threaded_copy_and_rebind(rank: int, world_size: int) -> dict[str, Any]:
    tp_layout, dp_layout = _layout(world_size, 4)
    groups = _make_groups(tp_layout + dp_layout, rank)
    tp = next(g for ranks, g in groups.items() if ranks in map(tuple, tp_layout))
    dp = next(g for ranks, g in groups.items() if ranks in map(tuple, dp_layout))
    model = Parallel(tp, dp)
    twin = copy.deepcopy(model)
    shared = twin.norm.process_group is tp and twin.dp_group is dp
    # the copy's group is live: a real all-reduce over the tensor-parallel block
    total = torch.tensor([float(rank)])
    dist.all_reduce(total, group=twin.norm.process_group)
    blobs: list[Any] = [None] * world_size
    dist.all_gather_object(blobs, (pickle.dumps(model.norm), pickle.dumps({"dp": [dp]})))
    bound: dict[str, list[int]] = {"tp": [], "dp": []}
    refused: list[str] = []
    for source, (norm_blob, dp_blob) in enumerate(blobs):
        for kind, blob, own in (("tp", norm_blob, tp), ("dp", dp_blob, dp)):
            try:
                loaded = pickle.loads(blob)
            except ProcessGroupUnavailableError as exc:
                refused.append(str(exc))
                continue
            group = loaded.process_group if kind == "tp" else loaded["dp"][0]
            assert group is own, (rank, source, kind)
            bound[kind].append(source)
    return {
        "shared": shared,
        "tp_sum": float(total),
        "bound": bound,
        "refused": refused,
        "tp": _global_ranks(tp),
    }


@pytest.mark.timeout(120)
def test_threaded_world_32_copies_share_and_pickles_rebind_to_the_right_subgroup() -> None:
    results = run_threaded(_threaded_copy_and_rebind, 32, timeout=100)
    for rank, result in enumerate(results):
        block = list(range(rank - rank % 4, rank - rank % 4 + 4))
        assert result["shared"] and result["tp"] == block
        assert result["tp_sum"] == float(sum(block))
        # a group pickled on another rank re-binds to this rank's own group over the same
        # global ranks; one this rank is not in is refused with the ranks named
        assert result["bound"] == {"tp": block, "dp": list(range(rank % 4, 32, 4))}
        assert len(result["refused"]) == 2 * 32 - 4 - 8
        for message in result["refused"]:
            assert "global ranks [" in message and f"global rank {rank} " in message, message
