"""Bring optimizer and LR-scheduler state saved under one torch release to what the running one has.

torch adds param-group keys across releases (``decoupled_weight_decay`` in
2.7's Adam/AdamW, ``capturable``, ``fused``, ``maximize`` earlier) and scheduler
keys (``_is_initial`` in 2.8, which dropped ``verbose``). A plain
``load_state_dict`` copes, but ``torch.distributed.checkpoint`` builds its load
plan from the running objects and refuses an older checkpoint (``Missing key in
checkpoint state_dict: optim.param_groups.0.decoupled_weight_decay``,
``sched._is_initial``), flattened (``flatten_optimizer_state_dict=True``,
torchtitan's path) or not. torch 2.2 saved every non-tensor dict or list (param
groups, a scheduler's or GradScaler's whole state) as one item, which 2.4 plans
key by key and misses (``sched.step_size``).

- ``adapt_state_dict(state_dict, optimizer)``: a copy holding the keys the running
  release expects: added keys get the value a state without them stands for
  (``compatshim.optim.keys``), keys the running release no longer knows are
  dropped. An optimizer's param groups, nested (``optimizer.state_dict()``) or
  flattened (DCP's ``param_groups.<fqn>.<key>``); an LR scheduler's state,
  ``SequentialLR``/``ChainedScheduler`` nesting included (``optimizer`` is then
  the scheduler); any other state (a ``GradScaler``'s) is checked, not changed.
- ``load_dcp(state_dict, optimizers, checkpoint_id=...)``: ``dcp.load`` that leaves
  out of the plan only the known keys the checkpoint lacks, asks for an item the
  checkpoint holds whole where the running torch would ask for its keys, then
  adapts as above and returns the DCP path of every key it filled. Any other
  missing key still fails, naming it.

Importing this package imports no torch.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from .._text import names, short
from .keys import OLD_BEHAVIOUR, SCHEDULER_KEYS, old_value

__all__ = ["OptimizerStateError", "adapt_state_dict", "load_dcp"]

_GROUPS = "param_groups"
_GROUP_KEYS = {"params", "initial_lr"}  # every param group's, beside its optimizer's defaults
_NESTED = "_schedulers"  # where SequentialLR and ChainedScheduler keep their schedulers' states


class OptimizerStateError(ValueError):
    """A saved optimizer or scheduler state lacks a key no known torch release added, or an
    item DCP was asked for was not read."""


def _class_name(optimizer: Any) -> str:
    """The nearest torch.optim class in the MRO: a user subclass behaves as its base."""
    for cls in type(optimizer).__mro__:
        if cls.__module__.startswith("torch.optim"):
            return cls.__name__
    return type(optimizer).__name__


def _is_scheduler(obj: Any) -> bool:
    """Whether ``obj`` is a torch.optim.lr_scheduler scheduler (a user subclass too)."""
    return any(cls.__module__ == "torch.optim.lr_scheduler" for cls in type(obj).__mro__)


def _is_optimizer(obj: Any) -> bool:
    return isinstance(getattr(obj, "defaults", None), Mapping) and not _is_scheduler(obj)


def _path(prefix: str, key: Any) -> str:
    return f"{prefix}.{key}" if prefix else str(key)


def _refuse(
    missing: set[str], owner: Any, where: str, known: Mapping[str, Any], foreign: list[str]
) -> OptimizerStateError:
    """``foreign``: saved keys neither the running object nor any release has (another
    class's state, e.g. AdamW's betas mapped to an SGD)."""
    import torch

    name = type(owner).__name__
    at = f"at {where or 'its top level'}"
    running = f"running torch {torch.__version__}; known: {sorted(known)}"
    if foreign:  # the likely cause first: the keys only another class has
        return OptimizerStateError(
            f"compatshim.optim: the saved {name} state ({at}) looks saved by another optimizer "
            f"or scheduler class: it holds {foreign[:8]}, which no {name} of any known release "
            f"has, and lacks key(s) {sorted(missing)} ({running})"
        )
    return OptimizerStateError(
        f"compatshim.optim: the saved {name} state lacks key(s) {sorted(missing)} ({at}) and "
        f"no torch release is known to have added them ({running})"
    )


def _fix_keys(
    saved: Mapping[str, Any],
    running: Any,
    known: Mapping[str, Any],
    where: str,
    owner: Any,
) -> tuple[dict[str, Any], list[str]]:
    """``saved`` holding exactly the keys of ``known`` that ``running`` (the keys the running
    release has) holds: a lacking one gets ``known``'s value, an extra one is dropped; a
    lacking key ``known`` does not name is refused. Also returns the filled keys' paths."""
    expected = set(running)
    missing = expected - set(saved)
    unknown = missing - set(known)
    if unknown:
        ours = expected | set(known) | _GROUP_KEYS
        foreign = sorted(k for k in saved if isinstance(k, str) and k not in ours)
        raise _refuse(unknown, owner, where, known, foreign)
    fixed = {k: v for k, v in saved.items() if k in expected or k not in known}
    fixed.update({key: known[key] for key in sorted(missing)})
    return fixed, [_path(where, key) for key in sorted(missing)]


