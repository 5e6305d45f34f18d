"""Patch ``removed-names``: the alias table of :mod:`compatshim.aliases`, armed as one patch.

What breaks
    Code written for older releases imports or reads names that newer ones
    removed: ``import pkg_resources`` under setuptools >= 82 (``import lightning``
    on Lightning <= 2.3.3), ``np.row_stack`` on numpy 2.5, ``torch._six``,
    ``torchvision.transforms.functional_tensor``, ``np.float``; and code
    written for newer torch calls ``dist.all_gather_single``,
    ``dist.set_timeout``, ``dist.gather_single`` or passes ``weights_only=`` to
    an object collective on releases that predate them.

Which versions
    Each entry of :data:`compatshim.aliases.table.TABLE` names the releases
    that lack it; the patch itself gates nothing (``requires=""``).

How it is detected
    Target ``compatshim`` (always imported, so it is decided at
    ``install()``): a table module that is needed and that no finder can
    find. Targets ``numpy`` and ``torch.distributed`` (when
    imported): a needed attribute the module does not have.

The fix
    :class:`~compatshim.aliases.finder.RemovedNamesFinder` appended to
    ``sys.meta_path``; a module ``__getattr__`` for the attributes
    (:mod:`compatshim.aliases.attributes`); the object collectives of
    ``torch.distributed`` and ``distributed_c10d`` wrapped to take
    ``weights_only=`` (:mod:`compatshim.aliases.collectives`). Silent; every use
    is recorded and listed in ``status()`` (``used``).

The revert
    The finder leaves ``sys.meta_path``, the modules it provided leave
    ``sys.modules`` and their parent package, the modules' ``__getattr__`` and
    the wrapped collectives are restored, all through the :class:`Patcher`.
    A collective or ``__getattr__`` that a library wrapped after compatshim
    keeps that library's wrapper; compatshim's under it then acts as torch's.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # no ``typing`` import at run time (start-up path)
if TYPE_CHECKING:
    from types import ModuleType

    from .._engine.patching import Patcher

__all__ = ["apply", "probe"]

_MODULES_TARGET = "compatshim"  # always imported: module aliases are decided at install()


def _finder() -> object | None:
    from ..aliases.finder import RemovedNamesFinder

    return next((f for f in sys.meta_path if isinstance(f, RemovedNamesFinder)), None)


def _modules_missing() -> list[str]:
    """Table modules whose package is there and which no finder finds (no version read:
    this runs inside ``install()``, at start-up; the finder reads versions on demand)."""
    from ..aliases.finder import findable, parent_findable
    from ..aliases.table import MODULE_ALIASES

    return [
        alias.name
        for alias in MODULE_ALIASES
        if parent_findable(alias.name) and not findable(alias.name, skip=_finder())
    ]


def probe(module: ModuleType) -> bool:
    """True while a needed name of this target is missing."""
    if module.__name__ == _MODULES_TARGET:
        return _finder() is None and bool(_modules_missing())
    from ..aliases.attributes import missing

    if missing(module):
        return True
    if module.__name__ == "torch.distributed":
        from ..aliases.collectives import keyword_missing

        return bool(keyword_missing(module))
    return False


def apply(module: ModuleType, patcher: Patcher) -> None:
    if module.__name__ == _MODULES_TARGET:
        from ..aliases.finder import RemovedNamesFinder

        finder = RemovedNamesFinder(patcher)
        sys.meta_path.append(finder)  # last: every other finder is asked first
        patcher.on_revert(lambda: sys.meta_path.remove(finder))
        return
    from ..aliases.attributes import apply as provide

    provide(module, patcher)
    if module.__name__ == "torch.distributed":
        from ..aliases.collectives import apply_weights_only

        apply_weights_only(module, patcher)
