"""A machine that runs a pickle symbolically: it constructs nothing the file names.

Globals become :class:`Symbol` values, calls become symbols of their result,
BUILD does nothing. What it records: every global with how often the pickle
refers to it, every storage declared through a persistent id, every tensor
rebuild with its dtype. ``inspect`` reports from it, ``load`` uses it to name
every refused global at once, and the legacy reader to learn storage sizes
before it allocates anything.
"""

from __future__ import annotations

import collections
import contextlib
from dataclasses import dataclass, field
from typing import Any

from .._text import short
from ._container import StorageDecl, declare_storage
from ._machine import Machine, Source
from .allowlist import STORAGE_DTYPES, covering, lookup, storage_type

TENSOR_REBUILDS = frozenset(
    {
        "torch._utils._rebuild_tensor",
        "torch._utils._rebuild_tensor_v2",
        "torch._utils._rebuild_tensor_v3",
        "torch._utils._rebuild_meta_tensor_no_storage",
    }
)


class Symbol:
    """A global, or the result of calling one, standing in for the real object."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<{self.name}>"


@dataclass
class ScanResult:
    globals: collections.Counter[str] = field(default_factory=collections.Counter)
    storages: dict[str, StorageDecl] = field(default_factory=dict)
    tensor_dtypes: collections.Counter[str] = field(default_factory=collections.Counter)
    persistent_kinds: collections.Counter[str] = field(default_factory=collections.Counter)
    reached: set[str] = field(default_factory=set)  # names reached through builtins.getattr
    protocol: int = 0
    problems: list[str] = field(default_factory=list)  # what load refuses whatever it allows


class ScanMachine(Machine):
    """Symbolic run; see the module docstring. ``container``: "zip" or "legacy" where
    storage ids are read (checked as ``load`` checks them), None for a plain pickle."""

    def __init__(self, source: Source, container: str | None = None) -> None:
        super().__init__(source)
        self.container = container
        self.found = ScanResult()
        self._symbols: dict[str, Symbol] = {}

    def run(self) -> Any:
        value = super().run()
        self.found.protocol = self.proto
        return value

    def find_global(self, module: str, name: str) -> Any:
        qualname = f"{module}.{name}"
        self.found.globals[qualname] += 1
        symbol = self._symbols.get(qualname)
        if symbol is None:
            symbol = self._symbols[qualname] = Symbol(qualname)
        return symbol

    def _get(self, index: int) -> None:
        super()._get(index)
        top = self.stack[-1]
        if type(top) is Symbol and self._symbols.get(top.name) is top:
            self.found.globals[top.name] += 1

    def call(self, func: Any, args: tuple[Any, ...]) -> Any:
        name = func.name if type(func) is Symbol else f"<{type(func).__name__}>"
        if type(func) is not Symbol or name.endswith(")"):
            self.found.problems.append(f"call of {short(name)}: only globals may be called")
        else:
            module, _, attr = name.rpartition(".")
            entry = covering(module, attr)
            if entry is not None and entry.kind in ("constant", "method"):
                self.found.problems.append(f"call of {name}: it may not be called")
        if name == "builtins.getattr":  # the one rule entry: what it reaches is judged as a name
            if len(args) == 2 and type(args[0]) is Symbol and type(args[1]) is str:
                reached = f"{args[0].name}.{args[1]}"
            else:
                reached = "builtins.getattr(<anything but a class and a name>)"
            self.found.globals[reached] += 1
            self.found.reached.add(reached)
            return Symbol(reached)
        if name in TENSOR_REBUILDS:
            self.found.tensor_dtypes[self._tensor_dtype(name, args)] += 1
        elif name == "torch._tensor._rebuild_from_type_v2" and len(args) == 4:
            inner = args[2] if type(args[2]) is tuple else ()
            self.call(args[0], inner)
        return Symbol(_called(name, "()"))

    def _tensor_dtype(self, name: str, args: tuple[Any, ...]) -> str:
        if name.endswith("_v3") and len(args) > 6 and type(args[6]) is Symbol:
            return args[6].name.rpartition(".")[2]
        if name.endswith("no_storage") and args and type(args[0]) is Symbol:
            return args[0].name.rpartition(".")[2]
        if args and type(args[0]) is StorageDecl:
            return args[0].dtype
        return "?"

    def new_object(self, cls: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        name = cls.name if type(cls) is Symbol else f"<{type(cls).__name__}>"
        return Symbol(_called(name, ".__new__()"))

    def build(self, inst: Any, state: Any) -> None:
        return None

    def persistent_load(self, pid: Any) -> Any:
        if type(pid) is not tuple or not pid:
            self.found.persistent_kinds["<not a tuple>"] += 1
            return Symbol("<persistent id>")
        first = pid[0]
        if type(first) is bytes:
            kind = first.decode("ascii", "replace")
        else:
            kind = first if type(first) is str else short(first)
        self.found.persistent_kinds[kind] += 1
        if kind != "storage" or self.container is None:
            return Symbol(f"<persistent {kind}>")
        type_name = None
        if len(pid) > 1 and type(pid[1]) is Symbol:
            module, _, name = pid[1].name.rpartition(".")
            entry = lookup(module, name)
            if entry is None and name not in STORAGE_DTYPES:
                return Symbol("<persistent storage>")  # an unknown global: judged by its name
            type_name = storage_type(entry) if entry is not None else name
        return declare_storage(self.found.storages, type_name, pid[2:], self.container == "legacy")

    def set_items(self, target: Any, pairs: list[Any]) -> None:
        if type(target) is dict:
            for index in range(0, len(pairs), 2):
                with contextlib.suppress(TypeError):
                    target[pairs[index]] = pairs[index + 1]

    def append_items(self, target: Any, items: list[Any]) -> None:
        if type(target) is list:
            target.extend(items)

    def add_items(self, target: Any, items: list[Any]) -> None:
        return None


def _called(name: str, suffix: str) -> str:
    """The name of a call's result; a result called again keeps its name (``f()()()`` would
    grow by two characters a call: quadratic text from a linear file)."""
    return name if name.endswith(")") else name + suffix
