"""``find_unpicklable(obj)``: every place inside ``obj`` that stops it from being pickled.

Why: pickle reports only the first failure and no location
(``TypeError: cannot pickle 'dict_keys' object``), and ``dill.detect`` lists
bad objects without saying where they hang. Here the object graph is walked
the way pickle walks it (the same dispatch: atomic types, containers,
globals by reference, ``copyreg`` reducers, ``__reduce_ex__`` results with
their args, state, list and dict items), so a finding is exactly an object
pickle would choke on, named by its access path from the root
(``dataset.eval_cfg.class_names``). Only the innermost culprit is reported:
an object whose own reduction fails, or a function or class that cannot be
found by name; its ancestors fail only because of it and are not listed.

The walk is iterative (deep graphs do not hit the recursion limit), visits
each object once (cycles and shared objects are fine), and never serialises
data: tensors are checked through their own ``__reduce_ex__`` without
copying storage. torch is never imported here; ``nn.Module`` children and
tensors are recognised only when torch is already loaded, which it is when
the graph holds torch objects.
"""

from __future__ import annotations

import copyreg
import io
import pickle
import sys
from dataclasses import dataclass
from types import FunctionType
from typing import Any, Iterator, Optional, Tuple

__all__ = ["Finding", "find_unpicklable"]

_ATOMIC = frozenset((type(None), bool, int, float, complex, str, bytes, bytearray, type(Ellipsis)))
_SEQUENCES = (list, tuple)
_SETS = (set, frozenset)
_VIEW_TYPE_NAMES = frozenset(
    f"{prefix}_{kind}" for prefix in ("dict", "odict") for kind in ("keys", "values", "items")
)
_MODULE_CONTAINERS = ("_modules", "_parameters", "_buffers")

# A path is a linked list (parent, segment) so that 100,000 nodes cost no string building.
_Path = Optional[Tuple[Any, str]]


@dataclass(frozen=True)
class Finding:
    """One object that blocks pickling, where it is, why, and what compatshim offers."""

    path: str
    """Access path from the root, e.g. ``dataset.eval_cfg.class_names``."""
    type_name: str
    """The offending object's type (``dict_keys``, ``torch._C._distributed_c10d.ProcessGroup``)."""
    error: str
    """What pickle says about this object alone."""
    fix: str | None = None
    """The compatshim patch or function that covers it, when there is one."""

    def __str__(self) -> str:
        text = f"{self.path} ({self.type_name}): {self.error}"
        return f"{text} [fix: {self.fix}]" if self.fix else text


def find_unpicklable(
    obj: Any,
    *,
    root: str = "obj",
    protocol: int = pickle.DEFAULT_PROTOCOL,
    limit: int | None = None,
) -> list[Finding]:
    """Every innermost object in ``obj`` that ``pickle.dumps(obj, protocol)`` cannot handle.

    ``root`` names ``obj`` in the paths. ``limit`` stops after that many findings.
    An empty list means pickle gets past every object (a failure inside a
    custom ``__reduce__`` callable at load time is out of reach). When pickle
    fails but no single object is to blame (a chain deeper than the recursion
    limit), the one finding is the root with pickle's own error.

    A clean graph costs one pickling pass into a sink that discards the bytes
    (tensor storages are stood in by a reference, as ``torch.save`` does, so
    no tensor data is copied); only when that fails is the graph walked.
    """
    if limit is not None and limit <= 0:
        return []
    failure = _pickling_failure(obj, protocol)
    if failure is None:
        return []
    findings = _Walker(protocol, limit).run(obj, root)
    if not findings:  # pickle failed somewhere no single object explains (e.g. too deep)
        findings.append(Finding(root, _type_name(type(obj)), _error_text(failure)))
    return findings


class _DiscardingSink:
    """A write-only file that keeps nothing: the pickling pass costs no memory for output."""

    def write(self, data: bytes) -> int:
        return len(data)


class _StorageSkippingPickler(pickle.Pickler):
    """Stands a reference in for tensor storages, so the clean-graph check copies no data."""

    def __init__(self, protocol: int, storage_types: tuple[type, ...]) -> None:
        super().__init__(_DiscardingSink(), protocol)  # type: ignore[arg-type]
        self._storage_types = storage_types

    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, self._storage_types):
            return id(obj)
        return None


def _pickling_failure(obj: Any, protocol: int) -> Exception | None:
    """What one pickling pass over ``obj`` raises, or None when it goes through."""
    torch = sys.modules.get("torch")
    storage_types = tuple(
        t
        for t in (
            getattr(torch, "UntypedStorage", None),
            getattr(getattr(torch, "storage", None), "TypedStorage", None),
        )
        if isinstance(t, type)
    )
    try:
        if storage_types:
            _StorageSkippingPickler(protocol, storage_types).dump(obj)
        else:
            pickle.Pickler(_DiscardingSink(), protocol).dump(obj)  # type: ignore[arg-type]
    except Exception as exc:  # RecursionError included: the walk is iterative
        return exc
    return None


