"""Worker functions for the ProcessGroup copy/pickle tests, run on real gloo ranks.

One ``run_ranks`` call does every distributed check (spawning ranks that
import torch is the expensive part), and :func:`distributed_results` caches
its outcome for the whole pytest process, so both test modules share it.
Each check is recorded as ``"ok"`` or its traceback, so a failure points at
one check instead of failing them all. The ranks start with
``COMPATSHIM_AUTO=1``, as a user's torchrun ranks would.
"""

from __future__ import annotations

import copy
import functools
import io
import logging
import pickle
import threading
import traceback
from typing import Any, Callable

import torch
from torch import nn

from tests.harness.dist import run_ranks

WORLD_SIZE = 2


def count_calls(module: Any, args: Any, output: Any) -> None:
    """A forward hook: counts calls on the module it is attached to (copies count their own)."""
    module.calls += 1


class Holder(nn.Module):
    """A model that holds groups every way users do: attribute, SyncBatchNorm, containers."""

    def __init__(
        self, sub: Any, mine: Any, world: Any, *, sync_bn: bool = True, lock: bool = True
    ) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.linear.bias.requires_grad_(False)
        # DDP refuses SyncBatchNorm on CPU modules, so the DDP-wrapped model uses BatchNorm1d.
        self.bn = nn.SyncBatchNorm(4, process_group=sub) if sync_bn else nn.BatchNorm1d(4)
        self.group = sub
        self.groups = {"mine": [mine], "world": (world,), "nested": {"again": [(sub,)]}}
        if lock:  # a lock can be shared by a copy but never pickled
            self.lock = threading.Lock()
        self.log = logging.getLogger("compatshim.tests.pg")
        self.tag = "custom attribute"
        self.calls = 0
        self.register_buffer("steps", torch.arange(3.0))
        self.register_forward_hook(count_calls)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.linear(x))


def _check(results: dict[str, str], name: str, fn: Callable[[], None]) -> None:
    try:
        fn()
        results[name] = "ok"
    except BaseException:
        results[name] = traceback.format_exc()


def _assert_shares_and_copies(original: Any, clone: Any, sub: Any, mine: Any, world: Any) -> None:
    assert clone is not original
    assert clone.group is sub and clone.bn.process_group is sub
    assert clone.groups["mine"][0] is mine and clone.groups["world"][0] is world
    assert clone.groups["nested"]["again"][0][0] is sub
    assert clone.log is original.log
    if hasattr(original, "lock"):
        assert clone.lock is original.lock
    assert clone.tag == original.tag
    for (name, p), q in zip(original.named_parameters(), clone.parameters()):
        assert p is not q and p.data_ptr() != q.data_ptr(), name
        assert bool((p == q).all()) and p.requires_grad == q.requires_grad, name
    assert clone.linear.bias.requires_grad is False
    assert clone.steps is not original.steps and bool((clone.steps == original.steps).all())
    before = original.calls
    clone.eval()(torch.ones(2, 4))
    assert clone.calls == before + 1 and original.calls == before, "hook must count on the copy"


def _collective_through(group: Any, rank: int, members: list[int]) -> None:
    import torch.distributed as dist

    value = torch.tensor([float(rank + 1)])
    dist.all_reduce(value, group=group)
    assert value.item() == sum(r + 1 for r in members), (value.item(), members)


def _ddp_step_syncs(ddp: Any, rank: int) -> None:
    """A backward through ``ddp`` averages gradients over WORLD: equal on every rank."""
    import torch.distributed as dist

    ddp.eval()
    ddp.zero_grad()
    ddp(torch.full((2, 4), float(rank + 1))).sum().backward()
    grad = ddp.module.linear.weight.grad.detach().clone()
    gathered = [torch.empty_like(grad) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, grad)
    assert all(bool(torch.allclose(g, gathered[0])) for g in gathered), "gradients not averaged"


def _saved(obj: Any) -> bytes:

    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def _loaded(data: bytes, **kwargs: Any) -> Any:

    kwargs.setdefault("weights_only", False)
    return torch.load(io.BytesIO(data), **kwargs)


