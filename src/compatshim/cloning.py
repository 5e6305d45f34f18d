"""``clone_module``: the deep copy EMA code needs, whether or not patches are installed.

``copy.deepcopy(model)`` fails as soon as the model holds a communicator
(a ``ProcessGroup``, e.g. inside ``nn.SyncBatchNorm``) or a lock, and would be
wrong even where it succeeds for streams and events: those are handles to
shared resources, not data. ``clone_module`` finds such handles first and
pre-seeds the deepcopy memo with them, so ``deepcopy`` shares them by
reference while it copies parameters, buffers, hooks and custom attributes as
usual. Nothing global is edited, so other threads copying at the same time
see plain ``deepcopy`` semantics.
"""

from __future__ import annotations

import collections
import copy
import functools
import logging
import sys
import threading
import types
from typing import Any, Iterable, TypeVar

from ._text import short

__all__ = ["clone_module", "shared_handle_types"]

M = TypeVar("M")

# Handles found on torch once it is imported; looked up by name, never imported here.
_TORCH_HANDLES = (
    "torch.Stream",
    "torch.Event",
    "torch.cuda.Stream",
    "torch.cuda.Event",
    "torch.cpu.Stream",
    "torch.cpu.Event",
    "torch.xpu.Stream",
    "torch.xpu.Event",
    "torch._C._distributed_c10d.ProcessGroup",
    "torch._C._distributed_c10d.Backend",
    "torch._C._distributed_c10d.Store",
    "torch._C._distributed_c10d.Work",
)

# Values deepcopy treats as atomic or that cannot hold a handle worth sharing.
_LEAVES = (
    type(None),
    bool,
    int,
    float,
    complex,
    str,
    bytes,
    type,
    range,
    types.FunctionType,
    types.BuiltinFunctionType,
    types.ModuleType,
    types.CodeType,
    property,
)


def _resolve(dotted: str) -> Any:
    root, *parts = dotted.split(".")
    obj: Any = sys.modules.get(root)
    for part in parts:
        if obj is None:
            return None
        if isinstance(obj, types.ModuleType):  # never trigger a lazy submodule import
            obj = sys.modules.get(f"{obj.__name__}.{part}", vars(obj).get(part))
        else:
            obj = getattr(obj, part, None)
    return obj


def shared_handle_types() -> tuple[type, ...]:
    """Types whose instances ``clone_module`` shares instead of copying."""
    found: list[type] = [
        type(threading.Lock()),
        type(threading.RLock()),
        threading.Condition,
        threading.Semaphore,
        threading.Event,
        threading.Thread,
        logging.Logger,
        logging.LoggerAdapter,
    ]
    for dotted in _TORCH_HANDLES:
        cls = _resolve(dotted)
        if isinstance(cls, type):
            found.append(cls)
    unbound = _resolve("compatshim.patches.torch_processgroup_copy.UnboundProcessGroup")
    if isinstance(unbound, type):
        found.append(unbound)
    return tuple(dict.fromkeys(found))


# How the walk treats each type: decided once per type, then looked up (isinstance
# against torch's metaclasses runs Python code, too slow to repeat per object).
_LEAF, _HANDLE, _MAPPING, _SEQUENCE, _METHOD, _PARTIAL, _TENSOR, _OBJECT = range(8)


def _plan(
    cls: type, handle_types: tuple[type, ...], tensor_type: Any
) -> tuple[int, tuple[str, ...]]:
    if issubclass(cls, handle_types):
        return _HANDLE, ()
    if issubclass(cls, _LEAVES):
        return _LEAF, ()
    if issubclass(cls, dict):
        return _MAPPING, ()
    if issubclass(cls, (list, tuple, set, frozenset, collections.deque)):
        return _SEQUENCE, ()
    if issubclass(cls, types.MethodType):
        return _METHOD, ()
    if issubclass(cls, functools.partial):
        return _PARTIAL, ()
    if isinstance(tensor_type, type) and issubclass(cls, tensor_type):
        return _TENSOR, ()  # torch copies the data; only the tensor's __dict__ can hold a handle
    slots: list[str] = []
    for klass in cls.__mro__:
        declared = klass.__dict__.get("__slots__", ())
        for slot in (declared,) if isinstance(declared, str) else declared:
            if slot not in ("__dict__", "__weakref__"):
                slots.append(slot)
    return _OBJECT, tuple(slots)


