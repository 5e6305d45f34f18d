"""Pair every EMA tensor with its source once; the per-step update then is one foreach call.

A plan holds (ema, source) lists: same-dtype pairs go to one ``_foreach_lerp_``,
mixed-dtype pairs (fp32 EMA of bf16/fp16 working params) to ``_foreach_mul_`` +
``_foreach_add_``. Plain pairs are the Parameter objects themselves, so a
``p.data = ...`` is followed without re-pairing (``guard`` says what proves a
plan valid). A full-size EMA over ZeRO shards gets a *gather group*: every step
the rank's masters are copied into one flat buffer and all-gathered once; the
EMA pairs are views into the gathered buffer. FSDP2 (DTensor) params pair
their local shards. Plans with masters or DTensors also re-check every
param's storage each step (``slow_key``): their frameworks re-point storage.
The foreach skips torch's autograd kernel where that kernel would do nothing
(``dispatch``), so passing Parameters costs what passing ``.data`` would.

Buffers (persistent ones, the ``state_dict``'s) pair by name like params and
follow the policy (``BUFFER_POLICIES``): floating-point buffers averaged join
the params' lerp (no extra call); integer buffers, and every buffer under
``"copy"``, go to one ``_foreach_copy_``. Their source is always the working
model's buffer: optimizers hold no masters of buffers, and ZeRO shards none.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Literal

from .dispatch import BelowAutograd
from .guard import (
    EPOCH,
    REQUIRES_GRAD,
    buffers_current,
    group_signature,
    ref,
    registration_epoch,
)
from .names import WRAPPER_SEGMENTS, canonical

if TYPE_CHECKING:
    import torch
    from torch import Tensor

    from ..master import MasterMap, ShardPosition

__all__ = [
    "BUFFER_POLICIES",
    "BufferPolicy",
    "EmaMismatchError",
    "Plan",
    "build_plan",
    "trainable_pairs",
]

BufferPolicy = Literal["average", "copy", "skip"]
BUFFER_POLICIES: tuple[BufferPolicy, ...] = ("average", "copy", "skip")


class EmaMismatchError(ValueError):
    """The EMA model and the model do not line up (missing name or incompatible shape)."""


EmaMismatchError.__module__ = "compatshim.ema"  # tracebacks and pickles: the public name


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

    model: Callable[[], Any]
    optimizer: Callable[[], Any]
    sharded: bool
    exclude: tuple[str, ...]
    buffers: str
    epoch: int
    groups: Any
    watched: list[Tensor] = field(default_factory=list)
    flags: list[bool] = field(default_factory=list)
    slow_key: tuple[Any, ...] | None = None
    same_ema: list[Tensor] = field(default_factory=list)
    same_src: list[Tensor] = field(default_factory=list)
    mixed_ema: list[Tensor] = field(default_factory=list)
    mixed_src: list[Tensor] = field(default_factory=list)
    copy_ema: list[Tensor] = field(default_factory=list)  # buffers copied, not averaged
    copy_src: list[Tensor] = field(default_factory=list)
    # every paired buffer's slot on both models: slot_dicts[i][slot_keys[i]] is slot_held[i]
    slot_dicts: list[dict[str, Any]] = field(default_factory=list)
    slot_keys: list[str] = field(default_factory=list)
    slot_held: list[Tensor] = field(default_factory=list)
    gathers: list[GatherGroup] = field(default_factory=list)
    torch: Any = None
    # torch.__future__'s flag: while set, ``.to()`` swaps Parameter objects with no hook
    overwrites: Callable[[], bool] = bool
    below: BelowAutograd | None = None  # set when every foreach tensor is plain (``dispatch``)

    def add(self, ema: Tensor, src: Tensor) -> None:
        if ema.dtype == src.dtype:
            self.same_ema.append(ema)
            self.same_src.append(src)
        else:
            self.mixed_ema.append(ema)
            self.mixed_src.append(src)

    def valid(
        self,
        ema_model: Any,
        model: Any,
        optimizer: Any,
        sharded: bool,
        exclude: tuple[str, ...],
        buffers: str,
    ) -> bool:
        """True while nothing the pairing depends on has changed (see ``guard``)."""
        return (
            self.epoch == EPOCH[0]
            and not self.overwrites()
            and self.model() is model
            and self.optimizer() is optimizer
            and self.sharded == sharded
            and self.exclude == exclude
            and self.buffers == buffers
            and self.groups == group_signature(optimizer)
            and list(map(REQUIRES_GRAD, self.watched)) == self.flags
            and (
                not self.slot_held
                or buffers_current(self.slot_dicts, self.slot_keys, self.slot_held)
            )
            and (self.slow_key is None or self.slow_key == storage_key(ema_model, model))
        )

    def step(self, decay: float) -> None:
        torch = self.torch
        enabled = torch.is_grad_enabled()
        torch._C._set_grad_enabled(False)  # the pairs are Parameters: no autograd here
        try:
            if self.gathers:
                for gather in self.gathers:
                    gather.run()
            below = self.below
            if below is not None and below.allowed():
                with below.guard():
                    self._foreach(decay)
            else:
                self._foreach(decay)
        finally:
            torch._C._set_grad_enabled(enabled)

    def _foreach(self, decay: float) -> None:
        torch = self.torch
        if self.same_ema:
            torch._foreach_lerp_(self.same_ema, self.same_src, 1.0 - decay)
        if self.mixed_ema:
            torch._foreach_mul_(self.mixed_ema, decay)
            try:
                torch._foreach_add_(self.mixed_ema, self.mixed_src, alpha=1.0 - decay)
            except RuntimeError:
                self._unscale_unfit_mixed(decay)
                raise
        if self.copy_ema:
            torch._foreach_copy_(self.copy_ema, self.copy_src)

    def _unscale_unfit_mixed(self, decay: float) -> None:
        """``_foreach_add_`` stopped at the first mixed pair it cannot take, after
        ``_foreach_mul_`` had scaled every mixed EMA tensor: from that pair on, undo the
        scaling (one rounding; nothing to undo from at decay 0), so those pairs read as not
        stepped, as the same-dtype pairs after a failed ``_foreach_lerp_`` do."""
        torch = self.torch
        for index, (ema, src) in enumerate(zip(self.mixed_ema, self.mixed_src)):
            try:
                fits = torch.broadcast_shapes(ema.shape, src.shape) == ema.shape
            except RuntimeError:
                fits = False
            if not fits or ema.device != src.device:
                if decay:
                    torch._foreach_div_(self.mixed_ema[index:], decay)
                return

    def first_unfit_pair(self) -> int | None:
        """Index of the first same-dtype pair ``_foreach_lerp_`` cannot take (after it failed)."""
        for index, (ema, src) in enumerate(zip(self.same_ema, self.same_src)):
            if ema.dtype != src.dtype or ema.shape != src.shape or ema.device != src.device:
                return index
        return None


def is_excluded(name: str, exclude: Iterable[str]) -> bool:
    """True when ``name`` equals or fnmatch-matches one of ``exclude``."""
    return any(name == pattern or fnmatch.fnmatchcase(name, pattern) for pattern in exclude)


def _excluded(name: str, exclude: Iterable[str]) -> bool:
    """``name`` or its canonical form (wrapper prefixes dropped) is excluded."""
    return is_excluded(name, exclude) or is_excluded(canonical(name), exclude)


def is_dtensor(tensor: Any) -> bool:
    """FSDP2 / DTensor parameter (duck-typed: compatshim never imports it to ask)."""
    return hasattr(tensor, "to_local") and hasattr(tensor, "placements")


def _ptr(tensor: Any) -> int:
    return int((tensor.to_local() if is_dtensor(tensor) else tensor).data_ptr())


def storage_key(ema_model: torch.nn.Module, model: torch.nn.Module) -> tuple[Any, ...]:
    """Every param's identity and storage, walked afresh (only for master / DTensor plans)."""
    return (
        tuple((id(p), p.requires_grad, _ptr(p)) for p in model.parameters()),
        tuple(_ptr(p) for p in ema_model.parameters()),
    )