def _is_plateau(state: Mapping[str, Any]) -> bool:
    """A ReduceLROnPlateau's state (the one scheduler that keeps ``min_lrs``)."""
    return "min_lrs" in state


def _unstepped_plateau(saved: Mapping[str, Any]) -> bool:
    """A ReduceLROnPlateau state torch 2.2 saved before the first step: 2.2's set ``_last_lr``
    in ``step()``, 2.4.1's when built, so 2.2's lacks it until then."""
    return _is_plateau(saved) and "_last_lr" not in saved and saved.get("last_epoch") == 0


def _fix_scheduler(
    saved: Any, running: Mapping[str, Any], where: str, owner: Any
) -> tuple[dict[str, Any], list[str]]:
    """A scheduler's saved state against the running one's, nested schedulers too."""
    if not isinstance(saved, Mapping):
        raise OptimizerStateError(
            f"compatshim.optim: the saved {type(owner).__name__} state at "
            f"{where or 'its top level'} is {short(saved)}, not a scheduler's state (a dict)"
        )
    known = SCHEDULER_KEYS
    func = running.get("anneal_func")
    if func is not None and "anneal_func" not in saved and "_anneal_func_type" in saved:
        # OneCycleLR: newer releases save the strategy's name where older ones kept the bound
        # method; the running scheduler's own method stands for it where the names agree
        strategy = saved["_anneal_func_type"]
        if getattr(func, "__name__", None) != f"_annealing_{strategy}":
            raise OptimizerStateError(
                f"compatshim.optim: the saved {type(owner).__name__} state at "
                f"{where or 'its top level'} anneals by {short(strategy)}, the running one by "
                f"{getattr(func, '__name__', short(func))}: build it with "
                f"anneal_strategy={short(strategy)}"
            )
        known = {**SCHEDULER_KEYS, "anneal_func": func}
    kind = running.get("_anneal_func_type")
    if isinstance(kind, str) and "_anneal_func_type" not in saved and "anneal_func" in saved:
        # OneCycleLR saved by an older release (2.2 keeps the strategy's function): the
        # newer state names the strategy, which the function's name gives
        named = getattr(saved["anneal_func"], "__name__", None)
        strategy = named.partition("_annealing_")[2] if isinstance(named, str) else ""
        if strategy != kind:
            raise OptimizerStateError(
                f"compatshim.optim: the saved {type(owner).__name__} state at "
                f"{where or 'its top level'} anneals by {named or short(saved['anneal_func'])}, "
                f"the running one by {kind!r}: build it with the saved run's anneal_strategy"
            )
        known = {**SCHEDULER_KEYS, "anneal_func": None, "_anneal_func_type": kind}
    if _unstepped_plateau(saved):  # it had changed no lr: those the running one was built with
        known = {**known, "_last_lr": list(running.get("_last_lr", ()))}
    fixed, filled = _fix_keys(saved, running, known, where, owner)
    want = running.get(_NESTED)
    if isinstance(want, list):
        inner = fixed.get(_NESTED)
        if not isinstance(inner, list) or len(inner) != len(want):
            raise OptimizerStateError(
                f"compatshim.optim: {_path(where, _NESTED)} holds "
                f"{len(inner) if isinstance(inner, list) else short(inner)} saved scheduler "
                f"state(s); the running {type(owner).__name__} nests {len(want)}"
            )
        fixed[_NESTED] = []
        for i, (one, live) in enumerate(zip(inner, want)):
            done, more = _fix_scheduler(one, live, _path(where, f"{_NESTED}.{i}"), owner)
            fixed[_NESTED].append(done)
            filled += more
    return fixed, filled


