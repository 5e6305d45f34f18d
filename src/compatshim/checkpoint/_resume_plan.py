"""A dry run of a DCP resume, before any rank starts: ``plan_resume(folder, state_dict)``.

It reads what ``dcp.load`` would plan from: the folder's ``.metadata`` (read as plain
records, ``_dcp_records``: it also says whether the running torch can read it) and the
template the script will load into, flattened by the running torch's own
``flatten_state_dict``, as DCP flattens it. Each template entry is then one of:

- loads: saved, same kind, same global shape;
- filled: missing, but a key ``compatshim.optim.load_dcp`` fills (``compatshim.optim.keys``,
  under a top that ``optimizers`` names), with the value it gives it;
- whole: held by the checkpoint as one item (torch 2.2), which ``load_dcp`` asks for as saved;
  what it fills inside such an item is found by adapting the item as ``load_dcp`` does, on
  torch 2.2 too (which plans a dict without tensors as one item itself);
- missing, mismatched (a tensor against a non-tensor, another shape): the resume fails;
- refused: a non-tensor item whose pickle hardened mode would refuse (each item's bytes
  are inspected, never run: they are small, and no tensor data is read).

Checkpoint entries nothing asks for are listed as unused (DCP ignores them).
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass
from functools import partial
from typing import IO, Any, Callable

from .._text import escaped, names, short
from ..optim import _NOT_A_TENSOR, _kind, _other_leaf, _other_shapes, _unstepped_plateau
from ._dcp_folder import data_problems
from ._dcp_records import Folder, read_folder, running_torch_reads
from ._expand import transformed
from .errors import CheckpointError, UnsafeCheckpointError
from .request import Request, read

_ON_META = Request(map_location="meta")  # each item's tensors on meta: no tensor data is read


@dataclass(frozen=True)
class ResumePlan:
    """What a ``dcp.load`` of ``folder`` into the template would do, entry by entry."""

    folder: str
    loads: tuple[str, ...]
    filled: tuple[tuple[str, Any], ...]  # (DCP path, the value load_dcp gives it)
    whole: tuple[str, ...]
    missing: tuple[str, ...]
    mismatched: tuple[str, ...]  # "path: why"
    refused: tuple[str, ...]  # "path: why" (hardened mode)
    unreadable: tuple[str, ...]  # why the running torch cannot read the .metadata
    unused: tuple[str, ...]
    # top-level items the running torch's plain dcp.load reads and drops (2.2): load_dcp keeps
    dropped: tuple[str, ...] = ()
    hardened: bool = True  # False: non-tensor items were not looked into (``refused`` empty)
    damaged: tuple[str, ...] = ()  # data files missing or cut short: dcp.load fails there
    # empty in the template, entries in the checkpoint: dcp.load skips them (a fresh
    # optimizer's state_dict() has no state: the run resumes with new moments)
    hollow: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """Whether the resume would succeed (through ``compatshim.optim.load_dcp`` where
        anything is filled or read whole)."""
        return not (
            self.missing or self.mismatched or self.refused or self.unreadable or self.dropped
            or self.damaged or self.hollow
        )  # fmt: skip

    def text(self) -> str:
        lines = [f"{self.folder}: {'resumes' if self.ok else 'WOULD FAIL'}"]
        for why in self.unreadable:
            lines.append(f"  cannot read .metadata: {why} (compatshim dcp-downgrade rewrites it)")
        lines.append(f"  loads as is: {len(self.loads)}")
        lines += [f"  filled by compatshim.optim.load_dcp: {p} = {v!r}" for p, v in self.filled]
        lines += [f"  read whole by compatshim.optim.load_dcp: {p}" for p in self.whole]
        lines += [f"  MISSING from the checkpoint: {p}" for p in self.missing]
        lines += [f"  MISMATCHED: {p}" for p in self.mismatched]
        lines += [f"  REFUSED by hardened mode: {p}" for p in self.refused]
        lines += [f"  DAMAGED: {p}" for p in self.damaged]
        lines += [f"  NOT LOADED (empty in the state to load into): {p}" for p in self.hollow]
        lines += [
            f"  DROPPED by this torch's dcp.load: {p} (a top-level non-tensor item keeps the "
            "template's value; compatshim.optim.load_dcp loads it)"
            for p in self.dropped
        ]
        if not self.hardened:
            lines.append(
                "  not checked: whether hardened mode would refuse a non-tensor item "
                "(hardened=False, --not-hardened); a plain dcp.load unpickles them"
            )
        if self.unused:
            lines.append(f"  in the checkpoint, not asked for: {names(list(self.unused), 10)}")
        return "\n".join(escaped(line) for line in lines)  # a key may hold ESC, CR, U+202E


def plan_resume(
    folder: Any,
    state_dict: dict[str, Any] | Callable[[], Any],
    optimizers: Any = None,
    *,
    hardened: bool = True,
) -> ResumePlan:
    """The dry run of ``dcp.load(state_dict, checkpoint_id=folder)`` (through
    ``compatshim.optim.load_dcp(state_dict, optimizers, ...)`` where ``optimizers`` is given).

    ``state_dict``: the template, or a function returning it (or ``(template,
    optimizers)``). Top-level Stateful objects are asked for their ``state_dict()``, as
    DCP does. ``hardened``: check non-tensor items as hardened mode would load them.
    A ``.metadata`` hardened mode refuses is reported as refused, not raised.
    """
    if not isinstance(folder, (str, os.PathLike)):
        raise TypeError(f"folder: expected the DCP checkpoint folder, got {short(folder)}")
    if callable(state_dict) and not isinstance(state_dict, dict):
        built = state_dict()
        if isinstance(built, tuple) and len(built) != 2:
            raise TypeError(f"state_dict(): expected a dict or (dict, optimizers), got a "
                            f"{len(built)}-tuple")  # fmt: skip
        state_dict, optimizers = built if isinstance(built, tuple) else (built, optimizers)
    if not isinstance(state_dict, dict):
        raise TypeError(f"state_dict: expected a dict (or a function returning one), got "
                        f"{short(state_dict)}")  # fmt: skip
    if optimizers is not None:  # as load_dcp takes them: a plan that passes, load_dcp accepts
        from ..optim import _check_owners

        _check_owners(state_dict, optimizers)
    path = os.fspath(folder)
    try:
        saved = read_folder(path)
    except UnsafeCheckpointError as exc:
        return ResumePlan(path, (), (), (), (), (), (str(exc),), (), ())  # names the .metadata
    import torch
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict

    template = {
        k: v.state_dict() if _stateful(v) else v for k, v in state_dict.items()
    }  # fmt: skip
    flat, routes = flatten_state_dict(template)
    owners = dict(optimizers or {})
    loads, whole, missing, mismatched, refused = [], [], [], [], []
    filled: list[tuple[str, Any]] = []
    asked = set()
    held: dict[str, tuple[Any, str]] = {}  # each whole item, read once: _item
    places = [(s.info.get("relative_path"), s.info.get("offset"), s.info.get("length"))
              for s in saved.storage]  # fmt: skip
    damaged = data_problems(path, places)  # dcp.load fails there: its items go unread
    for item, (file, _, _) in zip(saved.storage, places):
        if file in damaged:
            held[item.index["fqn"]] = _UNREAD, ""
    read_whole: dict[str, dict[str, tuple[Any, ...]]] = {}  # top -> items planned whole: routes
    under: set[str] = set()  # every path with entries below it, made at the first key missing
    for fqn, value in flat.items():
        if fqn in saved.entries:
            asked.add(fqn)
            why = _mismatch(saved, fqn, value, torch.Tensor)
            if why:
                mismatched.append(f"{fqn}: {why}")
                continue
            top = fqn.split(".", 1)[0]
            if saved.entries[fqn] is None and top in owners and _kind(value):
                got = _item(saved, fqn, held)[0]  # load_dcp's check, once the item is loaded
                why = "" if got is _UNREAD else _other_leaf(fqn, got, value)
                if why:
                    mismatched.append(why)
                    continue
            loads.append(fqn)
            if saved.entries[fqn] is None:
                refusal = _item(saved, fqn, held)[1] if hardened else ""
                if refusal:
                    refused.append(f"{fqn}: {refusal}")
                if top in owners and _holds_dict(value):  # torch 2.2: planned whole
                    read_whole.setdefault(top, {})[fqn] = tuple(routes[fqn])
            continue
        if optimizers is not None and isinstance(value, (dict, list)) and not value:
            continue  # torch 2.3+ saves no entry for an empty one; load_dcp keeps it
        prefix = _whole_prefix(fqn, saved)
        top = fqn.split(".", 1)[0]
        parent = fqn.rpartition(".")[0]
        fill = (
            _fill(fqn, owners.get(top), value, partial(_saved_at, saved, parent, held))
            if top in owners and _holds(saved, parent, held, under)  # none in a group it lacks
            else None
        )
        if prefix is not None and top in owners:
            if prefix not in asked:
                whole.append(prefix)
                refusal = _item(saved, prefix, held)[1] if hardened else ""
                if refusal:
                    refused.append(f"{prefix}: {refusal}")
            asked.add(prefix)
            if not _inside(saved, prefix, fqn, held):  # load_dcp fills it there, or fails
                if fill is not None:
                    filled.append(fill)
                else:
                    missing.append(fqn)
        elif fill is not None:
            filled.append(fill)
        else:
            missing.append(fqn)
    for top, items in read_whole.items():
        done, why, other = _adapted(top, template[top], items, owners[top], saved, held)
        # _adapt decided what it fills: _fill only words each (no saved state to ask)
        filled += [_fill(path, owners[top], None, dict) or (path, None) for path in done]
        if why:
            missing.append(why)
        if other:
            mismatched.append(other)
    if optimizers is not None:  # what load_dcp refuses before it loads anything
        mismatched += _other_shapes(template, owners, set(saved.entries))
    unused = tuple(k for k in saved.entries if k not in asked)
    hollow = _hollow(template, unused)
    dropped = () if optimizers is not None else _dropped(state_dict, saved, torch)
    return ResumePlan(
        path, tuple(loads), tuple(filled), tuple(whole), tuple(missing), tuple(mismatched),
        tuple(refused), tuple(running_torch_reads(saved)), unused, dropped, hardened,
        tuple(damaged.values()), hollow,
    )  # fmt: skip


def _hollow(template: dict[str, Any], unused: tuple[str, ...]) -> tuple[str, ...]:
    """Each empty dict in ``template`` under which the checkpoint holds entries
    (``optim._hollow``, which ``load_dcp`` refuses by), worded for the plan."""
    from ..optim import _hollow as under_empty_dicts

    return tuple(
        f"{where}: {len(inside)} entries in the checkpoint ({names(inside, 3)}) that "
        "dcp.load skips. A fresh optimizer's state_dict() holds no state until its "
        "first step: build the state as the checkpoint was saved (torch.distributed"
        ".checkpoint.state_dict.get_state_dict(model, optimizer) fills it)"
        for where, inside in under_empty_dicts(template, unused)
    )


def _dropped(state_dict: dict[str, Any], saved: Folder, torch: Any) -> tuple[str, ...]:
    """The tops a plain ``dcp.load`` of torch before 2.3 reads and drops: it loads a top-level
    non-Stateful item into a copy of the state dict and puts the template's object back (a
    tensor is loaded in place; an int, or a dict torch 2.2 reads whole, is not)."""
    from .._engine.versions import contains

    if contains("<2.3", str(torch.__version__)) is not True:  # 2.2's load, read in its source
        return ()
    return tuple(
        top
        for top, value in state_dict.items()
        if saved.entries.get(top, 0) is None
        and not _stateful(value)
        and not isinstance(value, torch.Tensor)
    )


def _holds_dict(value: Any) -> bool:
    """A dict, or a list of them: a state ``load_dcp`` adapts (a scheduler's, param groups)."""
    return bool(value) and (
        isinstance(value, dict) or (isinstance(value, list) and any(type(v) is dict for v in value))
    )


def _adapted(
    top: str,
    value: Any,
    items: dict[str, tuple[Any, ...]],
    owner: Any,
    saved: Folder,
    held: dict[str, tuple[Any, str]],
) -> tuple[list[str], str, str]:
    """The paths ``load_dcp`` fills in a top whose items the running torch reads whole (torch
    2.2 plans a dict without tensors as one item), why it would fail on a missing key, and on
    a value of another shape (empty: it would not): the top as it will load, each item in its
    place as saved, checked and adapted as ``load_dcp`` does. ``items``: fqn -> route. An
    item hardened mode cannot read is not looked into (the plan names it as refused where
    it is hardened)."""
    from ..optim import _adapt, _leaves, _other_leaves

    leaves = [(top, *hit) for hit in _leaves(value)]  # the template's, as load_dcp takes them
    for fqn, route in items.items():
        item = _item(saved, fqn, held)[0]
        if item is _UNREAD:
            return [], "", ""
        value = _replaced(value, route[1:], item)
    other = _other_leaves({top: value}, leaves)
    if other:
        return [], "", other
    try:
        return _adapt(value, owner, top)[1], "", ""
    except (TypeError, ValueError) as exc:  # OptimizerStateError: a key no release added
        return [], f"{top} (read whole): {exc}", ""


def _replaced(tree: Any, route: tuple[Any, ...], value: Any) -> Any:
    """``tree`` with ``value`` at ``route`` (a route ``flatten_state_dict`` gave for it),
    copied along the route; the template is not changed."""
    if not route:
        return value
    key, rest = route[0], route[1:]
    if isinstance(tree, dict):
        return {**tree, key: _replaced(tree[key], rest, value)}
    out = list(tree)
    out[key] = _replaced(tree[key], rest, value)
    return out


def _stateful(value: Any) -> bool:
    return (
        not isinstance(value, dict)
        and callable(getattr(value, "state_dict", None))
        and (callable(getattr(value, "load_state_dict", None)))
    )


def _mismatch(saved: Folder, fqn: str, value: Any, tensor_type: type) -> str:
    entry = saved.entries[fqn]
    is_tensor = isinstance(value, tensor_type)
    if entry is None:
        return _NOT_A_TENSOR if is_tensor else ""
    if not is_tensor:
        return f"saved a tensor, the template holds {type(value).__name__}"
    shape = tuple(value.shape)
    if shape != entry.size:
        return f"saved shape {entry.size}, the template's {shape}"
    return ""


def _whole_prefix(fqn: str, saved: Folder) -> str | None:
    """The non-tensor item that holds ``fqn`` whole (torch 2.2's one-item layout), if any."""
    parts = fqn.split(".")
    for depth in range(1, len(parts)):
        prefix = ".".join(parts[:depth])
        if prefix in saved.entries and saved.entries[prefix] is None:
            return prefix
    return None


def _holds(saved: Folder, path: str, held: dict[str, tuple[Any, str]], under: set[str]) -> bool:
    """Whether the checkpoint holds a state at ``path``: entries under it (torch 2.3+), or
    the whole item that holds it (2.2) has it. ``under``: the paths with entries below them,
    filled here once (a missing key is rare; a wrong folder misses thousands)."""
    if not under:
        for entry in saved.entries:
            parts = entry.split(".")
            under.update(".".join(parts[:depth]) for depth in range(1, len(parts)))
        under.add("")  # not empty any more: made
    if saved.entries.get(path, 0) is None or path in under:
        return True
    prefix = _whole_prefix(path, saved)
    return prefix is not None and _inside(saved, prefix, path, held)


def _inside(saved: Folder, prefix: str, fqn: str, held: dict[str, tuple[Any, str]]) -> bool:
    """Whether the whole item ``prefix`` holds ``fqn``. An item that cannot be read is
    reported elsewhere: it counts as holding."""
    node = _item(saved, prefix, held)[0]
    if node is _UNREAD:
        return True
    for part in fqn[len(prefix) + 1 :].split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return False
    return True


_UNREAD = object()


def _saved_at(saved: Folder, path: str, held: dict[str, tuple[Any, str]]) -> Any:
    """The saved state at ``path`` (a dict, or None): inside the whole item that holds it
    (torch 2.2), else its entries (2.3+), each non-tensor one read; an entry deeper down
    stands as its first key."""
    prefix = path if saved.entries.get(path, 0) is None else _whole_prefix(path, saved)
    if prefix is not None:
        node = _item(saved, prefix, held)[0]
        for part in path[len(prefix) + 1 :].split(".") if path != prefix else ():
            node = node.get(part) if isinstance(node, dict) else None
        return node
    found: dict[str, Any] = {}
    for entry, kind in saved.entries.items():
        if entry.startswith(f"{path}."):
            key = entry[len(path) + 1 :]
            if "." in key or kind is not None:
                found[key.split(".", 1)[0]] = _UNREAD
            else:
                found[key] = _item(saved, entry, held)[0]
    return found


def _item(saved: Folder, fqn: str, held: dict[str, tuple[Any, str]]) -> tuple[Any, str]:
    """:func:`_read_item`, once per item: a whole item is both checked and looked into."""
    if fqn not in held:
        held[fqn] = _read_item(saved, fqn)
    return held[fqn]


def _read_item(saved: Folder, fqn: str) -> tuple[Any, str]:
    """The non-tensor item ``fqn`` loaded as hardened DCP loads it, every tensor on meta (no
    tensor data is read; ``inspect`` gives the same verdict at 2.5x the cost of these small
    files; an item written through stream transforms is read through them, bounded): its
    value (``_UNREAD`` where it cannot be loaded) and why hardened mode would refuse it
    (empty: it loads)."""
    storage = saved.storage_for(fqn)
    if storage is None:
        return _UNREAD, "no storage_data entry says where it is"
    try:
        view: IO[bytes] = io.BytesIO(saved.stored(storage))
        descriptors = storage.info.get("transform_descriptors")
        if descriptors:  # compressed by a DCP extension (2.8+): read through it, bounded
            view = transformed(view, descriptors, storage.info["length"], fqn)
        return read(view, _ON_META), ""
    except UnsafeCheckpointError as exc:
        return _UNREAD, f"names {names(list(exc.refused), 5)}" if exc.refused else str(exc)
    except CheckpointError as exc:
        return _UNREAD, str(exc).removeprefix(f"{fqn}: ")


def _fill(
    fqn: str, owner: Any, value: Any, saved_parent: Callable[[], Any]
) -> tuple[str, Any] | None:
    """(path, value) where ``compatshim.optim.load_dcp`` fills ``fqn`` for ``owner``: a
    param-group key of an optimizer, or a scheduler key (``compatshim.optim.keys``), or the
    ``_last_lr`` of a ReduceLROnPlateau saved before its first step (``value``, the
    template's), which ``saved_parent()`` (the saved state holding ``fqn``) tells."""
    from ..optim.keys import OLD_BEHAVIOUR, SCHEDULER_KEYS, old_value

    key = fqn.rpartition(".")[2]
    scheduler = any(c.__module__ == "torch.optim.lr_scheduler" for c in type(owner).__mro__)
    if scheduler and key in SCHEDULER_KEYS:
        return fqn, SCHEDULER_KEYS[key]
    if scheduler and key == "_last_lr":
        parent = saved_parent()
        return (fqn, value) if isinstance(parent, dict) and _unstepped_plateau(parent) else None
    if not scheduler and ".param_groups." in fqn and key in OLD_BEHAVIOUR:
        base = next(
            (c.__name__ for c in type(owner).__mro__ if c.__module__.startswith("torch.optim")),
            type(owner).__name__,
        )
        return fqn, old_value(base, key)
    return None


def main(folder: str, state: str, hardened: bool) -> int:
    """``compatshim resume-check``: 0 the resume would succeed, 1 it would fail, 2 unreadable.

    ``state``: ``module:function``, a function returning the template (or
    ``(template, optimizers)``); the current folder is searched first, as ``python -m`` does.
    """
    import importlib
    import sys

    module, _, function = state.partition(":")
    if not module or not function:
        print("compatshim resume-check: --state must be module:function", file=sys.stderr)
        return 2
    sys.path.insert(0, os.getcwd())
    try:  # the user's module and function may raise anything: named, never a traceback
        found = getattr(importlib.import_module(module), function)
        built = found() if callable(found) else found
        template, optimizers = built if isinstance(built, tuple) else (built, None)
        if not isinstance(template, dict):
            raise TypeError(f"expected a dict (or a function returning one), got {short(built)}")
    except SystemExit as exc:  # sys.exit(0) read 0 (a green gate); argparse at import, 2
        print(f"compatshim resume-check: --state {state}: exited (SystemExit {short(exc.code)}) "
              "instead of returning the state: give a function that builds it, in a module "
              "that does not parse the command line on import", file=sys.stderr)  # fmt: skip
        return 2
    except Exception as exc:
        print(f"compatshim resume-check: --state {state}: {type(exc).__name__}: {exc}",
              file=sys.stderr)  # fmt: skip
        return 2
    try:
        plan = plan_resume(folder, template, optimizers, hardened=hardened)
    except (CheckpointError, OSError) as exc:
        print(f"compatshim resume-check: {escaped(str(exc))}", file=sys.stderr)
        return 2
    except (TypeError, ValueError) as exc:  # what the function returned: the state's fault
        print(f"compatshim resume-check: --state {state}: {exc}", file=sys.stderr)
        return 2
    print(plan.text())
    return 0 if plan.ok else 1
