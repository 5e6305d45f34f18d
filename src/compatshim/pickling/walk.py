"""The walk behind ``find_unpicklable``: pickle's own dispatch, one object at a time.

The graph is walked the way pickle walks it (atomic types, exact built-in
containers, functions and classes by name, ``copyreg`` reducers, then
``__reduce_ex__`` with its callable, args, state, list and dict items and
state setter, each checked as pickle checks them), so a finding is exactly
an object pickle would choke on, named by its access path from the root.
Only the innermost culprit is reported: its ancestors fail only because of it.

Iterative (deep graphs do not hit the recursion limit), each object once
(cycles and shared objects are fine), no data serialised: tensors answer
through their own ``__reduce_ex__`` without copying storage.

Hostile objects: user code runs only inside the visit of the object it
belongs to (a parent lists its children by identity and type, never by
hashing, comparing or printing them), and any exception a visit meets
becomes a finding for that object at its path: pickle's own words when the
reduction itself fails or breaks pickle's rules, ``could not inspect: ...``
for anything else. The walk then carries on with the rest of the graph.
"""

from __future__ import annotations

import copyreg
import io
import pickle
import sys
from collections import OrderedDict
from types import FunctionType
from typing import Any, Optional, Tuple

from .finding import Finding, error_text, fix_for, type_attribute, type_name

_ATOMIC = (type(None), bool, int, float, complex, str, bytes, bytearray, type(Ellipsis))
# Types are compared by identity: hashing or comparing a user's class can run its metaclass.
_ATOMIC_IDS = frozenset(id(t) for t in _ATOMIC)
_PRINTABLE_KEY_IDS = frozenset(id(t) for t in (str, int, float, bool, type(None)))
_MODULE_CONTAINERS = ("_modules", "_parameters", "_buffers")
# pickle words its refusals of a reduction differently from 3.14 on: each names the offending
# type (", not int"), "element" became "item", and __newobj__'s checks read as argument errors.
# A finding says what the running interpreter's pickle says.
_WORDS_314 = sys.version_info >= (3, 14)
_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class made by a class statement (or type())

# How deep the walk goes: twice the deepest chain the tests walk, where pickle itself stops
# near the recursion limit. Past it, an object whose ``__reduce__`` makes a new one every
# time (which pickle meets as a RecursionError) would be walked forever.
MAX_DEPTH = 200_000
_TOO_DEEP = (
    f"RecursionError: more than {MAX_DEPTH:,} objects deep (pickle gives up far sooner); "
    "what hangs below is not walked"
)

# A path is a linked list (parent, segment) so that 100,000 nodes cost no string building.
_Path = Optional[Tuple[Any, str]]


class _Refused(Exception):
    """pickle's own verdict on the object being visited, in pickle's words."""

    def __init__(self, message: str, kind: type[Exception] = pickle.PicklingError) -> None:
        super().__init__(message)
        self.error = kind(message)