class NameIndex:
    """Find the EMA entry for a source name: exactly, else by canonical name."""

    def __init__(self, ema_entries: Mapping[str, object], kind: str = "parameter") -> None:
        self.exact = ema_entries
        self.kind = kind  # "parameter" or "buffer", for the messages
        self.by_canonical: dict[str, list[str]] | None = None

    def lookup(self, name: str) -> str:
        if name in self.exact:
            return name
        if self.by_canonical is None:
            self.by_canonical = {}
            for ema_name in self.exact:
                self.by_canonical.setdefault(canonical(ema_name), []).append(ema_name)
        key = canonical(name)
        found = self.by_canonical.get(key, [])
        if len(found) == 1:
            return found[0]
        if found:
            raise EmaMismatchError(
                f"compatshim.ema: model {self.kind} {name!r} matches several EMA {self.kind}s "
                f"once wrapper prefixes are removed: {sorted(found)}; name them apart"
            )
        hint = ""
        if key.endswith("_flat_param"):
            hint = " (FSDP1 flattens parameters unless wrapped with use_orig_params=True)"
        remedy = "copy the EMA from the same model or exclude the name"
        if self.kind == "buffer":
            remedy += " (or pass buffers='skip' to leave every buffer alone)"
        raise EmaMismatchError(
            f"compatshim.ema: EMA model has no {self.kind} {name!r} (model has it; looked for "
            f"{key!r} without wrapper prefixes {sorted(WRAPPER_SEGMENTS)}){hint}; {remedy}"
        )


