"""Shard-aware, fast EMA: a drop-in for Open-Sora's ``update_ema`` on every ColossalAI release.

Without ZeRO (``optimizer=None``, a plain torch optimizer, or ``sharded=False``)
the EMA follows the working params; with a ZeRO optimizer it follows the fp32
masters. Two EMA shapes are supported: a full-size EMA on every rank (the
masters are all-gathered once per step) and a sharded EMA holding only this
rank's 1-D master shard (``shard_ema``; Open-Sora's memory saver), gathered
for saving with ``gather_sharded_ema``. Frozen params and ``exclude`` names
are skipped. Buffers follow ``buffers=`` (default ``"average"``, as timm's
``ModelEmaV3``; see ``update_ema``). Pairs are built once and cached; each
step is one foreach update (plus one copy for integer buffers).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from .plan import (
    BUFFER_POLICIES,
    BufferPolicy,
    EmaMismatchError,
    Plan,
    build_plan,
    half_tied_excludes,
    is_dtensor,
    trainable_pairs,
    unmatched_excludes,
)

if TYPE_CHECKING:
    import torch
    from torch import Tensor

__all__ = [
    "BUFFER_POLICIES",
    "BufferPolicy",
    "EmaMismatchError",
    "EmaWarning",
    "gather_sharded_ema",
    "shard_ema",
    "update_ema",
]

_plans: weakref.WeakKeyDictionary[Any, Plan] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


class EmaWarning(UserWarning):
    """``update_ema`` was asked for something that does nothing (an ``exclude`` that matches
    no parameter or buffer): said at the caller's line, never silent."""


def update_ema(
    ema_model: torch.nn.Module,
    model: torch.nn.Module,
    optimizer: Any = None,
    decay: float = 0.9999,
    sharded: bool = True,
    exclude: Iterable[str] = (),
    *,
    buffers: BufferPolicy = "average",
) -> None:
    """Step ``ema_model`` towards ``model``: ``ema = decay * ema + (1 - decay) * source``.

    ``source`` is the fp32 master from ``optimizer`` when it has masters and
    ``sharded`` is true (Open-Sora's meaning: the model is trained sharded),
    else the working param. ``exclude`` holds parameter or buffer names or
    fnmatch patterns to leave alone (Open-Sora skipped ``pos_embed``); an entry
    that names nothing is an ``EmaWarning``. Either model may
    be wrapped (``torch.compile``, DDP, FSDP1 with ``use_orig_params=True``,
    activation checkpointing): names pair through ``names.canonical``. FSDP2:
    shard the EMA like the model; each rank steps its local shards.

    ``buffers`` says what happens to the persistent buffers (BatchNorm's
    ``running_mean``/``running_var``/``num_batches_tracked``), always from the
    working model's buffer (no optimizer holds masters of buffers):

    - ``"average"`` (default): floating-point buffers get the same EMA as the
      params; other buffers (integer counters) are copied. This is timm's
      ``ModelEmaV3`` default, and what timm's ``ModelEmaV2`` and torch's
      ``AveragedModel(use_buffers=True)`` (torch's documented EMA recipe) do
      with floating-point buffers; those two also average integer buffers,
      which truncates (an EMA's ``num_batches_tracked`` stays near its start).
      Chosen because an EMA is made to be evaluated: its normalisation
      statistics then move with its weights, as in the EMA libraries most
      used, where an EMA left with its initial statistics (the old behaviour)
      evaluates with untrained ones, silently.
    - ``"copy"``: every buffer copied from the model each call (timm's
      ``exclude_buffers=True``, ``AveragedModel(use_buffers=False)``).
    - ``"skip"``: buffers left alone, parameters only (Open-Sora's loop and
      compatshim before this option); recompute them (``update_bn``) before
      evaluating.

    Host cost per call: one pass over the params' ``requires_grad`` and over
    the paired buffers' slots plus the foreach call (``guard`` lists what
    re-pairs), run below torch's autograd kernel when that kernel would do
    nothing (``dispatch``). CUDA graphs: after one call
    outside capture (which pairs), a call inside ``torch.cuda.graph`` records
    the step (plain and mixed-dtype pairs; not ZeRO gathers); a replay repeats
    it with the decay fixed at capture and without any check, so capture again
    after replacing, resizing, freezing or unfreezing a parameter.
    """
    value = decay if type(decay) is float and 0.0 <= decay <= 1.0 else _checked_decay(decay)
    excluded = exclude if type(exclude) is tuple else _exclude_tuple("update_ema", exclude)
    try:
        plan = _plans.get(ema_model)
    except TypeError:  # not weakly referenceable, so no Module: _rebuild says so
        plan = None
    if plan is None or not plan.valid(ema_model, model, optimizer, sharded, excluded, buffers):
        plan = _rebuild(ema_model, model, optimizer, sharded, excluded, buffers)
    try:
        plan.step(value)
    except RuntimeError as exc:
        _retry_after_layout_change(
            plan, exc, ema_model, model, optimizer, sharded, excluded, buffers, value
        )


def _checked_decay(decay: Any) -> float:
    """``decay`` as a float in [0, 1] (the slow path of the check), else a typed error."""
    if isinstance(decay, (bool, str, bytes)) or not hasattr(type(decay), "__float__"):
        raise TypeError(
            f"update_ema: decay must be a real number in [0, 1], got {type(decay).__name__} "
            f"{decay!r}"
        )
    try:
        value = float(decay)
    except (TypeError, ValueError, RuntimeError) as exc:  # e.g. a tensor of several elements
        raise TypeError(
            f"update_ema: decay must be a real number in [0, 1], got {type(decay).__name__} "
            f"that float() refuses ({exc})"
        ) from None
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"update_ema: decay must be in [0, 1], got {decay!r}")
    return value