class Walker:
    """Finds the innermost culprits under one root; ``run`` once per walker."""

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
        depths = [0]  # each stack entry's depth below the root
        while stack:
            if self.limit is not None and len(self.findings) >= self.limit:
                break
            item, path, owner = stack.pop()
            depth = depths.pop()
            try:
                children = self._visit(item, path, owner)
            except _Refused as refusal:
                self._report(item, path, owner, error_text(refusal.error))
                continue
            except Exception as exc:  # whatever the object raised while being looked at
                self._report(item, path, owner, "could not inspect: " + error_text(exc))
                continue
            if children and depth >= MAX_DEPTH:  # a __reduce__ that makes new objects forever
                self._report(item, path, owner, _TOO_DEEP)
            elif children:
                stack.extend(reversed(children))
                depths.extend([depth + 1] * len(children))
        return self.findings

    # -- one object ----------------------------------------------------------------------
    # Dispatch follows pickle's ``save``: exact built-in containers, functions and
    # classes by name, copyreg's dispatch table, then ``__reduce_ex__``.

    def _visit(self, obj: Any, path: _Path, owner: Any) -> list[tuple[Any, _Path, Any]]:
        cls = type(obj)
        if id(cls) in _ATOMIC_IDS:
            return []
        key = id(obj)
        if key in self.seen:
            return []
        self.seen[key] = obj
        if cls is dict:
            return self._dict_children(obj, path, owner)
        if cls is list or cls is tuple:
            return [
                (v, (path, f"[{i}]"), owner)
                for i, v in enumerate(obj)
                if id(type(v)) not in _ATOMIC_IDS
            ]
        if cls is set or cls is frozenset:
            return [
                (v, (path, f"{{#{i}}}"), owner)
                for i, v in enumerate(obj)
                if id(type(v)) not in _ATOMIC_IDS
            ]
        if cls is FunctionType or issubclass(cls, type):
            self._check_global(obj, obj, path, owner)
            return []
        if self.tensor_type is not None and issubclass(cls, self.tensor_type):
            return self._tensor(obj, path, owner)
        return self._reduced(obj, path, owner)

    def _dict_children(self, obj: Any, path: _Path, owner: Any) -> list[tuple[Any, _Path, Any]]:
        children: list[tuple[Any, _Path, Any]] = []
        for i, (k, value) in enumerate(obj.items()):
            if id(type(k)) not in _ATOMIC_IDS:
                children.append((k, (path, f"<key #{i}>"), owner))
            if id(type(value)) not in _ATOMIC_IDS:
                children.append((value, (path, _item_segment(k, i)), owner))
        return children

    def _reduced(self, obj: Any, path: _Path, owner: Any) -> list[tuple[Any, _Path, Any]]:
        try:
            reducer = copyreg.dispatch_table.get(type(obj))
            rv = reducer(obj) if reducer is not None else obj.__reduce_ex__(self.protocol)
        except Exception as exc:
            self._report(obj, path, owner, error_text(exc))
            return []
        if issubclass(type(rv), str):  # pickled by that name, like a global
            self._check_global(obj, obj, path, owner, by_name=True)
            return []
        func, args, state, listed, paired, setter = _reduction(rv)
        children: list[tuple[Any, _Path, Any]] = []
        newobj = _newobj_kind(func)
        if newobj is not None:
            self._check_newobj(obj, args, newobj, path, owner)
            args = args[1:]
        elif type(func) is FunctionType or issubclass(type(func), type):
            self._check_global(func, obj, path, owner)
        else:  # another callable (a builtin, a partial...): pickle saves it like any object
            children.append((func, (path, "<callable>"), obj))
        children += self._arg_children(obj, func, args, path)
        children += self._state_children(obj, state, path)
        for i, value in enumerate([] if listed is None else listed):
            children.append((value, (path, f"[{i}]"), obj))
        for i, pair in enumerate([] if paired is None else paired):
            if type(pair) is not tuple or len(pair) != 2:
                raise _Refused("dict items iterator must return 2-tuples", TypeError)
            k, value = pair
            if id(type(k)) not in _ATOMIC_IDS:
                children.append((k, (path, f"<key #{i}>"), obj))
            children.append((value, (path, _item_segment(k, i)), obj))
        if setter is not None:
            children.append((setter, (path, "<state setter>"), obj))
        return children

    def _check_newobj(
        self, obj: Any, args: tuple[Any, ...], kind: str, path: _Path, owner: Any
    ) -> None:
        """``__newobj__(cls, *args)`` / ``__newobj_ex__(cls, args, kwargs)``: cls goes by name."""
        if kind == "__newobj_ex__":
            if len(args) != 3:
                raise _Refused(
                    f"__newobj_ex__ expected 3 arguments, got {len(args)}"
                    if _WORDS_314
                    else "length of the NEWOBJ_EX argument tuple must be exactly 3, "
                    f"not {len(args)}"
                )
            if not issubclass(type(args[0]), type):
                raise _Refused(
                    (
                        "first argument to __newobj_ex__() must be a class"
                        if _WORDS_314
                        else "first item from NEWOBJ_EX argument tuple must be a class"
                    )
                    + _not(args[0])
                )
        else:
            if not args:
                raise _Refused(
                    "__newobj__ expected at least 1 argument, got 0"
                    if _WORDS_314
                    else "__newobj__ arglist is empty"
                )
            if not issubclass(type(args[0]), type):
                raise _Refused(
                    f"first argument to __newobj__() must be a class{_not(args[0])}"
                    if _WORDS_314
                    else "args[0] from __newobj__ args is not a type"
                )
            cls = obj.__class__  # pickle asks the object: a hostile one may raise
            if args[0] is not cls:
                raise _Refused(
                    f"first argument to __newobj__() must be {cls!r}, not {args[0]!r}"
                    if _WORDS_314
                    else "args[0] from __newobj__ args has the wrong class"
                )
        self._check_global(args[0], obj, path, owner)

    def _arg_children(
        self, obj: Any, func: Any, args: tuple[Any, ...], path: _Path
    ) -> list[tuple[Any, _Path, Any]]:
        if func is getattr and len(args) == 2:  # bound methods: getattr(self, name)
            return [(args[0], (path, ".__self__"), obj)]
        if issubclass(type(obj), dict) and len(args) == 1:  # defaultdict(factory)
            return [(args[0], (path, ".default_factory"), obj)]
        return [(value, (path, f"<arg {i}>"), obj) for i, value in enumerate(args)]

    def _state_children(self, obj: Any, state: Any, path: _Path) -> list[tuple[Any, _Path, Any]]:
        if state is None:
            return []
        slots: Any = None
        if type(state) is tuple and len(state) == 2 and type(state[1]) is dict:
            state, slots = state  # (instance dict or None, slot values)
        children: list[tuple[Any, _Path, Any]] = []
        for part in (state, slots):
            if part is None:
                continue
            if type(part) is dict and all(type(k) is str for k in part):
                if self.module_type is not None and issubclass(type(obj), self.module_type):
                    children += self._module_children(obj, part, path)
                else:
                    children += _attribute_children(obj, part, path)
            else:
                children.append((part, (path, "<state>"), obj))
        return children

    def _module_children(
        self, module: Any, state: dict[str, Any], path: _Path
    ) -> list[tuple[Any, _Path, Any]]:
        """``nn.Module`` state with submodules, parameters and buffers named as attributes."""
        children: list[tuple[Any, _Path, Any]] = []
        for name, value in state.items():
            if name in _MODULE_CONTAINERS and (type(value) is dict or type(value) is OrderedDict):
                self.seen[id(value)] = value
                children += _attribute_children(module, value, path)
            else:
                children.append((value, (path, f".{name}"), module))
        return children

    def _tensor(self, tensor: Any, path: _Path, owner: Any) -> list[tuple[Any, _Path, Any]]:
        """Tensors: ask the tensor itself, never walk (or copy) its storage."""
        try:
            tensor.__reduce_ex__(self.protocol)
        except Exception as exc:
            self._report(tensor, path, owner, error_text(exc))
            return []
        extra = getattr(tensor, "__dict__", None)
        if type(extra) is not dict or not extra:
            return []
        return _attribute_children(tensor, extra, path)

    # -- verdicts ------------------------------------------------------------------------

    def _check_global(
        self, ref: Any, obj: Any, path: _Path, owner: Any, by_name: bool = False
    ) -> None:
        """Functions, classes and objects reduced to a name: the name must lead back to them."""
        key = id(ref)
        if key not in self.global_errors:
            self.global_errors[key] = (ref, _global_error(ref, self.protocol, by_name))
        error = self.global_errors[key][1]
        if error is not None:
            self._report(obj, path, owner, error)

    def _report(self, obj: Any, path: _Path, owner: Any, error: str) -> None:
        self.findings.append(
            Finding(
                path=_render(path),
                type_name=type_name(type(obj)),
                error=error,
                fix=fix_for(obj, owner),
            )
        )