def walk(
    ema_model: torch.nn.Module, model: torch.nn.Module, exclude: tuple[str, ...]
) -> tuple[list[tuple[str, Tensor, Tensor]], list[Tensor]]:
    """(EMA name, EMA param, working param) per trainable param, and every non-excluded param.

    Every name of a tied parameter is paired (``named_parameters`` keeps only the first): a
    model that ties two names to one tensor and an EMA that holds them apart steps both EMA
    tensors; an EMA tensor is stepped once, and one that would follow two model tensors
    (the EMA ties what the model does not) is an ``EmaMismatchError``.
    """
    ema_params = dict(ema_model.named_parameters(remove_duplicate=False))
    index = NameIndex(ema_params)
    pairs: list[tuple[str, Tensor, Tensor]] = []
    watched: list[Tensor] = []
    follows: dict[int, tuple[str, Tensor]] = {}  # id(EMA param) -> (EMA name, its source)
    for raw_name, param in model.named_parameters(remove_duplicate=False):
        if _excluded(raw_name, exclude):
            continue
        watched.append(param)
        if param.requires_grad:
            name = index.lookup(raw_name)
            ema = ema_params[name]
            if _first_name(follows, ema, name, param, "parameters", "ties"):
                pairs.append((name, ema, param))
    return pairs, watched


def _first_name(
    follows: dict[int, tuple[str, Tensor]], ema: Tensor, name: str, src: Tensor, kind: str,
    verb: str,
) -> bool:  # fmt: skip
    """Whether ``name`` is the first name ``ema`` is met by (``follows``: id(EMA tensor) ->
    (EMA name, its source)): each EMA tensor is stepped once. A later name must follow the
    same source, else the EMA joins what the model holds apart (``kind``: "parameters" or
    "buffers"; ``verb``: how the EMA joins them)."""
    entry = (name, src)
    known = follows.setdefault(id(ema), entry)
    if known is entry:
        return True
    if known[1] is not src:
        raise EmaMismatchError(
            f"compatshim.ema: EMA {kind} {known[0]!r} and {name!r} are one tensor but the "
            f"model's are two: the EMA {verb} {kind} the model does not; copy the EMA from the "
            "model as it is now (copy.deepcopy(model))"
        )
    return False


def persistent_buffers(module: torch.nn.Module) -> list[tuple[str, dict[str, Any], str, Tensor]]:
    """(name, owning ``_buffers`` dict, key, buffer) for each buffer ``state_dict`` saves,
    under every name it goes by (a buffer shared by two modules: both, as ``state_dict``).

    Non-persistent buffers (caches such as rotary tables or masks, rebuilt by the
    module, often lazily resized) are left out, as timm's ``state_dict``-based EMA
    leaves them.
    """
    out: list[tuple[str, dict[str, Any], str, Tensor]] = []
    for prefix, owner in module.named_modules(remove_duplicate=False):
        transient = getattr(owner, "_non_persistent_buffers_set", ())
        slots = owner._buffers
        for key, buf in slots.items():
            if buf is not None and key not in transient:
                out.append((f"{prefix}.{key}" if prefix else key, slots, key, buf))
    return out


def unmatched_excludes(exclude: tuple[str, ...], model: torch.nn.Module) -> list[str]:
    """The ``exclude`` entries that name no parameter and no persistent buffer of ``model``."""
    names = [n for n, _ in model.named_parameters(remove_duplicate=False)]
    names += [n for n, *_ in persistent_buffers(model)]
    names += [canonical(n) for n in names]
    return [p for p in exclude if not any(is_excluded(n, (p,)) for n in names)]


def half_tied_excludes(exclude: tuple[str, ...], model: torch.nn.Module) -> list[tuple[str, str]]:
    """(excluded name, kept name) where ``exclude`` names one name of a tied tensor (or shared
    buffer) but not another: the tensor is averaged through the kept name all the same."""
    names: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(name)
    for name, *_, buf in persistent_buffers(model):
        names.setdefault(id(buf), []).append(name)
    out = []
    for group in names.values():
        left_out = [n for n in group if _excluded(n, exclude)]
        kept = [n for n in group if n not in left_out]
        if left_out and kept:
            out.append((left_out[0], kept[0]))
    return out