def _is_scaler(obj: Any) -> bool:
    """Whether ``obj`` is a torch.amp (or torch.cuda.amp) GradScaler."""
    return any(
        cls.__name__ == "GradScaler" and cls.__module__.startswith(("torch.amp", "torch.cuda.amp"))
        for cls in type(obj).__mro__
    )


def _check_optimizer(optimizer: Any, name: str = "optimizer") -> None:
    if not (_is_optimizer(optimizer) or _is_scheduler(optimizer) or _is_scaler(optimizer)):
        raise TypeError(
            f"{name}: expected a torch.optim.Optimizer (its defaults name the param-group "
            f"keys), a torch.optim.lr_scheduler scheduler or a GradScaler, got {short(optimizer)}"
        )


def _check_owned(state_dict: Any, owner: Any, name: str = "state_dict") -> None:
    """``state_dict`` as ``owner``'s kind holds it: param groups for an optimizer, a mapping
    for a scheduler or GradScaler."""
    if _is_optimizer(owner):
        _check_state_dict(state_dict, name)
    elif not isinstance(state_dict, Mapping):
        raise TypeError(
            f"{name}: expected the {type(owner).__name__}'s state dict (a mapping, as its "
            f"state_dict() returns), got {short(state_dict)}"
        )
    elif _GROUPS in state_dict or any(
        isinstance(key, str) and key.startswith(f"{_GROUPS}.") for key in state_dict
    ):  # an optimizer's, mapped to its scheduler or scaler: the adapter would fill wrong keys
        raise ValueError(
            f"{name}: holds param groups (an optimizer's state dict), but the object it is "
            f"mapped to is a {type(owner).__name__}"
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


def _fix_optimizer(
    state_dict: Mapping[str, Any], optimizer: Any, prefix: str
) -> tuple[dict[str, Any], list[str]]:
    """Param groups (nested or DCP-flattened) as ``optimizer``'s release has them."""
    name = _class_name(optimizer)
    known = {key: old_value(name, key) for key in OLD_BEHAVIOUR}
    filled: list[str] = []
    groups = state_dict.get(_GROUPS)
    if isinstance(groups, list):  # nested: optimizer.state_dict() or get_state_dict's default
        adapted = dict(state_dict)
        adapted[_GROUPS] = []
        for i, group in enumerate(groups):
            where = _path(prefix, f"{_GROUPS}.{i}")
            fixed, more = _fix_keys(group, optimizer.defaults, known, where, optimizer)
            adapted[_GROUPS].append(fixed)
            filled += more
        return adapted, filled
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
        where = _path(prefix, f"{_GROUPS}.{fqn}")
        fixed, more = _fix_keys(group, optimizer.defaults, known, where, optimizer)
        rest.update({f"{_GROUPS}.{fqn}.{key}": value for key, value in fixed.items()})
        filled += more
    return rest, filled


def _adapt(
    state_dict: Mapping[str, Any], owner: Any, prefix: str
) -> tuple[dict[str, Any], list[str]]:
    """``owner``'s saved state as its release has it, and the paths of the keys filled."""
    if _is_optimizer(owner):
        return _fix_optimizer(state_dict, owner, prefix)
    if _is_scheduler(owner):
        return _fix_scheduler(state_dict, owner.state_dict(), prefix, owner)
    # any other state (a GradScaler's): no key is known to differ; a lacking one is refused
    return _fix_keys(state_dict, owner.state_dict(), {}, prefix, owner)


def adapt_state_dict(state_dict: Mapping[str, Any], optimizer: Any) -> dict[str, Any]:
    """``state_dict`` as ``optimizer``'s release has it: an optimizer's (nested or
    DCP-flattened param groups), or, where ``optimizer`` is an LR scheduler, the
    scheduler's (nested schedulers too); any other stateful's is checked, not changed.

    A key a newer or older release lacks gets the value a state without it stands for
    (``compatshim.optim.keys``); any other lacking key raises ``OptimizerStateError``
    naming it. The input is left unchanged; state tensors are shared, not copied.
    """
    _check_optimizer(optimizer)
    _check_owned(state_dict, optimizer)
    return _adapt(state_dict, optimizer, "")[0]


def _known_paths(top: str, value: Any, owner: Any) -> list[tuple[dict[str, Any], str, str]]:
    """(container, key, DCP path) of every key in ``owner``'s template that some torch releases
    have and others lack: param-group keys of an optimizer (nested or flattened), scheduler
    keys of a scheduler and of each scheduler it nests."""
    found: list[tuple[dict[str, Any], str, str]] = []
    if _is_optimizer(owner):
        groups = value.get(_GROUPS)
        if isinstance(groups, list):
            for i, group in enumerate(groups):
                found += [(group, key, f"{top}.{_GROUPS}.{i}.{key}") for key in group]
        else:
            found += [
                (value, key, f"{top}.{key}") for key in value if key.startswith(f"{_GROUPS}.")
            ]
        return [hit for hit in found if hit[1].rpartition(".")[2] in OLD_BEHAVIOUR]
    if _is_scheduler(owner) and isinstance(value, dict):
        known = {*SCHEDULER_KEYS, "_last_lr"} if _is_plateau(value) else SCHEDULER_KEYS
        found += [(value, key, f"{top}.{key}") for key in value if key in known]
        for i, inner in enumerate(value.get(_NESTED) or []):
            found += _known_paths(f"{top}.{_NESTED}.{i}", inner, owner)
    return found


_NOT_A_TENSOR = "saved a non-tensor item, the template holds a tensor"  # the dry run's words too


def _not_tensors(
    state_dict: Mapping[str, Any], optimizers: Mapping[str, Any], entries: Mapping[str, Any]
) -> list[str]:
    """Where the template holds a tensor (an optimizer's ``step``, a moment) and the checkpoint
    a non-tensor item: DCP puts the item in the tensor's place and the next step fails."""
    import torch
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict

    found = []
    for top in optimizers:
        for fqn, value in flatten_state_dict({top: state_dict[top]})[0].items():
            entry = entries.get(fqn)
            if isinstance(value, torch.Tensor) and type(entry).__name__ == "BytesStorageMetadata":
                found.append(f"{fqn}: {_NOT_A_TENSOR}")
    return found


def _other_shapes(
    state_dict: Mapping[str, Any], optimizers: Mapping[str, Any], saved: set[str]
) -> list[str]:
    """Where the checkpoint (``saved``: its ``.metadata``'s keys) holds more param groups or
    nested schedulers than the running objects under ``optimizers``: DCP plans from the
    template, so it loaded the first ones and dropped the rest without a word (a second
    param group's lr, a third scheduler). Fewer saved failed as DCP's "Missing key" for the
    first key of the first one it lacks. Read before anything is loaded; the dry run asks
    the same."""
    found: list[str] = []

    def walk(value: Any, path: str, owner: Any) -> None:
        if isinstance(value, dict) and any(not isinstance(key, str) for key in value):
            # keyed by data (a MultiStepLR's milestones): a saved key the template lacks is
            # one DCP would drop, and the schedule would silently change
            head = f"{path}."
            extra = {key[len(head) :].split(".", 1)[0] for key in saved if key.startswith(head)}
            extra -= {str(key) for key in value}
            if extra:
                found.append(
                    f"{path} holds saved key(s) {sorted(extra)} the running "
                    f"{type(owner).__name__} lacks (it holds {sorted(map(str, value))}): DCP "
                    "would drop them; build it as the saved run did"
                )
        if isinstance(value, dict):
            for key, inner in value.items():
                walk(inner, f"{path}.{key}", owner)
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            head = f"{path}."  # DCP plans such a list entry by entry: path.<index>.<key>
            indices = {
                int(first)
                for key in saved
                if key.startswith(head) and (first := key[len(head) :].split(".", 1)[0]).isdigit()
            }
            if indices and max(indices) + 1 != len(value):
                kind = "param groups" if path.endswith(_GROUPS) else "nested scheduler states"
                count = max(indices) + 1
                found.append(
                    f"{path} holds {count} saved {kind}, the running "
                    f"{type(owner).__name__} {len(value)}: "
                    + (
                        f"DCP would load the first {len(value)} and drop the rest"
                        if count > len(value)
                        else f"the checkpoint has no state for the last {len(value) - count}"
                    )
                    + "; build it as the saved run did"
                )
            for i, inner in enumerate(value):
                walk(inner, f"{path}.{i}", owner)

    for top, owner in optimizers.items():
        walk(state_dict[top], top, owner)
    return found


def _hollow(template: Any, keys: Sequence[str]) -> list[tuple[str, list[str]]]:
    """Each empty dict of ``template`` under which ``keys`` (a checkpoint's) hold entries,
    with those entries, in ``keys``' order: DCP's flattening drops an empty dict, so
    ``dcp.load`` plans nothing there and skips them (a fresh optimizer's
    ``state_dict()["state"]``, empty until its first step). :func:`load_dcp` refuses it
    before loading; the dry run reports it ("NOT LOADED")."""
    found = []
    for _, _, where in _empties(template, ""):
        inside = [key for key in keys if key.startswith(f"{where}.")]
        if inside:
            found.append((where, inside))
    return found


def _kind(value: Any) -> str | None:
    """What a saved value must stay to be read as the template's: a number (an int and a
    float alike), a str, or a list or tuple; None (anything else: a bool, None, a tensor,
    which releases and settings exchange: ``foreach=None`` or ``True``, an ``lr`` tensor)."""
    if type(value) in (int, float):
        return "a number"
    if isinstance(value, str):
        return "a str"
    return "a list" if isinstance(value, (list, tuple)) else None


def _leaves(value: Any, route: tuple[Any, ...] = ()) -> list[tuple[tuple[Any, ...], Any]]:
    """(route, value) of each value DCP saves as one item under ``value`` whose kind
    :func:`_kind` knows (a scheduler's ``last_epoch``, ``_milestones``; a param group's
    ``lr``, ``betas``): a list of dicts is planned entry by entry, so its dicts are walked,
    and the list is kept too (torch 2.2 saved ``param_groups`` or ``_schedulers`` whole:
    its length is checked once it is read)."""
    if isinstance(value, dict):
        return [hit for key, inner in value.items() for hit in _leaves(inner, (*route, key))]
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        inside = [hit for i, inner in enumerate(value) for hit in _leaves(inner, (*route, i))]
        return [(route, value), *inside]
    return [(route, value)] if _kind(value) else []


def _other_leaf(path: str, saved: Any, running: Any) -> str:
    """Why a saved value the template holds otherwise fails the resume (load_dcp and the dry
    run say it alike; empty: it does not): a str or a list where the template holds a
    number (``last_epoch='3'``, ``lr=[0.1, 0.2]``), a list of another length
    (``_milestones``, ``betas``). Either loads, then fails or trains on the wrong lr later."""
    have, want = _kind(saved), _kind(running)
    if have and want and have != want:
        shown = "" if have == "a list" else f" ({short(saved)})"
        return (
            f"{path} holds {have}{shown}, the running state {want}: a scheduler or "
            "optimizer of another shape, or a damaged checkpoint"
        )
    if want == "a list" and have == want and len(saved) != len(running):
        return (
            f"{path} holds {len(saved)} saved value(s), the running state {len(running)}: "
            "saved by a scheduler or optimizer of another shape; build it as the saved run did"
        )
    return ""


def _other_leaves(state_dict: Mapping[str, Any], leaves: list[tuple[str, Any, Any]]) -> str:
    """The first loaded value under ``state_dict`` that is not what the template held there
    (``leaves``: top, route, value, taken before the load), as :func:`_other_leaf` says it;
    empty: none. load_dcp raises it; the dry run reports it for an item read whole."""
    for top, route, want in leaves:
        why = _other_leaf(
            ".".join(map(str, (top, *route))), _value_at(state_dict[top], route), want
        )
        if why:
            return why
    return ""


def _value_at(node: Any, route: tuple[Any, ...]) -> Any:
    """The value at ``route`` under ``node``; None where the route leads nowhere."""
    for part in route:
        inside = isinstance(node, dict) and part in node
        inside = inside or (isinstance(node, list) and isinstance(part, int) and part < len(node))
        node = node[part] if inside else None
    return node


def _absent(path: str, saved: set[str]) -> bool:
    """Whether the checkpoint lacks ``path``: neither it nor an item holding it is saved
    (torch 2.2 saves ``param_groups`` as one item; 2.3+ key by key)."""
    parts = path.split(".")
    return not any(".".join(parts[:i]) in saved for i in range(1, len(parts) + 1))


def _whole_items(
    state_dict: dict[str, Any], tops: Mapping[str, Any], saved: set[str]
) -> list[tuple[Any, Any, str]]:
    """(container, key, DCP path) of each dict or list under ``tops`` that the checkpoint
    holds as one item while the running torch plans its entries one by one (torch 2.2 saved
    every dict or list without tensors whole; 2.4 asks for its keys, and 2.5+ falls back to
    the old keys only when the whole template was saved so)."""
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict

    found: list[tuple[Any, Any, str]] = []

    def walk(container: Any, key: Any, path: str, planned: set[str]) -> None:
        value = container[key]
        if not isinstance(value, (dict, list)) or path in planned:
            return
        if path in saved:
            found.append((container, key, path))
            return
        for inner in value if isinstance(value, dict) else range(len(value)):
            walk(value, inner, f"{path}.{inner}", planned)

    for top in tops:
        walk(state_dict, top, top, set(flatten_state_dict({top: state_dict[top]})[0]))
    return found


class _Slot:
    """A top-level item DCP reads whole, handed to ``dcp.load`` as a Stateful: torch 2.2's
    ``dcp.load`` reads a top-level non-Stateful item into a copy of the state dict and drops
    it (a scheduler saved under 2.2 and resumed there kept its fresh state; an ``epoch``
    int kept the template's); 2.3+ put the item in its place, as this does."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def state_dict(self) -> Any:
        return self.value

    def load_state_dict(self, value: Any) -> None:
        self.value = value


def _one_item_tops(state_dict: dict[str, Any]) -> list[str]:
    """The tops the running torch plans as one item and loads by replacing it (an int, a
    dict or list without tensors on torch 2.2, one :func:`_whole_items` made a leaf); not a
    tensor (loaded in place) nor a Stateful (DCP calls its load_state_dict)."""
    import torch
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict

    return [
        top
        for top, value in state_dict.items()
        if not isinstance(value, torch.Tensor)
        and not (hasattr(value, "state_dict") and hasattr(value, "load_state_dict"))
        and not (  # a model's: a tensor at once, never one item (and not flattened again)
            isinstance(value, dict) and any(isinstance(v, torch.Tensor) for v in value.values())
        )
        and list(flatten_state_dict({top: value})[0]) == [top]
    ]


def _empties(value: Any, path: str) -> list[tuple[dict[Any, Any], Any, str]]:
    """(dict, key, DCP path) of each empty dict or list held by a dict under ``value`` (never
    inside a tensor or another object; one in a list stays: its index would move): torch
    2.3+ saves no entry for one."""
    found = []
    for key in value if isinstance(value, dict) else range(len(value)):
        inner, where = value[key], _path(path, key)
        if isinstance(inner, (dict, list)) and not inner:
            found += [(value, key, where)] if isinstance(value, dict) else []
        elif isinstance(inner, (dict, list)):
            found += _empties(inner, where)
    return found


def _other_keys(
    value: Any, route: tuple[Any, ...] = ()
) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    """(route, {str(key): key}) of each dict under ``value`` keyed otherwise than by str (a
    MultiStepLR's ``milestones``, a Counter of ints), outer ones first. DCP plans and loads
    an entry under ``str(key)``: loaded in place, the dict gains a str key beside the
    template's (its next ``dcp.save`` fails, "duplicated flatten key"); read whole from a
    folder rewritten for torch 2.2, it holds str keys only (``last_epoch in milestones`` is
    never true: the lr silently stops decaying)."""
    found: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
    if isinstance(value, dict):
        keys = {str(key): key for key in value if not isinstance(key, str)}
        if keys and not set(keys) & {key for key in value if isinstance(key, str)}:
            found.append((route, keys))
        for key, inner in value.items():
            found += _other_keys(inner, (*route, key))
    elif isinstance(value, list):
        for i, inner in enumerate(value):
            found += _other_keys(inner, (*route, i))
    return found


def _with_keys(state_dict: dict[str, Any], found: list[tuple[str, tuple[Any, ...], Any]]) -> None:
    """Each value DCP loaded under ``str(key)`` put back under the template's ``key`` (into
    the template's dict there, where both are dicts: DCP loaded its tensors in place)."""

    def merge(into: dict[Any, Any], loaded: dict[Any, Any]) -> None:
        for key, value in loaded.items():
            if isinstance(value, dict) and isinstance(into.get(key), dict):
                merge(into[key], value)
            else:
                into[key] = value

    for top, route, keys in found:
        value = _value_at(state_dict[top], route)
        if not isinstance(value, dict):
            continue
        for text, key in keys.items():
            if text in value:
                merge(value, {key: value.pop(text)})


def _with_empties(loaded: Any, template: Any) -> Any:
    """``loaded`` (an item read whole) with the empty dicts and lists of ``template`` that it
    lacks: a 2.3+ save has no entry for them, so an item rebuilt from its entries (a folder
    rewritten for torch 2.2) misses them, or holds None for one inside a list."""
    if isinstance(template, dict) and isinstance(loaded, dict):
        for key, value in template.items():
            if isinstance(value, (dict, list)) and not value and key not in loaded:
                loaded[key] = type(value)()
            elif key in loaded:
                loaded[key] = _with_empties(loaded[key], value)
    elif isinstance(template, list) and isinstance(loaded, list):
        for i, (got, value) in enumerate(zip(loaded, template)):
            if got is None and isinstance(value, (dict, list)) and not value:
                loaded[i] = type(value)()
            else:
                loaded[i] = _with_empties(got, value)
    return loaded


def load_dcp(
    state_dict: dict[str, Any],
    optimizers: Mapping[str, Any],
    *,
    checkpoint_id: Any = None,
    storage_reader: Any = None,
    planner: Any = None,
    process_group: Any = None,
) -> tuple[str, ...]:
    """``torch.distributed.checkpoint.load`` in place, across torch releases' optimizer,
    LR-scheduler and GradScaler state.

    ``optimizers`` maps a top-level key of ``state_dict`` to the object whose state it
    holds: an optimizer (``"optim"``: its ``get_state_dict`` output, nested or
    flattened), an LR scheduler (``"sched"``: its ``state_dict()``; SequentialLR and
    ChainedScheduler with the schedulers they nest) or a GradScaler. A key some
    releases have and others lack (``compatshim.optim.keys``) that the checkpoint
    lacks is kept out of the load plan; an item the checkpoint holds whole (torch
    2.2) is asked for as one item where the running torch would ask for its keys;
    then each state is brought to the running release by :func:`adapt_state_dict`.
    Returns the DCP path of every key filled, with the value ``compatshim.optim.keys``
    gives it (empty when the checkpoint needed nothing). Any other key the checkpoint
    lacks fails as ``dcp.load`` fails, or as ``OptimizerStateError``, naming it (the
    template's entries are then put back; tensors DCP loaded stay loaded). Under torch
    2.2, whose ``dcp.load`` takes no ``checkpoint_id``, the folder is read through a
    ``FileSystemReader`` of it, and ``dcp.load`` needs a process group (one rank will do).
    A ``checkpoint_id`` that is no DCP folder (none there, a file, no ``.metadata``) raises
    ``CheckpointError``, also a ``FileNotFoundError``, saying which, as ``plan_resume`` does.
    """
    _check_load_arguments(state_dict, optimizers, checkpoint_id, storage_reader)
    import inspect

    from torch.distributed.checkpoint.filesystem import FileSystemReader
    from torch.distributed.checkpoint.state_dict_loader import load

    if storage_reader is None:  # say what the path is, as plan_resume does, not torch's Errno
        from ..checkpoint._dcp_records import no_metadata

        no_metadata(os.fspath(checkpoint_id))
    reader = storage_reader or FileSystemReader(checkpoint_id)
    entries = reader.read_metadata().state_dict_metadata
    saved = set(entries)
    shapes = _other_shapes(state_dict, optimizers, saved) + _not_tensors(
        state_dict, optimizers, entries
    )
    shapes += [
        f"{where} is empty in the state to load into, and the checkpoint holds "
        f"{len(inside)} entries under it ({names(inside, 3)}) that dcp.load would skip: "
        "build the state as it was saved (a fresh optimizer's state_dict() holds no "
        "state until its first step; get_state_dict(model, optimizer) fills it)"
        for where, inside in _hollow(dict(state_dict), sorted(saved))
    ]
    if shapes:  # before anything is loaded: the template stays as it was
        raise OptimizerStateError(f"compatshim.optim: {shapes[0]}")
    left_out: list[tuple[dict[str, Any], str, Any]] = []
    for top, owner in optimizers.items():
        for container, key, path in _known_paths(top, state_dict[top], owner):
            # any other missing key is left in the plan: DCP's own error names it
            if _absent(path, saved):
                left_out.append((container, key, container.pop(key)))
    # torch 2.3+ saves no entry for an empty dict or list (and plans none); 2.2 plans one as
    # an item: one the checkpoint lacks stays as it is, as on 2.3+
    kept = [(c, k, c.pop(k)) for c, k, path in _empties(state_dict, "") if _absent(path, saved)]
    # the template's values, before any is left out or read whole: each loaded one is checked
    leaves = [(top, *hit) for top in optimizers for hit in _leaves(state_dict[top])]
    whole = [(c, k, path, c[k]) for c, k, path in _whole_items(state_dict, optimizers, saved)]
    for container, key, _, _ in whole:
        container[key] = None  # a leaf: DCP reads the saved item in its place
    template = dict(state_dict)
    keyed = [(top, *hit) for top in optimizers for hit in _other_keys(state_dict[top])]
    slots = {top: state_dict[top] for top in _one_item_tops(state_dict)}
    for top, value in slots.items():
        state_dict[top] = _Slot(value)
    # torch 2.2's load has no checkpoint_id (the reader, made from it above, names the folder)
    where = {}
    if checkpoint_id is not None and "checkpoint_id" in inspect.signature(load).parameters:
        where["checkpoint_id"] = checkpoint_id
    try:
        load(
            state_dict, storage_reader=reader, planner=planner, process_group=process_group, **where
        )
        for container, key, value in kept:
            container[key] = value
        for top, value in slots.items():
            got = state_dict[top]  # torch 2.4's dcp.load puts the loaded value in the slot's place
            state_dict[top] = _with_empties(got.value if isinstance(got, _Slot) else got, value)
        for container, key, _, value in whole:
            container[key] = _with_empties(container[key], value)
        _with_keys(state_dict, keyed)
        unread = [path for container, key, path, _ in whole if container[key] is None]
        if unread:
            raise OptimizerStateError(
                f"compatshim.optim: {unread[0]} was not loaded: the checkpoint holds it as one "
                "item, where the running state holds entries, and DCP did not put it in their "
                "place (a state of another shape, or a damaged checkpoint)"
            )
        other = _other_leaves(state_dict, leaves)
        if other:
            raise OptimizerStateError(f"compatshim.optim: {other}")
        filled: list[str] = []
        adapted: dict[str, Any] = {}
        for top, owner in optimizers.items():
            adapted[top], more = _adapt(state_dict[top], owner, top)
            filled += more
    except BaseException:
        state_dict.update(template)  # the caller's template as it was
        for container, key, _, value in whole:
            container[key] = value
        for container, key, value in [*left_out, *kept]:
            container[key] = value
        raise
    state_dict.update(adapted)
    return tuple(filled)


def _check_load_arguments(
    state_dict: Any, optimizers: Any, checkpoint_id: Any, storage_reader: Any
) -> None:
    """Every argument of :func:`load_dcp` as it is used, before the checkpoint is read or the
    template changed."""
    _check_owners(state_dict, optimizers)
    if checkpoint_id is None and storage_reader is None:
        raise ValueError(
            "checkpoint_id: pass the checkpoint folder (or storage_reader=) to read from"
        )
    if checkpoint_id is not None and not isinstance(checkpoint_id, (str, os.PathLike)):
        raise TypeError(
            f"checkpoint_id: expected the checkpoint folder, got {short(checkpoint_id)}"
        )
    if storage_reader is not None and not callable(getattr(storage_reader, "read_metadata", None)):
        raise TypeError(
            "storage_reader: expected a torch.distributed.checkpoint StorageReader (such as "
            f"FileSystemReader(folder)), got {short(storage_reader)}"
        )


def _check_owners(state_dict: Any, optimizers: Any) -> None:
    """``state_dict`` and ``optimizers`` as :func:`load_dcp` takes them (``plan_resume`` asks
    the same, so a dry run that passes is a call load_dcp accepts)."""
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
                f"state_dict[{short(top)}]: expected the optimizer's (or scheduler's, "
                f"GradScaler's) state dict (a dict), got {short(state_dict[top])}"
            )
        _check_optimizer(optimizer, f"optimizers[{short(top)}]")
        _check_owned(state_dict[top], optimizer, f"state_dict[{short(top)}]")