# -- the parts of a reduction, checked as pickle checks them ---------------------------


def _reduction(rv: Any) -> tuple[Any, tuple[Any, ...], Any, Any, Any, Any]:
    """``(func, args, state, listitems, dictitems, state_setter)``, or pickle's refusal.

    Tuple subclasses are read with ``tuple``'s own methods (as pickle does), so
    an override of ``__len__`` or ``__iter__`` on what ``__reduce__`` returned
    is never called. The list and dict items are drained here: pickle iterates them.
    """
    named = _not if _WORDS_314 else lambda value: ""  # the type, where pickle names it
    if not issubclass(type(rv), tuple):
        raise _Refused(f"__reduce__ must return a string or tuple{named(rv)}")
    parts = _plain_tuple(rv)
    if not 2 <= len(parts) <= 6:
        raise _Refused("tuple returned by __reduce__ must contain 2 through 6 elements")
    func, args, state, listed, paired, setter = parts + (None,) * (6 - len(parts))
    if not callable(func):
        raise _Refused(
            f"first item of the tuple returned by __reduce__ must be callable{named(func)}"
        )
    if not issubclass(type(args), tuple):
        raise _Refused(
            f"second item of the tuple returned by __reduce__ must be a tuple{named(args)}"
        )
    part = "item" if _WORDS_314 else "element"
    for ordinal, items in (("fourth", listed), ("fifth", paired)):
        if items is not None and not _is_iterator(items):
            raise _Refused(
                f"{ordinal} {part} of the tuple returned by __reduce__ must be an iterator"
                + _not(items)
            )
    if setter is not None and not callable(setter):
        must = "be callable" if _WORDS_314 else "be a function"
        raise _Refused(
            f"sixth {part} of the tuple returned by __reduce__ must {must}{_not(setter)}"
        )
    listed = None if listed is None else list(listed)
    paired = None if paired is None else list(paired)
    return func, _plain_tuple(args), state, listed, paired, setter