def trainable_pairs(
    ema_model: torch.nn.Module, model: torch.nn.Module, exclude: tuple[str, ...]
) -> list[tuple[str, Tensor, Tensor]]:
    """(EMA name, EMA param, working param) for every trainable, non-excluded param."""
    return walk(ema_model, model, exclude)[0]


def _local_pair(name: str, ema: Any, param: Any) -> tuple[Tensor, Tensor]:
    """FSDP2: this rank's shard of the EMA and of the param, laid out alike."""
    if not (is_dtensor(ema) and is_dtensor(param)):
        raise EmaMismatchError(
            f"compatshim.ema: {name!r} is a DTensor (FSDP2) on one side only; shard the EMA "
            "like the model (fully_shard a copy of the unsharded model with the same mesh)"
        )
    if ema.placements != param.placements or ema.device_mesh != param.device_mesh:
        raise EmaMismatchError(
            f"compatshim.ema: EMA parameter {name!r} is sharded as {ema.placements} but the "
            f"model's as {param.placements}; fully_shard both with the same mesh and layout"
        )
    _check_same_shape(name, ema, param)
    local_ema, local_src = ema.to_local(), param.to_local()
    _check_same_shape(name, local_ema, local_src)
    _check_same_device(name, local_ema, local_src, whose="the model's shard")
    return local_ema, local_src


def _pair_buffers(
    plan: Plan,
    ema_model: torch.nn.Module,
    model: torch.nn.Module,
    exclude: tuple[str, ...],
    average: bool,
) -> bool:
    """Pair each persistent buffer of ``model`` with its EMA twin; True if one is a DTensor.

    Every name of a shared buffer is paired, as :func:`walk` pairs tied parameters: each EMA
    buffer is stepped once, and one that would follow two model buffers is an error.
    """
    import torch

    ema_slots = {name: (slots, key, buf) for name, slots, key, buf in persistent_buffers(ema_model)}
    index = NameIndex(ema_slots, kind="buffer")
    dtensor = False
    follows: dict[int, tuple[str, Tensor]] = {}  # id(EMA buffer) -> (EMA name, its source)
    for raw_name, slots, key, buf in persistent_buffers(model):
        if _excluded(raw_name, exclude):
            continue
        name = index.lookup(raw_name)
        ema_slots_of, ema_key, ema = ema_slots[name]
        plan.slot_dicts += [slots, ema_slots_of]  # every name's slot: a reassignment rebuilds
        plan.slot_keys += [key, ema_key]
        plan.slot_held += [buf, ema]
        if not _first_name(follows, ema, name, buf, "buffers", "shares"):
            continue  # another name of one shared EMA buffer: stepped once
        if is_dtensor(buf) or is_dtensor(ema):
            ema, buf = _local_pair(name, ema, buf)
            dtensor = True
        else:
            _check_same_shape(name, ema, buf, kind="buffer")
            _check_writable(name, ema, torch, kind="buffer")
        if average and ema.is_floating_point() and buf.is_floating_point():
            _check_same_device(name, ema, buf, kind="buffer")
            plan.add(ema, buf)  # joins the params' lerp (or mul/add when dtypes differ)
        else:
            _check_no_truncation(name, ema, buf)
            plan.copy_ema.append(ema)
            plan.copy_src.append(buf)
    return dtensor