class _Walker:
    def __init__(self, protocol: int, limit: int | None) -> None:
        self.protocol = protocol
        self.limit = limit
        self.findings: list[Finding] = []
        self.seen: dict[int, Any] = {}  # id -> object, kept alive so ids are not reused
        self.global_errors: dict[int, tuple[Any, str | None]] = {}  # id -> (kept alive, error)
        torch = sys.modules.get("torch")
        self.module_type: Any = getattr(getattr(torch, "nn", None), "Module", None)
        self.tensor_type: Any = getattr(torch, "Tensor", None)

    def run(self, obj: Any, root: str) -> list[Finding]:
        stack: list[tuple[Any, _Path, Any]] = [(obj, (None, root), None)]
        while stack:
            if self.limit is not None and len(self.findings) >= self.limit:
                break
            item, path, owner = stack.pop()
            children = self._visit(item, path, owner)
            if children:
                stack.extend(reversed(children))
        return self.findings

    # -- one object ----------------------------------------------------------------------

    def _visit(self, obj: Any, path: _Path, owner: Any) -> list[tuple[Any, _Path, Any]]:
        cls = type(obj)
        if cls in _ATOMIC:
            return []
        key = id(obj)
        if key in self.seen:
            return []
        self.seen[key] = obj
        if cls is dict:
            return self._dict_children(obj, path, owner)
        if cls in _SEQUENCES:
            return [
                (value, (path, f"[{i}]"), owner)
                for i, value in enumerate(obj)
                if type(value) not in _ATOMIC
            ]
        if cls in _SETS:
            return [
                (value, (path, f"{{#{i}}}"), owner)
                for i, value in enumerate(obj)
                if type(value) not in _ATOMIC
            ]
        if cls is FunctionType or isinstance(obj, type):
            self._check_global(obj, obj, path, owner)
            return []
        if self.tensor_type is not None and isinstance(obj, self.tensor_type):
            return self._tensor(obj, path, owner)
        return self._reduced(obj, path, owner)

    def _dict_children(self, obj: Any, path: _Path, owner: Any) -> list[tuple[Any, _Path, Any]]:
        children: list[tuple[Any, _Path, Any]] = []
        for i, (k, value) in enumerate(obj.items()):
            if type(k) not in _ATOMIC:
                children.append((k, (path, f"<key #{i}>"), owner))
            if type(value) not in _ATOMIC:
                children.append((value, (path, _item_segment(k, i)), owner))
        return children

    def _reduced(self, obj: Any, path: _Path, owner: Any) -> list[tuple[Any, _Path, Any]]:
        cls = type(obj)
        try:
            reducer = copyreg.dispatch_table.get(cls)
            rv = reducer(obj) if reducer is not None else obj.__reduce_ex__(self.protocol)
        except Exception as exc:
            self._report(obj, path, owner, _error_text(exc))
            return []
        if isinstance(rv, str):  # pickled by name, like a global
            self._check_global(obj, obj, path, owner)
            return []
        if not isinstance(rv, tuple) or not 2 <= len(rv) <= 6:
            self._report(obj, path, owner, f"__reduce_ex__ returned {type(rv).__name__}")
            return []
        func, args, state, list_items, dict_items = (*rv, None, None, None)[:5]
        children: list[tuple[Any, _Path, Any]] = []
        if getattr(func, "__name__", "") in ("__newobj__", "__newobj_ex__") and args:
            self._check_global(args[0], obj, path, owner)  # the class, stored by name
            args = args[1:]
        else:
            if isinstance(func, (FunctionType, type)) or callable(func):
                self._check_global(func, obj, path, owner)
        children += self._arg_children(obj, func, args, path)
        children += self._state_children(obj, state, path)
        try:
            listed = _drain(list_items)
            paired = _drain(dict_items)
        except Exception as exc:
            self._report(obj, path, owner, _error_text(exc))
            return children
        children += [(v, (path, f"[{i}]"), obj) for i, v in enumerate(listed)]
        for i, pair in enumerate(paired):
            k, value = pair
            if type(k) not in _ATOMIC:
                children.append((k, (path, f"<key #{i}>"), obj))
            children.append((value, (path, _item_segment(k, i)), obj))
        return children

    def _arg_children(
        self, obj: Any, func: Any, args: Any, path: _Path
    ) -> list[tuple[Any, _Path, Any]]:
        if not isinstance(args, tuple):
            return [(args, (path, "<args>"), obj)]
        if func is getattr and len(args) == 2:  # bound methods: getattr(self, name)
            return [(args[0], (path, ".__self__"), obj)]
        if isinstance(obj, dict) and len(args) == 1:  # defaultdict(factory)
            return [(args[0], (path, ".default_factory"), obj)]
        return [(value, (path, f"<arg {i}>"), obj) for i, value in enumerate(args)]

    def _state_children(self, obj: Any, state: Any, path: _Path) -> list[tuple[Any, _Path, Any]]:
        if state is None:
            return []
        slots: Any = None
        if isinstance(state, tuple) and len(state) == 2 and isinstance(state[1], dict):
            state, slots = state  # (instance dict or None, slot values)
        children: list[tuple[Any, _Path, Any]] = []
        for part in (state, slots):
            if part is None:
                continue
            if type(part) is dict and all(type(k) is str for k in part):
                if self.module_type is not None and isinstance(obj, self.module_type):
                    children += self._module_children(obj, part, path)
                else:
                    children += [
                        (v, (path, f".{k}"), obj) for k, v in part.items() if type(v) not in _ATOMIC
                    ]
            else:
                children.append((part, (path, "<state>"), obj))
        return children

    def _module_children(
        self, module: Any, state: dict[str, Any], path: _Path
    ) -> list[tuple[Any, _Path, Any]]:
        """``nn.Module`` state with submodules, parameters and buffers named as attributes."""
        children: list[tuple[Any, _Path, Any]] = []
        for name, value in state.items():
            if name in _MODULE_CONTAINERS and type(value) in (dict, _ordered_dict_type()):
                self.seen[id(value)] = value
                children += [
                    (v, (path, f".{k}"), module) for k, v in value.items() if v is not None
                ]
            else:
                children.append((value, (path, f".{name}"), module))
        return children

    def _tensor(self, tensor: Any, path: _Path, owner: Any) -> list[tuple[Any, _Path, Any]]:
        """Tensors: ask the tensor itself, never walk (or copy) its storage."""
        try:
            tensor.__reduce_ex__(self.protocol)
        except Exception as exc:
            self._report(tensor, path, owner, _error_text(exc))
            return []
        extra = getattr(tensor, "__dict__", None)
        if not extra:
            return []
        return [(v, (path, f".{k}"), tensor) for k, v in extra.items()]

    # -- verdicts ------------------------------------------------------------------------

    def _check_global(self, ref: Any, obj: Any, path: _Path, owner: Any) -> None:
        """Functions and classes are pickled by name: the name must lead back to them."""
        if not isinstance(ref, (FunctionType, type)) and not callable(ref):
            return
        key = id(ref)
        if key not in self.global_errors:
            self.global_errors[key] = (ref, _global_error(ref, self.protocol))
        error = self.global_errors[key][1]
        if error is not None:
            self._report(obj, path, owner, error)

    def _report(self, obj: Any, path: _Path, owner: Any, error: str) -> None:
        self.findings.append(
            Finding(
                path=_render(path),
                type_name=_type_name(type(obj)),
                error=error,
                fix=_fix_for(obj, owner),
            )
        )


