"""Missing modules (``pkg_resources``, ``torch._six``, ...) provided through the import system.

:class:`RemovedNamesFinder` (the mechanism is :mod:`compatshim._engine.alias_finder`)
sits at the *end* of ``sys.meta_path``, so Python asks it only after every
other finder found nothing; it asks them again itself before answering, and
answers only for a table entry whose release gate holds. An installed module
is therefore never shadowed: with setuptools 81 installed, ``import
pkg_resources`` is setuptools' own, untouched.

An ``identical`` entry hands importlib the existing target module; an
``adapter`` entry runs compatshim's file for it under the old name
(``pkg_resources.__name__ == "pkg_resources"``). Either way the import is
recorded as a use. Uninstalling removes the finder and every module it
provided from ``sys.modules`` and from its parent package.
"""

from __future__ import annotations

from .._engine import alias_finder
from .._engine.alias_finder import Route, findable, parent_findable
from . import needed, note_use
from .table import MODULE_ALIASES

TYPE_CHECKING = False  # no ``typing`` import at run time (start-up path)
if TYPE_CHECKING:
    from .._engine.patching import Patcher

__all__ = ["RemovedNamesFinder", "findable", "parent_findable"]


class RemovedNamesFinder(alias_finder.AliasFinder):
    """A ``sys.meta_path`` finder, last in line, for the table's missing modules."""

    def __init__(self, patcher: Patcher) -> None:
        super().__init__(patcher)
        self._by_name = {alias.name: alias for alias in MODULE_ALIASES}

    def route(self, fullname: str) -> Route | None:
        alias = self._by_name.get(fullname)
        if alias is None:
            return None
        return Route(
            alias.target,
            adapter=alias.kind != "identical",
            gate=lambda: needed(alias),
            on_use=lambda: note_use(alias),
        )