def build_plan(
    ema_model: torch.nn.Module,
    model: torch.nn.Module,
    optimizer: Any,
    sharded: bool,
    exclude: tuple[str, ...],
    buffers: str = "average",
) -> Plan:
    """Pair every trainable param of ``model`` with its EMA twin and its source tensor, and
    every persistent buffer with its twin unless ``buffers`` is ``"skip"``."""
    import torch

    from ..master import master_shard_position, working_to_master

    plan = Plan(
        model=ref(model),
        optimizer=ref(optimizer),
        sharded=sharded,
        exclude=exclude,
        buffers=buffers,
        epoch=registration_epoch(),
        groups=group_signature(optimizer),
        torch=torch,
        overwrites=torch.__future__.get_overwrite_module_params_on_conversion,
    )
    pairs, plan.watched = walk(ema_model, model, exclude)
    plan.flags = list(map(REQUIRES_GRAD, plan.watched))
    slow = False
    masters: MasterMap | None = None
    if optimizer is not None and sharded:
        masters = working_to_master(optimizer)
    to_gather: dict[int, list[tuple[str, Tensor, Tensor, ShardPosition]]] = {}
    groups: dict[int, Any] = {}
    for name, ema, param in pairs:
        master = masters[param] if masters is not None and param in masters else None
        if is_dtensor(param) or is_dtensor(ema):
            if master is not None and master is not param:
                raise EmaMismatchError(
                    f"compatshim.ema: {name!r} is a DTensor with a separate master; "
                    "this layout is not known"
                )
            plan.add(*_local_pair(name, ema, param))
            slow = True
            continue
        if master is None or master is param:
            if ema.shape != param.shape and _fsdp1(model) and not _fsdp1(ema_model):
                raise EmaMismatchError(
                    f"compatshim.ema: EMA parameter {name!r} has shape {tuple(ema.shape)} but "
                    f"the model's is {tuple(param.shape)}: the model is wrapped in FSDP1, which "
                    "leaves each rank a flat slice of every parameter; wrap the EMA in FSDP1 as "
                    "the model is (FullyShardedDataParallel(ema, use_orig_params=True) with the "
                    "same wrap policy and process group), and each rank averages its slices"
                )
            _check_same_shape(name, ema, param)
            _check_same_device(name, ema, param)
            _check_writable(name, ema, torch)
            plan.add(ema, param)
            continue
        slow = True
        _check_same_device(name, ema, master, whose="its fp32 master (the ZeRO optimizer's)")
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
    if buffers != "skip" and _pair_buffers(plan, ema_model, model, exclude, buffers == "average"):
        slow = True
    if slow:
        plan.slow_key = storage_key(ema_model, model)
    below = BelowAutograd(torch)
    foreach = [*plan.same_ema, *plan.same_src, *plan.mixed_ema, *plan.mixed_src]
    if below.plain([*foreach, *plan.copy_ema, *plan.copy_src]):
        plan.below = below
    return plan


def _fsdp1(module: torch.nn.Module) -> bool:
    """Whether ``module`` is or holds torch's FSDP1 ``FullyShardedDataParallel``."""
    return any(
        type(m).__name__ == "FullyShardedDataParallel"
        and type(m).__module__.startswith("torch.distributed.fsdp")
        for m in module.modules()
    )


def _flat_view(ema: Tensor, name: str) -> Tensor:
    if not ema.is_contiguous():
        raise EmaMismatchError(f"compatshim.ema: EMA parameter {name!r} is not contiguous")
    return ema.data.view(-1)


def _check_same_shape(name: str, ema: Tensor, param: Tensor, kind: str = "parameter") -> None:
    if ema.shape != param.shape and kind == "buffer":
        raise EmaMismatchError(
            f"compatshim.ema: EMA buffer {name!r} has shape {tuple(ema.shape)} but the model's "
            f"is {tuple(param.shape)}; copy the EMA from the same model, exclude the name, or "
            "pass buffers='skip' to leave every buffer alone"
        )
    if ema.shape != param.shape:
        raise EmaMismatchError(
            f"compatshim.ema: EMA parameter {name!r} has shape {tuple(ema.shape)} but the model's "
            f"is {tuple(param.shape)}: copy the EMA from the same model (if the model's "
            "parameters are ZeRO shards, pass the ZeRO optimizer)"
        )


def _check_same_device(
    name: str, ema: Tensor, src: Tensor, kind: str = "parameter", whose: str = "the model's"
) -> None:
    """An averaged pair runs in place on both tensors: torch refuses two devices unnamed."""
    if ema.device != src.device:
        raise EmaMismatchError(
            f"compatshim.ema: EMA {kind} {name!r} is on {ema.device} but {whose} is on "
            f"{src.device}; the update runs in place on both, so keep the EMA on that device "
            "(ema.to(device))"
        )


def _check_no_truncation(name: str, ema: Tensor, buf: Tensor) -> None:
    """A float buffer copied into an integer EMA buffer would be cut to whole numbers."""
    if buf.is_floating_point() and not (ema.is_floating_point() or ema.is_complex()):
        raise EmaMismatchError(
            f"compatshim.ema: EMA buffer {name!r} is {ema.dtype} but the model's is "
            f"{buf.dtype}: copying it would cut every value to a whole number; copy the EMA "
            "from the model as it is now (copy.deepcopy(model)), or exclude the name"
        )


def _check_writable(name: str, ema: Tensor, torch: Any, kind: str = "parameter") -> None:
    """An inference tensor takes no in-place update outside ``inference_mode``."""
    if ema.is_inference() and not torch.is_inference_mode_enabled():
        raise EmaMismatchError(
            f"compatshim.ema: EMA {kind} {name!r} is an inference tensor (made under "
            "torch.inference_mode()), which no in-place update may change outside inference "
            "mode; make the EMA outside it (copy.deepcopy(model), or copy.deepcopy(ema) once)"
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