def distributed_checks(rank: int, world_size: int) -> dict[str, Any]:
    """Every multi-rank check, unpatched first (defect, clone_module), then patched."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    import compatshim
    from compatshim.patches import torch_processgroup_copy as patch_module

    results: dict[str, Any] = {}

    def armed_by_auto_in_spawned_rank() -> None:
        # COMPATSHIM_AUTO=1 reached this interpreter at start-up; no code here installed it.
        if not _startup_hook_installed():
            results["auto_skip"] = "compatshim_auto.pth is not installed (not a wheel install)"
            return
        row = next(r for r in compatshim.status() if r["name"] == "torch-processgroup-copy")
        assert row["armed"] and row["applied"] and row["fixed"], row
        assert copy.deepcopy(dist.group.WORLD) is dist.group.WORLD

    _check(results, "armed_by_auto_in_spawned_rank", armed_by_auto_in_spawned_rank)
    compatshim.uninstall()  # the checks below start unpatched
    world = dist.group.WORLD
    sub = dist.new_group(list(range(world_size)))  # same ranks as WORLD, a different group
    solos = [dist.new_group([r]) for r in range(world_size)]
    mine = solos[rank]
    everyone = list(range(world_size))
    model = Holder(sub, mine, world)
    picklable = Holder(sub, mine, world, lock=False)
    torch.manual_seed(0)
    ddp = DistributedDataParallel(Holder(sub, mine, world, sync_bn=False, lock=False))

    # -- without the patch ---------------------------------------------------------------
    def defect_is_real() -> None:
        try:
            copy.deepcopy(model)
        except TypeError as exc:
            assert "pickle" in str(exc), exc
        else:
            raise AssertionError("plain deepcopy of a model holding a ProcessGroup worked")

    def clone_shares_and_copies() -> None:
        _assert_shares_and_copies(model, compatshim.clone_module(model), sub, mine, world)

    def clone_collectives() -> None:
        clone = compatshim.clone_module(model)
        _collective_through(clone.group, rank, everyone)
        _collective_through(clone.bn.process_group, rank, everyone)
        _collective_through(clone.groups["mine"][0], rank, [rank])

    def clone_ddp() -> None:
        clone = compatshim.clone_module(ddp)
        assert clone.module.group is sub and clone.process_group is world
        _ddp_step_syncs(clone, rank)

    _check(results, "defect_is_real", defect_is_real)
    _check(results, "clone_shares_and_copies", clone_shares_and_copies)
    _check(results, "clone_collectives", clone_collectives)
    _check(results, "clone_ddp", clone_ddp)

    # -- with the patch ------------------------------------------------------------------
    compatshim.install(["torch-processgroup-copy"])

    def deepcopy_shares_and_copies() -> None:
        duplicate = copy.deepcopy(picklable)  # the patch shares groups; locks are not its job
        _assert_shares_and_copies(picklable, duplicate, sub, mine, world)
        _collective_through(duplicate.bn.process_group, rank, everyone)
        assert copy.copy(sub) is sub

    def deepcopy_ddp() -> None:
        duplicate = copy.deepcopy(ddp)
        assert duplicate.module.group is sub
        _ddp_step_syncs(duplicate, rank)

    def save_load_rebinds() -> None:
        loaded = _loaded(_saved(picklable))
        assert loaded.group is sub, "same ranks as WORLD: the group name must pick sub"
        assert loaded.bn.process_group is sub
        assert loaded.groups["world"][0] is world and loaded.groups["mine"][0] is mine
        assert loaded.groups["nested"]["again"][0][0] is sub
        assert loaded.tag == picklable.tag and bool((loaded.steps == picklable.steps).all())
        _collective_through(loaded.bn.process_group, rank, everyone)
        _collective_through(loaded.groups["mine"][0], rank, [rank])
        assert pickle.loads(pickle.dumps(sub)) is sub
        assert pickle.loads(pickle.dumps([world, mine])) == [world, mine]

    def ddp_save_load() -> None:
        loaded = _loaded(_saved(ddp))
        assert loaded.module.group is sub and loaded.process_group is world
        _ddp_step_syncs(loaded, rank)

    def other_ranks_group_fails_at_load() -> None:
        theirs: list[Any] = [None] * world_size
        dist.all_gather_object(theirs, _saved({"group": mine}))
        other = (rank + 1) % world_size
        try:
            _loaded(theirs[other])
        except patch_module.ProcessGroupUnavailableError as exc:
            text = str(exc)
            assert f"global ranks [{other}]" in text and f"global rank {rank}" in text, text
        else:
            raise AssertionError("loading a group this rank is not in did not fail")
        assert _loaded(theirs[rank])["group"] is mine

    def weights_only_load() -> None:
        data = _saved({"group": sub})
        try:
            _loaded(data, weights_only=True)
        except pickle.UnpicklingError as exc:
            assert "rebind_process_group" in str(exc), exc
        else:
            raise AssertionError("weights_only=True accepted the re-bind call unasked")
        add_safe_globals = getattr(torch.serialization, "add_safe_globals", None)
        if add_safe_globals is not None:  # torch 2.4+
            add_safe_globals([patch_module.rebind_process_group])
            assert _loaded(data, weights_only=True)["group"] is sub

    def uninstall_restores() -> None:
        compatshim.uninstall(["torch-processgroup-copy"])
        for name in ("__deepcopy__", "__copy__", "__reduce_ex__"):
            assert name not in vars(dist.ProcessGroup), name
        defect_is_real()

    _check(results, "deepcopy_shares_and_copies", deepcopy_shares_and_copies)
    _check(results, "deepcopy_ddp", deepcopy_ddp)
    _check(results, "save_load_rebinds", save_load_rebinds)
    _check(results, "ddp_save_load", ddp_save_load)
    _check(results, "other_ranks_group_fails_at_load", other_ranks_group_fails_at_load)
    _check(results, "weights_only_load", weights_only_load)
    if rank == 0:
        results["saved_model"] = _saved(picklable)
    _check(results, "uninstall_restores", uninstall_restores)
    dist.barrier()
    return results


def cuda_ddp_sync_batchnorm_checks(rank: int, world_size: int) -> dict[str, Any]:
    """On GPUs with NCCL: DDP over a model whose SyncBatchNorm uses a subgroup (mmengine EMA).

    The copy trains: SyncBatchNorm gathers statistics over the shared subgroup
    and DDP averages gradients, so every rank ends with the same gradient.
    """
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    import compatshim

    torch.cuda.set_device(rank)
    sub = dist.new_group(list(range(world_size)))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.SyncBatchNorm(4, process_group=sub)).cuda()
    ddp = DistributedDataParallel(model, device_ids=[rank])
    results: dict[str, Any] = {}

    def trains_in_step(copy_of_ddp: Any) -> None:
        assert copy_of_ddp.module[1].process_group is sub
        copy_of_ddp.train()
        copy_of_ddp.zero_grad()
        batch = torch.randn(8, 4, device="cuda") + rank
        copy_of_ddp(batch).square().sum().backward()
        grad = copy_of_ddp.module[0].weight.grad.detach().clone()
        gathered = [torch.empty_like(grad) for _ in range(world_size)]
        dist.all_gather(gathered, grad)
        assert all(bool(torch.allclose(g, gathered[0])) for g in gathered)

    def clone_shares_stream_and_trains() -> None:
        stream = torch.cuda.Stream()  # a handle the patch alone would not share
        ddp.module.stream = stream
        clone = compatshim.clone_module(ddp)
        del ddp.module.stream
        assert clone.module.stream is stream
        trains_in_step(clone)

    _check(results, "clone_module", clone_shares_stream_and_trains)
    compatshim.install(["torch-processgroup-copy"])
    _check(results, "patched_deepcopy", lambda: trains_in_step(copy.deepcopy(ddp)))
    compatshim.uninstall(["torch-processgroup-copy"])
    dist.barrier()
    return results


def _startup_hook_installed() -> bool:
    import site
    from pathlib import Path

    dirs = [*site.getsitepackages(), site.getusersitepackages()]  # where .pth files run
    return any((Path(d) / "compatshim_auto.pth").is_file() for d in dirs if d)


@functools.cache
def distributed_results() -> tuple[dict[str, Any], ...]:
    """The per-rank outcome of :func:`distributed_checks`, computed once per pytest process."""
    ranks = run_ranks(distributed_checks, WORLD_SIZE, timeout=240, env={"COMPATSHIM_AUTO": "1"})
    return tuple(ranks)
