"""Bring a torch.optim state dict saved under one torch release to what the running one expects.

torch adds param-group keys across releases (``decoupled_weight_decay`` in
2.7's Adam/AdamW, ``capturable``, ``fused``, ``maximize`` earlier). A plain
``optimizer.load_state_dict`` fills them itself, but
``torch.distributed.checkpoint`` builds its load plan from the running
optimizer and refuses an older checkpoint (``Missing key in checkpoint
state_dict: optim.param_groups.0.decoupled_weight_decay``), flattened
(``flatten_optimizer_state_dict=True``, torchtitan's path) or not.

- ``adapt_state_dict(state_dict, optimizer)``: a copy whose param groups hold
  the keys the running release expects: added keys get the value the older
  release behaved as (``compatshim.optim.keys``), keys the running release
  no longer knows are dropped. Nested (``optimizer.state_dict()``) and
  flattened (DCP's ``param_groups.<fqn>.<key>``) forms.
- ``load_dcp(state_dict, optimizers, checkpoint_id=...)``: ``dcp.load`` that
  leaves out of the plan only the known added keys the checkpoint lacks, then
  fills them as above. Any other missing key still fails, naming it.

Importing this package imports no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .._text import names, short
from .keys import OLD_BEHAVIOUR, old_value

__all__ = ["OptimizerStateError", "adapt_state_dict", "load_dcp"]

_GROUPS = "param_groups"


class OptimizerStateError(ValueError):
    """A saved optimizer state lacks a param-group key that no known torch release added."""


def _class_name(optimizer: Any) -> str:
    """The nearest torch.optim class in the MRO: a user subclass behaves as its base."""
    for cls in type(optimizer).__mro__:
        if cls.__module__.startswith("torch.optim"):
            return cls.__name__
    return type(optimizer).__name__


def _refuse(missing: set[str], optimizer: Any, where: str) -> OptimizerStateError:
    import torch

    return OptimizerStateError(
        f"compatshim.optim: the saved {type(optimizer).__name__} state lacks param-group "
        f"key(s) {sorted(missing)} ({where}) and no torch release is known to have added "
        f"them (running torch {torch.__version__}; known: {sorted(OLD_BEHAVIOUR)})"
    )


def _check_optimizer(optimizer: Any, name: str = "optimizer") -> None:
    if not isinstance(getattr(optimizer, "defaults", None), Mapping):
        raise TypeError(
            f"{name}: expected a torch.optim.Optimizer (its defaults name the param-group "
            f"keys), got {short(optimizer)}"
        )


def _check_state_dict(state_dict: Any, name: str = "state_dict") -> None:
    """TypeError/ValueError naming what is wrong, before anything is read or changed: a
    mapping holding param groups, nested (a list of dicts) or flattened (string keys)."""
    if not isinstance(state_dict, Mapping):
        raise TypeError(
            f"{name}: expected an optimizer state dict (a mapping, as optimizer.state_dict() "
            f"or get_state_dict returns), got {short(state_dict)}"
        )
    groups = state_dict.get(_GROUPS)
    if isinstance(groups, list):
        for i, group in enumerate(groups):
            if not isinstance(group, Mapping):
                raise ValueError(
                    f"{name}[{_GROUPS!r}][{i}]: expected a param group (a dict), got {short(group)}"
                )
        return
    if _GROUPS in state_dict:
        raise ValueError(
            f"{name}[{_GROUPS!r}]: expected a list of param groups, got {short(groups)}"
        )
    flat = [key for key in state_dict if isinstance(key, str) and key.startswith(f"{_GROUPS}.")]
    if not flat:
        raise ValueError(
            f"{name}: holds no param groups (neither a {_GROUPS!r} list nor "
            f"'{_GROUPS}.<parameter>.<key>' entries): is it an optimizer's state dict?"
        )
    odd = next((key for key in state_dict if not isinstance(key, str)), None)
    if odd is not None:
        raise ValueError(f"{name}: a flattened state dict has string keys, got {short(odd)}")


def _fix_group(group: Mapping[str, Any], optimizer: Any, where: str) -> dict[str, Any]:
    expected = set(optimizer.defaults)
    missing = expected - set(group)
    unknown = missing - set(OLD_BEHAVIOUR)
    if unknown:
        raise _refuse(unknown, optimizer, where)
    name = _class_name(optimizer)
    fixed = {k: v for k, v in group.items() if k in expected or k not in OLD_BEHAVIOUR}
    fixed.update({key: old_value(name, key) for key in sorted(missing)})
    return fixed


def adapt_state_dict(state_dict: Mapping[str, Any], optimizer: Any) -> dict[str, Any]:
    """``state_dict`` (nested or DCP-flattened), param groups as ``optimizer``'s release has them.

    The input is left unchanged; state tensors are shared, not copied.
    """
    _check_state_dict(state_dict)
    _check_optimizer(optimizer)
    groups = state_dict.get(_GROUPS)
    if isinstance(groups, list):  # nested: optimizer.state_dict() or get_state_dict's default
        adapted = dict(state_dict)
        adapted[_GROUPS] = [
            _fix_group(group, optimizer, f"param group {i}") for i, group in enumerate(groups)
        ]
        return adapted
    # flattened: "param_groups.<param fqn>.<key>" per parameter
    by_fqn: dict[str, dict[str, Any]] = {}
    rest: dict[str, Any] = {}
    for flat_key, value in state_dict.items():
        head, _, tail = flat_key.partition(".")
        if head == _GROUPS and "." in tail:
            fqn, _, key = tail.rpartition(".")
            by_fqn.setdefault(fqn, {})[key] = value
        else:
            rest[flat_key] = value
    for fqn, group in by_fqn.items():
        for key, value in _fix_group(group, optimizer, f"parameter {fqn!r}").items():
            rest[f"{_GROUPS}.{fqn}.{key}"] = value
    return rest


def _group_paths(prefix: str, optim_sd: dict[str, Any]) -> list[tuple[dict[str, Any], str, str]]:
    """(container, key, DCP path) of every param-group entry, nested or flattened."""
    found: list[tuple[dict[str, Any], str, str]] = []
    groups = optim_sd.get(_GROUPS)
    if isinstance(groups, list):
        for i, group in enumerate(groups):
            found += [(group, key, f"{prefix}.{_GROUPS}.{i}.{key}") for key in group]
    else:
        found += [
            (optim_sd, key, f"{prefix}.{key}") for key in optim_sd if key.startswith(f"{_GROUPS}.")
        ]
    return found


def _absent(path: str, saved: set[str]) -> bool:
    """Whether the checkpoint lacks ``path``: neither it nor an item holding it is saved
    (torch 2.2 saves ``param_groups`` as one item; 2.3+ key by key)."""
    parts = path.split(".")
    return not any(".".join(parts[:i]) in saved for i in range(1, len(parts) + 1))


def load_dcp(
    state_dict: dict[str, Any],
    optimizers: Mapping[str, Any],
    *,
    checkpoint_id: Any = None,
    storage_reader: Any = None,
    planner: Any = None,
    process_group: Any = None,
) -> tuple[str, ...]:
    """``torch.distributed.checkpoint.load`` in place, across torch releases' optimizer keys.

    ``optimizers`` maps a top-level key of ``state_dict`` (``"optim"``) to the
    optimizer whose ``get_state_dict`` output it holds. Param-group keys a
    newer torch added and the checkpoint lacks are kept out of the load plan
    and filled with the value the saving release behaved as; returns their
    DCP paths (empty when the checkpoint needed nothing). Any other key the
    checkpoint lacks fails as ``dcp.load`` fails, naming it. Under torch 2.2, whose
    ``dcp.load`` takes no ``checkpoint_id``, the folder is read through a
    ``FileSystemReader`` of it, and ``dcp.load`` needs a process group (one rank will do).
    """
    _check_load_arguments(state_dict, optimizers, checkpoint_id, storage_reader)
    import inspect

    from torch.distributed.checkpoint.filesystem import FileSystemReader
    from torch.distributed.checkpoint.state_dict_loader import load

    reader = storage_reader or FileSystemReader(checkpoint_id)
    saved = set(reader.read_metadata().state_dict_metadata)
    filled: list[str] = []
    for top in optimizers:
        for container, key, path in _group_paths(top, state_dict[top]):
            # any other missing key is left in the plan: DCP's own error names it
            if _absent(path, saved) and key.rpartition(".")[2] in OLD_BEHAVIOUR:
                del container[key]
                filled.append(path)
    # torch 2.2/2.3 saved a nested optimizer's param_groups list as one item; 2.4 plans it key
    # by key and misses them all (2.5+ retries with the old keys): ask for the one item
    whole = {
        top: state_dict[top][_GROUPS]
        for top in optimizers
        if isinstance(state_dict[top].get(_GROUPS), list) and f"{top}.{_GROUPS}" in saved
    }
    for top in whole:
        state_dict[top][_GROUPS] = None  # a leaf: DCP reads the saved list in its place
    # torch 2.2's load has no checkpoint_id (the reader, made from it above, names the folder)
    where = {}
    if checkpoint_id is not None and "checkpoint_id" in inspect.signature(load).parameters:
        where["checkpoint_id"] = checkpoint_id
    try:
        load(
            state_dict, storage_reader=reader, planner=planner, process_group=process_group, **where
        )
        unread = [top for top in whole if not isinstance(state_dict[top][_GROUPS], list)]
        if unread:
            raise OptimizerStateError(
                f"compatshim.optim: {unread[0]}.{_GROUPS} was not read from the checkpoint"
            )
    except BaseException:
        for top, groups in whole.items():  # the caller's template as it was
            if not isinstance(state_dict[top][_GROUPS], list):
                state_dict[top][_GROUPS] = groups
        raise
    for top, optimizer in optimizers.items():
        state_dict[top] = adapt_state_dict(state_dict[top], optimizer)
    return tuple(filled)


def _check_load_arguments(
    state_dict: Any, optimizers: Any, checkpoint_id: Any, storage_reader: Any
) -> None:
    """Every argument of :func:`load_dcp` as it is used, before the checkpoint is read or the
    template changed."""
    if not isinstance(state_dict, dict):
        raise TypeError(
            f"state_dict: expected the dict dcp.load fills in place, got {short(state_dict)}"
        )
    if not isinstance(optimizers, Mapping):
        raise TypeError(
            "optimizers: expected a mapping of state_dict keys to optimizers, such as "
            f"{{'optim': optimizer}}, got {short(optimizers)}"
        )
    for top, optimizer in optimizers.items():
        if top not in state_dict:
            raise ValueError(
                f"optimizers: {short(top)} is not a key of state_dict "
                f"(its keys: {names([short(k) for k in state_dict])})"
            )
        if not isinstance(state_dict[top], dict):
            raise TypeError(
                f"state_dict[{short(top)}]: expected the optimizer's state dict (a dict), "
                f"got {short(state_dict[top])}"
            )
        _check_state_dict(state_dict[top], f"state_dict[{short(top)}]")
        _check_optimizer(optimizer, f"optimizers[{short(top)}]")
    if checkpoint_id is None and storage_reader is None:
        raise ValueError(
            "checkpoint_id: pass the checkpoint folder (or storage_reader=) to read from"
        )
