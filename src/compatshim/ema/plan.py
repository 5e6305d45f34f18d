"""Pair every EMA tensor with its source once; the per-step update then is one foreach call.

A plan holds (ema, source) tensor lists: same-dtype pairs go to one
``_foreach_lerp_``, mixed-dtype pairs (fp32 EMA of bf16/fp16 working params)
to ``_foreach_mul_`` + ``_foreach_add_``. A full-size EMA over ZeRO shards gets
a *gather group*: every step the rank's masters are copied into one flat
buffer and all-gathered once; the EMA pairs are precomputed views into the
gathered buffer, so no per-parameter Python work remains.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch import Tensor

    from ..master import MasterMap, ShardPosition


class EmaMismatchError(ValueError):
    """The EMA model and the model do not line up (missing name or incompatible shape)."""


@dataclass
class GatherGroup:
    """Masters of one ZeRO group gathered with a single collective per step."""

    group: Any
    world_size: int
    masters: list[Tensor]
    send: Tensor
    gathered: Tensor

    def run(self) -> None:
        import torch
        import torch.distributed as dist

        from ..master.shards import all_gather_flat

        torch.cat([m.reshape(-1) for m in self.masters], out=self.send)
        if isinstance(self.group, tuple):
            self.gathered.copy_(all_gather_flat(self.send, self.group))
        else:
            dist.all_gather(list(self.gathered.chunk(self.world_size)), self.send, group=self.group)


@dataclass
class Plan:
    """The cached pairing for one (ema_model, model, optimizer, options) combination."""

    fingerprint: tuple[Any, ...]
    same_ema: list[Tensor] = field(default_factory=list)
    same_src: list[Tensor] = field(default_factory=list)
    mixed_ema: list[Tensor] = field(default_factory=list)
    mixed_src: list[Tensor] = field(default_factory=list)
    gathers: list[GatherGroup] = field(default_factory=list)

    def add(self, ema: Tensor, src: Tensor) -> None:
        if ema.dtype == src.dtype:
            self.same_ema.append(ema)
            self.same_src.append(src)
        else:
            self.mixed_ema.append(ema)
            self.mixed_src.append(src)

    def step(self, decay: float) -> None:
        import torch

        for gather in self.gathers:
            gather.run()
        weight = 1.0 - decay
        if self.same_ema:
            torch._foreach_lerp_(self.same_ema, self.same_src, weight)
        if self.mixed_ema:
            torch._foreach_mul_(self.mixed_ema, decay)
            torch._foreach_add_(self.mixed_ema, self.mixed_src, alpha=weight)


def is_excluded(name: str, exclude: Iterable[str]) -> bool:
    """True when ``name`` equals or fnmatch-matches one of ``exclude``."""
    return any(name == pattern or fnmatch.fnmatchcase(name, pattern) for pattern in exclude)


def strip_wrapper_prefix(name: str, ema_names: Any) -> str:
    """``module.x`` -> ``x`` when the EMA was copied from the unwrapped model."""
    while name not in ema_names and name.startswith("module."):
        name = name[len("module.") :]
    return name


def trainable_pairs(
    ema_model: torch.nn.Module, model: torch.nn.Module, exclude: tuple[str, ...]
) -> list[tuple[str, Tensor, Tensor]]:
    """(name, ema param, working param) for every trainable, non-excluded param."""
    ema_params = dict(ema_model.named_parameters())
    pairs: list[tuple[str, Tensor, Tensor]] = []
    for raw_name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        name = strip_wrapper_prefix(raw_name, ema_params)
        if is_excluded(name, exclude) or is_excluded(raw_name, exclude):
            continue
        if name not in ema_params:
            raise EmaMismatchError(
                f"compatshim.ema: EMA model has no parameter {name!r} (model has it); "
                "copy the EMA from the same (unwrapped) model or exclude the name"
            )
        pairs.append((name, ema_params[name], param))
    return pairs


def fingerprint(
    ema_model: torch.nn.Module,
    model: torch.nn.Module,
    optimizer: Any,
    sharded: bool,
    exclude: tuple[str, ...],
) -> tuple[Any, ...]:
    """Cheap identity of everything the plan depends on (rebuilt when it changes)."""
    return (
        id(model),
        id(optimizer),
        sharded,
        exclude,
        tuple((id(p), p.requires_grad, p.data_ptr()) for p in model.parameters()),
        tuple(p.data_ptr() for p in ema_model.parameters()),
    )


def _flat_view(ema: Tensor, name: str) -> Tensor:
    if not ema.is_contiguous():
        raise EmaMismatchError(f"compatshim.ema: EMA parameter {name!r} is not contiguous")
    return ema.data.view(-1)


def build_plan(
    ema_model: torch.nn.Module,
    model: torch.nn.Module,
    optimizer: Any,
    sharded: bool,
    exclude: tuple[str, ...],
) -> Plan:
    """Pair every trainable param of ``model`` with its EMA twin and its source tensor."""
    import torch

    from ..master import master_shard_position, working_to_master

    plan = Plan(fingerprint(ema_model, model, optimizer, sharded, exclude))
    masters: MasterMap | None = None
    if optimizer is not None and sharded:
        masters = working_to_master(optimizer)
    to_gather: dict[int, list[tuple[str, Tensor, Tensor, ShardPosition]]] = {}
    groups: dict[int, Any] = {}
    for name, ema, param in trainable_pairs(ema_model, model, exclude):
        master = masters[param] if masters is not None and param in masters else None
        if master is None or master is param:
            _check_same_shape(name, ema, param)
            plan.add(ema.data, param.data)
            continue
        position = master_shard_position(optimizer, param)
        if ema.shape == param.shape and position.is_whole:
            plan.add(ema.data, master.data.view(param.shape))
        elif ema.shape == param.shape:
            key = id(position.group)
            groups[key] = position.group
            to_gather.setdefault(key, []).append((name, ema, master, position))
        elif ema.dim() == 1 and ema.numel() == position.length:
            plan.add(ema.data, master.data)
        else:
            raise EmaMismatchError(
                f"compatshim.ema: EMA parameter {name!r} has shape {tuple(ema.shape)}, neither "
                f"the full shape {tuple(param.shape)} nor this rank's shard ({position.length},)"
            )
    for key, entries in to_gather.items():
        plan.gathers.append(_gather_group(plan, groups[key], entries, torch))
    return plan


def _check_same_shape(name: str, ema: Tensor, param: Tensor) -> None:
    if ema.shape != param.shape:
        raise EmaMismatchError(
            f"compatshim.ema: EMA parameter {name!r} has shape {tuple(ema.shape)} but the model's "
            f"is {tuple(param.shape)} and no optimizer shard explains it (pass the ZeRO optimizer)"
        )


def _gather_group(
    plan: Plan,
    group: Any,
    entries: list[tuple[str, Tensor, Tensor, ShardPosition]],
    torch: Any,
) -> GatherGroup:
    world_size = entries[0][3].world_size
    dtype = entries[0][2].dtype
    device = entries[0][2].device
    total = sum(position.length for *_, position in entries)
    send = torch.empty(total, dtype=dtype, device=device)
    gathered = torch.empty(total * world_size, dtype=dtype, device=device)
    offset = 0
    for name, ema, _master, position in entries:
        flat = _flat_view(ema, name)
        for rank in range(world_size):
            start = rank * position.length
            valid = max(0, min(position.length, position.numel - start))
            if valid:
                src = gathered[rank * total + offset : rank * total + offset + valid]
                plan.add(flat[start : start + valid], src)
        offset += position.length
    return GatherGroup(group, world_size, [m for _, _, m, _ in entries], send, gathered)