def _not(value: Any) -> str:
    """``", not <type>"`` as pickle's C code names a type: from 3.14 ``%T`` (``module.QualName``,
    no module for builtins and ``__main__``), before it ``tp_name`` (a class statement's
    ``__name__``, an extension type's dotted name)."""
    cls = type(value)
    if _WORDS_314:
        module = type_attribute(cls, "__module__", "builtins")
        qualname = type_attribute(cls, "__qualname__", "<unnamed type>")
        name = qualname if module in ("builtins", "__main__") else f"{module}.{qualname}"
        return f", not {name}"
    if type.__dict__["__flags__"].__get__(cls) & _HEAPTYPE:
        return f", not {type_attribute(cls, '__name__', '<unnamed type>')}"
    return f", not {type_name(cls)}"


def _plain_tuple(value: Any) -> tuple[Any, ...]:
    return value if type(value) is tuple else tuple.__getitem__(value, slice(None))


def _is_iterator(value: Any) -> bool:
    return callable(getattr(type(value), "__next__", None))


def _newobj_kind(func: Any) -> str | None:
    """pickle's test: a callable named ``__newobj__``/``__newobj_ex__`` builds via cls.__new__."""
    name = getattr(func, "__name__", None)  # a raising __name__ raises here, as in pickle
    if not issubclass(type(name), str):
        return None
    plain = str.__str__(name)  # an exact str: a subclass's __eq__ is never asked
    return plain if plain in ("__newobj__", "__newobj_ex__") else None


# -- children and paths ---------------------------------------------------------------


def _attribute_children(
    owner: Any, attributes: dict[Any, Any], path: _Path
) -> list[tuple[Any, _Path, Any]]:
    """``.name`` children of a state dict (a non-string key is named by its position)."""
    children: list[tuple[Any, _Path, Any]] = []
    for i, (k, value) in enumerate(attributes.items()):
        if id(type(value)) in _ATOMIC_IDS:
            continue
        segment = f".{k}" if type(k) is str else f"[<key #{i}>]"
        children.append((value, (path, segment), owner))
    return children


def _global_error(ref: Any, protocol: int, by_name: bool) -> str | None:
    """What pickle says about ``ref`` saved by name (a few bytes), None when it finds it."""
    if not by_name and type(ref) is not FunctionType and not issubclass(type(ref), type):
        return None
    try:
        pickle.Pickler(io.BytesIO(), protocol).dump(ref)
    except Exception as exc:
        return error_text(exc)
    return None


def _item_segment(key: Any, index: int) -> str:
    if id(type(key)) in _PRINTABLE_KEY_IDS:  # built-in repr, no user code
        try:
            return f"[{key!r}]"
        except ValueError:  # an int too long to print (sys.get_int_max_str_digits)
            pass
    return f"[<key #{index}>]"


def _render(path: _Path) -> str:
    parts: list[str] = []
    while path is not None:
        path, segment = path
        parts.append(segment)
    return "".join(reversed(parts))