# -- helpers ---------------------------------------------------------------------------


def _global_error(ref: Any, protocol: int) -> str | None:
    if not isinstance(ref, (FunctionType, type)):
        return None  # other callables (bound methods, partials) are walked as objects
    try:
        pickle.Pickler(io.BytesIO(), protocol).dump(ref)  # by name: writes a few bytes
    except Exception as exc:
        return _error_text(exc)
    return None


def _drain(items: Iterator[Any] | None) -> list[Any]:
    return [] if items is None else list(items)


def _ordered_dict_type() -> type:
    from collections import OrderedDict

    return OrderedDict


def _item_segment(key: Any, index: int) -> str:
    if type(key) in (str, int, float, bool, type(None)):
        return f"[{key!r}]"
    return f"[<key #{index}>]"


def _render(path: _Path) -> str:
    parts: list[str] = []
    while path is not None:
        path, segment = path
        parts.append(segment)
    return "".join(reversed(parts))


def _type_name(cls: type) -> str:
    module = getattr(cls, "__module__", "builtins")
    if module == "builtins":
        return cls.__qualname__
    return f"{module}.{cls.__qualname__}"


def _error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _fix_for(obj: Any, owner: Any) -> str | None:
    """The compatshim patch or function that covers this kind of culprit, if any."""
    cls = type(obj)
    module = getattr(cls, "__module__", "") or ""
    if cls.__name__ in _VIEW_TYPE_NAMES:
        owner_module = getattr(type(owner), "__module__", "") or ""
        if owner_module.startswith("nuscenes"):
            return "patch nuscenes-dict-views (compatshim.install())"
        return None
    if module.startswith("torch") and "ProcessGroup" in cls.__name__:
        return (
            "patch torch-processgroup-copy (compatshim.install()); "
            "compatshim.clone_module for a deep copy"
        )
    if module in ("_thread", "threading") or module.startswith("torch.cuda"):
        return "compatshim.clone_module shares it in a deep copy (pickling cannot carry it)"
    return None
