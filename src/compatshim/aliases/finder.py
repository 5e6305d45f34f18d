"""Missing modules (``pkg_resources``, ``torch._six``, ...) provided through the import system.

:class:`AliasFinder` sits at the *end* of ``sys.meta_path``, so Python asks it
only after every other finder found nothing; it asks them again itself
(``importlib.machinery.PathFinder`` included) before answering, and answers
only for a table entry whose release gate holds. An installed module is
therefore never shadowed: with setuptools 81 installed, ``import pkg_resources``
is setuptools' own, untouched.

An ``identical`` entry hands importlib the existing target module (no copy,
nothing runs twice; its own ``__spec__`` is kept). An ``adapter`` entry runs
compatshim's file for it under the old name (``pkg_resources.__name__ ==
"pkg_resources"``). Either way the import is recorded as a use. Uninstalling
removes the finder and every module it provided from ``sys.modules`` and from
its parent package.
"""

from __future__ import annotations

import sys

from . import needed, note_use
from .table import MODULE_ALIASES

TYPE_CHECKING = False  # no ``typing`` import at run time (start-up path)
if TYPE_CHECKING:
    from collections.abc import Sequence
    from importlib.abc import Loader
    from importlib.machinery import ModuleSpec
    from types import ModuleType
    from typing import Any, Callable

    from .._engine.patching import Patcher
    from .table import Alias

__all__ = ["AliasFinder", "findable"]


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


class _IdenticalLoader:
    """Hands importlib the existing target module; keeps that module's own spec."""

    def __init__(self, alias: Alias, patcher: Patcher) -> None:
        self._alias = alias
        self._patcher = patcher
        self._spec: Any = None

    def create_module(self, spec: ModuleSpec) -> ModuleType:
        from importlib import import_module

        module = import_module(self._alias.target)
        self._spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        """Runs nothing: restores the target's spec, records the use and how to forget it."""
        module.__spec__ = self._spec  # importlib wrote the alias spec over the real one
        self._patcher.on_revert(_forget(self._alias.name, module))
        note_use(self._alias)


class _AdapterLoader:
    """Runs compatshim's adapter file as the module of the old name."""

    def __init__(self, alias: Alias, real: Loader, patcher: Patcher) -> None:
        self._alias = alias
        self._real = real
        self._patcher = patcher

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return self._real.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._real.exec_module(module)
        self._patcher.on_revert(_forget(self._alias.name, module))
        note_use(self._alias)


def _forget(fullname: str, module: ModuleType) -> Callable[[], None]:
    parent_name, _, child = fullname.rpartition(".")

    def undo() -> None:
        if sys.modules.get(fullname) is module:
            del sys.modules[fullname]
        parent = sys.modules.get(parent_name) if parent_name else None
        if parent is not None and vars(parent).get(child) is module:
            delattr(parent, child)

    return undo


class AliasFinder:
    """A ``sys.meta_path`` finder, last in line, for the table's missing modules."""

    def __init__(self, patcher: Patcher) -> None:
        from _thread import _local

        self._patcher = patcher
        self._by_name = {alias.name: alias for alias in MODULE_ALIASES}
        self._busy = _local()

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        alias = self._by_name.get(fullname)
        if alias is None or getattr(self._busy, "on", False):
            return None
        self._busy.on = True
        try:
            if not needed(alias) or findable(fullname, path, skip=self):
                return None
            return _spec_for(alias, self._patcher)
        except Exception:  # an import must never fail because of compatshim
            return None
        finally:
            self._busy.on = False

    def provides(self, fullname: str) -> bool:
        """Whether an import of ``fullname`` would come from this finder now."""
        alias = self._by_name.get(fullname)
        return alias is not None and needed(alias) and not findable(fullname, skip=self)


def _spec_for(alias: Alias, patcher: Patcher) -> ModuleSpec | None:
    from importlib.machinery import ModuleSpec, SourceFileLoader
    from importlib.util import find_spec, spec_from_file_location

    if alias.kind == "identical":
        if find_spec(alias.target) is None:  # the target is missing too: provide nothing
            return None
        return ModuleSpec(alias.name, _IdenticalLoader(alias, patcher))  # type: ignore[arg-type]
    source = find_spec(alias.target)
    if source is None or source.origin is None:
        return None
    real = SourceFileLoader(alias.name, source.origin)
    loader = _AdapterLoader(alias, real, patcher)
    return spec_from_file_location(alias.name, source.origin, loader=loader)  # type: ignore[arg-type]
