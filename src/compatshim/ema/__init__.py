"""Shard-aware, fast EMA: a drop-in for Open-Sora's ``update_ema`` on every ColossalAI release.

Without ZeRO (``optimizer=None``, a plain torch optimizer, or ``sharded=False``)
the EMA follows the working params; with a ZeRO optimizer it follows the fp32
masters. Two EMA shapes are supported: a full-size EMA on every rank (the
masters are all-gathered once per step) and a sharded EMA holding only this
rank's 1-D master shard (``shard_ema``; Open-Sora's memory saver), gathered
for saving with ``gather_sharded_ema``. Frozen params and ``exclude`` names
are skipped. Pairs are built once and cached; each step is one foreach update.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from .plan import EmaMismatchError, Plan, build_plan, is_dtensor, trainable_pairs

if TYPE_CHECKING:
    import torch
    from torch import Tensor

__all__ = ["EmaMismatchError", "gather_sharded_ema", "shard_ema", "update_ema"]

_plans: weakref.WeakKeyDictionary[Any, Plan] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def update_ema(
    ema_model: torch.nn.Module,
    model: torch.nn.Module,
    optimizer: Any = None,
    decay: float = 0.9999,
    sharded: bool = True,
    exclude: Iterable[str] = (),
) -> None:
    """Step ``ema_model`` towards ``model``: ``ema = decay * ema + (1 - decay) * source``.

    ``source`` is the fp32 master from ``optimizer`` when it has masters and
    ``sharded`` is true (Open-Sora's meaning: the model is trained sharded),
    else the working param. ``exclude`` holds parameter names or fnmatch
    patterns to leave alone (Open-Sora skipped ``pos_embed``). Either model may
    be wrapped (``torch.compile``, DDP, FSDP1 with ``use_orig_params=True``,
    activation checkpointing): names pair through ``names.canonical``. FSDP2:
    shard the EMA like the model; each rank steps its local shards.

    Host cost per call: one pass over the params' ``requires_grad`` plus the
    foreach call (``guard`` lists what re-pairs), run below torch's autograd
    kernel when that kernel would do nothing (``dispatch``). CUDA graphs: after one call
    outside capture (which pairs), a call inside ``torch.cuda.graph`` records
    the step (plain and mixed-dtype pairs; not ZeRO gathers); a replay repeats
    it with the decay fixed at capture and without any check, so capture again
    after replacing, resizing, freezing or unfreezing a parameter.
    """
    if not 0.0 <= decay <= 1.0:
        raise ValueError(f"compatshim.ema: decay must be in [0, 1], got {decay!r}")
    excluded = exclude if type(exclude) is tuple else tuple(exclude)
    plan = _plans.get(ema_model)
    if plan is None or not plan.valid(ema_model, model, optimizer, sharded, excluded):
        plan = _rebuild(ema_model, model, optimizer, sharded, excluded)
    try:
        plan.step(float(decay))
    except RuntimeError as exc:
        _retry_after_layout_change(plan, exc, ema_model, model, optimizer, sharded, excluded, decay)


def _rebuild(
    ema_model: Any, model: Any, optimizer: Any, sharded: bool, exclude: tuple[str, ...]
) -> Plan:
    import torch

    with _lock, torch.no_grad():  # DTensor.to_local() and master views: no autograd links
        _plans.pop(ema_model, None)
        plan = build_plan(ema_model, model, optimizer, sharded, exclude)
        _plans[ema_model] = plan
    return plan


def _retry_after_layout_change(
    failed: Plan,
    exc: RuntimeError,
    ema_model: Any,
    model: Any,
    optimizer: Any,
    sharded: bool,
    exclude: tuple[str, ...],
    decay: float,
) -> None:
    """A param changed shape, dtype or device through ``.data`` under the plan: re-pair.

    The foreach stops at the first pair it cannot take; when that is the first
    pair, nothing was stepped and the new plan steps once. Otherwise some
    pairs were stepped, which is said, never hidden.
    """
    first = failed.first_unfit_pair()
    clean = first == 0 and not failed.gathers  # the foreach stopped before stepping anything
    try:
        plan = _rebuild(ema_model, model, optimizer, sharded, exclude)
    except EmaMismatchError as mismatch:
        if clean:
            raise
        raise EmaMismatchError(f"{mismatch}; this call stepped only some pairs") from exc
    if clean:
        plan.step(float(decay))
        return
    raise EmaMismatchError(
        "compatshim.ema: a parameter changed shape, dtype or device under the EMA during this "
        f"call ({exc}); this call stepped only some pairs; the next call uses the new pairing"
    ) from exc


def shard_ema(
    ema_model: torch.nn.Module,
    model: torch.nn.Module,
    optimizer: Any,
    exclude: Iterable[str] = (),
) -> None:
    """Make ``ema_model`` hold only this rank's shard of each ZeRO-sharded param (in place).

    Each such EMA param becomes the 1-D slice ``[offset, offset + length)`` of
    its flattened, zero-padded value, matching the optimizer's master shard.
    Params whose master is whole (or that have none) stay full-size.
    """
    import torch

    from ..master import master_shard_position, working_to_master

    masters = working_to_master(optimizer)
    with torch.no_grad():
        for _name, ema, param in trainable_pairs(ema_model, model, tuple(exclude)):
            if param not in masters or ema.shape != param.shape:
                continue
            position = master_shard_position(optimizer, param)
            if position.is_whole:
                continue
            flat = torch.nn.functional.pad(ema.data.reshape(-1), [0, position.padding])
            ema.data = flat[position.offset : position.offset + position.length].clone()
    _plans.pop(ema_model, None)


def gather_sharded_ema(
    ema_model: torch.nn.Module,
    model: torch.nn.Module,
    optimizer: Any,
    exclude: Iterable[str] = (),
) -> dict[str, Tensor]:
    """A full-size ``state_dict`` of a sharded EMA, for saving (a collective: call on every rank).

    Shards are all-gathered over the ZeRO group, padding stripped, reshaped to
    the model's shapes; FSDP2 (DTensor) entries become ``full_tensor()``;
    full-size entries and buffers are returned as they are.
    """
    import torch

    from ..master import master_shard_position, working_to_master
    from ..master.shards import gather_full

    masters = working_to_master(optimizer)
    state = dict(ema_model.state_dict())
    with torch.no_grad():
        for name, ema, param in trainable_pairs(ema_model, model, tuple(exclude)):
            if param not in masters or ema.shape == param.shape:
                continue
            position = master_shard_position(optimizer, param)
            state[name] = gather_full(ema.data, position, param.shape).clone()
    return {
        name: value.full_tensor() if is_dtensor(value) else value for name, value in state.items()
    }
