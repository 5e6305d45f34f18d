"""The one ``sys.meta_path`` alias finder (``numpy-core-names`` and ``removed-names`` use it).

A subclass says, in :meth:`AliasFinder.route`, which target an import name
stands for; the finder answers only when no other finder (``PathFinder``
always asked) finds that name, so an installed module is never shadowed.
While it routes, asks the others or looks for the target, it is switched off
for this thread: the imports that causes never come back to it. An import
never fails because of it: an error there means "not mine".

An ``identical`` route hands importlib the existing target module (no copy,
nothing runs twice; the module keeps its own ``__spec__``); an ``adapter``
route runs the target's source file as the module of the alias name. Each
alias made is forgotten through the :class:`Patcher`: out of ``sys.modules``
and off its parent package (unless the parent had that attribute before).
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # no ``typing`` import at run time (start-up path)
if TYPE_CHECKING:
    from collections.abc import Sequence
    from importlib.abc import Loader
    from importlib.machinery import ModuleSpec
    from types import ModuleType
    from typing import Any, Callable

    from .patching import Patcher

__all__ = ["AliasFinder", "Route", "findable", "parent_findable"]


class Route:
    """Where an alias name leads, and how to answer for it."""

    __slots__ = ("adapter", "gate", "on_use", "shadow", "target")

    def __init__(
        self,
        target: str,
        *,
        adapter: bool = False,
        shadow: bool = False,
        gate: Callable[[], bool] | None = None,
        on_use: Callable[[], None] | None = None,
    ) -> None:
        self.target = target
        self.adapter = adapter  # run the target's file under the alias name
        self.shadow = shadow  # answer even where another finder would (a copy it would make)
        self.gate = gate  # asked with the finder switched off (it may read metadata)
        self.on_use = on_use


def _package_path(name: str) -> list[str] | None:
    """``name.__path__``, from ``sys.modules`` or found with ``PathFinder`` (nothing imported)."""
    from _frozen_importlib_external import PathFinder  # importlib itself costs start-up time

    module = sys.modules.get(name)
    if module is not None:
        found = getattr(module, "__path__", None)
        return list(found) if found is not None else None
    parts = name.split(".")
    spec = PathFinder.find_spec(parts[0])
    for depth in range(1, len(parts)):
        if spec is None or spec.submodule_search_locations is None:
            return None
        locations = list(spec.submodule_search_locations)
        spec = PathFinder.find_spec(".".join(parts[: depth + 1]), locations)
    if spec is None or spec.submodule_search_locations is None:
        return None
    return list(spec.submodule_search_locations)


def parent_findable(fullname: str) -> bool:
    """Whether ``fullname``'s package can be found (true for a top-level name)."""
    return "." not in fullname or _package_path(fullname.rpartition(".")[0]) is not None


def findable(fullname: str, path: Sequence[str] | None = None, skip: object = None) -> bool:
    """Whether a finder other than ``skip`` (``PathFinder`` always asked) finds ``fullname``."""
    from _frozen_importlib_external import PathFinder

    if path is None and "." in fullname:
        path = _package_path(fullname.rpartition(".")[0])
        if path is None:  # no parent package: nothing to shadow (and nothing to provide)
            return False
    for finder in [PathFinder, *sys.meta_path]:
        if finder is skip or not hasattr(finder, "find_spec"):
            continue
        try:
            if finder.find_spec(fullname, path) is not None:
                return True
        except (ImportError, ValueError):
            continue
    return False


class AliasFinder:
    """A ``sys.meta_path`` finder for the names :meth:`route` maps and nothing else finds."""

    def __init__(self, patcher: Patcher) -> None:
        from _thread import _local

        self._patcher = patcher
        self._busy = _local()

    def route(self, fullname: str) -> Route | None:
        """The route for ``fullname``, or ``None``: not an alias (subclasses say; asked for
        every import, so cheap and importing nothing)."""
        raise NotImplementedError

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        route = self.route(fullname)
        if route is None or getattr(self._busy, "on", False):
            return None
        self._busy.on = True
        try:
            if route.gate is not None and not route.gate():
                return None
            if not route.shadow and findable(fullname, path, skip=self):
                return None
            return _spec_for(fullname, route, self._patcher)
        except Exception:  # an import must never fail because of compatshim
            return None
        finally:
            self._busy.on = False


def _spec_for(fullname: str, route: Route, patcher: Patcher) -> ModuleSpec | None:
    from importlib.util import find_spec

    if not route.adapter:
        if route.target not in sys.modules and find_spec(route.target) is None:
            return None  # the target is missing too: provide nothing
        from importlib.machinery import ModuleSpec

        return ModuleSpec(fullname, _Loader(fullname, route, patcher, None))  # type: ignore[arg-type]
    source = find_spec(route.target)
    if source is None or source.origin is None:
        return None
    from importlib.machinery import SourceFileLoader
    from importlib.util import spec_from_file_location

    loader = _Loader(fullname, route, patcher, SourceFileLoader(fullname, source.origin))
    return spec_from_file_location(fullname, source.origin, loader=loader)  # type: ignore[arg-type]


class _Loader:
    """Hands importlib the target module (identical) or runs its file (adapter)."""

    def __init__(self, name: str, route: Route, patcher: Patcher, real: Loader | None) -> None:
        self._name = name
        self._route = route
        self._patcher = patcher
        self._real = real
        self._spec: Any = None

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        if self._real is not None:
            return self._real.create_module(spec)
        from importlib import import_module

        module = import_module(self._route.target)
        self._spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        """Runs the adapter file or, for an identical alias, nothing; records the undo."""
        parent_name, _, child = self._name.rpartition(".")
        parent = sys.modules.get(parent_name) if parent_name else None
        had_attribute = parent is not None and child in vars(parent)
        if self._real is not None:
            self._real.exec_module(module)
        else:
            module.__spec__ = self._spec  # importlib wrote the alias spec over the real one
        self._patcher.on_revert(_forget(self._name, module, parent, child, had_attribute))
        if self._route.on_use is not None:
            self._route.on_use()


def _forget(
    fullname: str, module: ModuleType, parent: ModuleType | None, child: str, had_attribute: bool
) -> Callable[[], None]:
    def undo() -> None:
        if sys.modules.get(fullname) is module:
            del sys.modules[fullname]
        if parent is not None and not had_attribute and vars(parent).get(child) is module:
            delattr(parent, child)

    return undo