def _exclude_tuple(caller: str, exclude: Any) -> tuple[str, ...]:
    """``exclude`` as a tuple of names; a bare string would be read letter by letter."""
    if isinstance(exclude, (str, bytes)):
        raise TypeError(
            f"{caller}: exclude must be an iterable of names or patterns, got the string "
            f"{exclude!r} (read letter by letter); pass ({exclude!r},)"
        )
    try:
        return tuple(exclude)
    except TypeError:
        raise TypeError(
            f"{caller}: exclude must be an iterable of names or patterns, got "
            f"{type(exclude).__name__}"
        ) from None


def _check_arguments(caller: str, ema_model: Any, model: Any, exclude: tuple[Any, ...]) -> None:
    """The checks every entry point shares (cold path: run when a plan is built)."""
    import torch

    for argument, value in (("ema_model", ema_model), ("model", model)):
        if not isinstance(value, torch.nn.Module):
            raise TypeError(
                f"{caller}: {argument} must be a torch.nn.Module, got {type(value).__name__}"
            )
    if ema_model is model:
        raise ValueError(
            f"{caller}: ema_model is model itself (the EMA would never move); pass a copy "
            "made once before training, e.g. copy.deepcopy(model)"
        )
    for entry in exclude:
        if not isinstance(entry, str):
            raise TypeError(
                f"{caller}: each exclude entry must be a str (a name or fnmatch pattern), got "
                f"{type(entry).__name__} {entry!r}"
            )


def _rebuild(
    ema_model: Any,
    model: Any,
    optimizer: Any,
    sharded: Any,
    exclude: tuple[str, ...],
    buffers: Any,
) -> Plan:
    import torch

    _check_arguments("update_ema", ema_model, model, exclude)
    if isinstance(optimizer, (int, float)) and not isinstance(optimizer, bool):
        raise TypeError(  # update_ema(ema, model, 0.999): the decay in the optimizer's place
            f"update_ema: optimizer must be the optimizer (or None), got {optimizer!r}; "
            f"pass the decay by name: update_ema(ema, model, decay={optimizer!r})"
        )
    if not isinstance(sharded, int) or sharded not in (0, 1):  # bool, or 0 / 1
        raise TypeError(f"update_ema: sharded must be a bool, got {type(sharded).__name__}")
    if not isinstance(buffers, str) or buffers not in BUFFER_POLICIES:
        kind = ValueError if isinstance(buffers, str) else TypeError
        raise kind(
            f"update_ema: buffers must be one of {', '.join(map(repr, BUFFER_POLICIES))}, "
            f"got {buffers!r}"
        )
    with _lock, torch.no_grad():  # DTensor.to_local() and master views: no autograd links
        _plans.pop(ema_model, None)
        plan = build_plan(ema_model, model, optimizer, bool(sharded), exclude, buffers)
        _plans[ema_model] = plan
    if exclude:
        _warn_unmatched("update_ema", exclude, model)
    return plan


def _warn_unmatched(caller: str, exclude: tuple[str, ...], model: Any) -> None:
    from .._warn import warn

    unmatched = unmatched_excludes(exclude, model)
    if unmatched:
        warn(
            f"{caller}: exclude entries {unmatched} match no parameter or persistent buffer "
            "of the model, so they exclude nothing (a misspelling?)",
            EmaWarning,
        )
    for out, kept in half_tied_excludes(exclude, model):
        warn(
            f"{caller}: exclude matches {out!r}, one tensor with {kept!r}, which it does not "
            "match: the tensor is averaged all the same; exclude every name it goes by",
            EmaWarning,
        )


def _retry_after_layout_change(
    failed: Plan,
    exc: RuntimeError,
    ema_model: Any,
    model: Any,
    optimizer: Any,
    sharded: bool,
    exclude: tuple[str, ...],
    buffers: BufferPolicy,
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
        plan = _rebuild(ema_model, model, optimizer, sharded, exclude, buffers)
    except EmaMismatchError as mismatch:
        if clean:
            raise
        raise EmaMismatchError(f"{mismatch}; this call stepped only some pairs") from exc
    if clean:
        plan.step(decay)
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

    excluded = _check_sharded_arguments("shard_ema", ema_model, model, optimizer, exclude)
    masters = working_to_master(optimizer)
    with torch.no_grad():
        for _name, ema, param in trainable_pairs(ema_model, model, excluded):
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

    excluded = _check_sharded_arguments("gather_sharded_ema", ema_model, model, optimizer, exclude)
    masters = working_to_master(optimizer)
    state = dict(ema_model.state_dict())
    with torch.no_grad():
        for name, ema, param in trainable_pairs(ema_model, model, excluded):
            if param not in masters or ema.shape == param.shape:
                continue
            position = master_shard_position(optimizer, param)
            state[name] = gather_full(ema.data, position, param.shape).clone()
    return {
        name: value.full_tensor() if is_dtensor(value) else value for name, value in state.items()
    }


def _check_sharded_arguments(
    caller: str, ema_model: Any, model: Any, optimizer: Any, exclude: Iterable[str]
) -> tuple[str, ...]:
    excluded = _exclude_tuple(caller, exclude)
    _check_arguments(caller, ema_model, model, excluded)
    if optimizer is None:
        raise TypeError(
            f"{caller}: optimizer must be the optimizer that holds the master shards "
            "(a ColossalAI ZeRO optimizer), got None"
        )
    return excluded