def _find_handles(root: Any, handle_types: tuple[type, ...]) -> list[Any]:
    """Handles reachable the way ``deepcopy`` descends: containers, ``__dict__``, slots."""
    tensor_type = _resolve("torch.Tensor")
    plans: dict[type, tuple[int, tuple[str, ...]]] = {}
    found: list[Any] = []
    seen: set[int] = set()
    stack = [root]
    push, extend, pop = stack.append, stack.extend, stack.pop
    while stack:
        obj = pop()
        cls = type(obj)
        plan = plans.get(cls)
        if plan is None:
            plan = plans[cls] = _plan(cls, handle_types, tensor_type)
        kind = plan[0]
        if kind == _LEAF:
            continue
        key = id(obj)
        if key in seen:
            continue
        seen.add(key)
        if kind == _HANDLE:
            found.append(obj)
        elif kind == _MAPPING:
            extend(obj)
            extend(obj.values())
        elif kind == _SEQUENCE:
            extend(obj)
        elif kind == _METHOD:
            push(obj.__self__)
        elif kind == _PARTIAL:
            extend((obj.func, obj.args, obj.keywords))
        elif kind in (_TENSOR, _OBJECT):
            state = getattr(obj, "__dict__", None)
            if state:
                push(state)
            for slot in plan[1]:
                push(getattr(obj, slot, None))
    return found


def clone_module(module: M, *, share: Iterable[Any] = ()) -> M:
    """A deep copy of ``module`` that shares process groups and other non-data handles.

    Parameters and buffers are copied (``requires_grad`` kept); hooks,
    custom attributes and nested containers are deep-copied as ``deepcopy``
    does. Shared by reference: ProcessGroups and c10d stores/backends,
    streams and events, locks, conditions, threads and loggers, plus
    anything in ``share`` (objects, shared wherever they hang, or types whose
    instances to share). Handles are found through containers, ``__dict__`` and ``__slots__``;
    state produced only by a custom ``__getstate__`` is copied as usual.
    An object ``deepcopy`` refuses is a TypeError naming where it hangs and ``share=``.
    A DDP wrapper goes through DDP's own pickling, which torch allows only
    over the default group: for DDP over a subgroup, clone ``ddp.module``.
    """
    if isinstance(share, (str, bytes)) or not isinstance(share, Iterable):
        raise TypeError(f"clone_module: share= takes objects or types to share, got {short(share)}")
    extra = list(share)
    handle_types = shared_handle_types() + tuple(x for x in extra if isinstance(x, type))
    memo: dict[int, Any] = {id(x): x for x in extra if not isinstance(x, type)}  # wherever
    for handle in _find_handles(module, handle_types):
        memo[id(handle)] = handle
    try:
        return copy.deepcopy(module, memo)
    except TypeError as exc:  # "cannot pickle 'X' object", naming neither where nor a way out
        raise TypeError(_cannot_copy(module, exc)) from exc


def _cannot_copy(module: Any, exc: TypeError) -> str:
    """deepcopy's refusal, with where the object hangs (``find_unpicklable``'s paths for the
    same refusal) and the way out."""
    from .pickling import find_unpicklable

    said = f"TypeError: {exc}"
    try:
        paths = [f.path for f in find_unpicklable(module, root="module") if f.error == said]
    except Exception:  # the walk is a courtesy: the refusal is told either way
        paths = []
    where = f" at {', '.join(paths[:3])}{' ...' if len(paths) > 3 else ''}" if paths else ""
    return (
        f"clone_module: copy.deepcopy refused an object{where}: {exc}; to share it with the "
        "copy instead, pass it or its type in share="
    )
