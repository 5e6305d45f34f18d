"""Missing attributes (``numpy.row_stack``, ``torch.distributed.all_gather_single``, ...).

Applied by the ``removed-names`` patch when the module is imported (the
registry's post-import hooks; never eagerly). The names are not written into
the module: a module-level ``__getattr__`` (PEP 562) answers for them, so
every first read is recorded as a use, ``from numpy import row_stack`` works,
and the module's own ``__dict__`` is untouched. A module that has its own
``__getattr__`` (numpy) keeps it for every other name: ours is a wrapper that
delegates. ``hasattr(np, "row_stack")`` is True while armed, as on the
releases that had it.

An entry is provided only while the module neither has the name in its
``__dict__`` nor answers for it through its own ``__getattr__``; its target
(``numpy.vstack``) must exist. Uninstalling puts the original ``__getattr__``
back (or removes ours), unless a library set its own after compatshim: that one stays,
and ours under it answers for no entry.
"""

from __future__ import annotations

from . import needed, note_use, resolve
from .table import entries_for

TYPE_CHECKING = False  # no ``typing`` import at run time (start-up path)
if TYPE_CHECKING:
    from types import ModuleType
    from typing import Any

    from .._engine.patching import Patcher
    from .table import Alias

__all__ = ["apply", "missing", "provided"]


class _AliasGetattr:
    """The module ``__getattr__``: our entries first, then the module's own, if any.

    Once its patch is reverted (``patcher.live`` False) it answers for no entry: a library
    that set its own ``__getattr__`` over it after compatshim keeps that one, and may call it.
    """

    def __init__(
        self,
        module_name: str,
        entries: dict[str, tuple[Alias, Any]],
        original: Any,
        patcher: Patcher,
    ) -> None:
        self.module_name = module_name
        self.entries = entries
        self.original = original
        self.patcher = patcher

    def __call__(self, name: str) -> Any:
        found = self.entries.get(name) if self.patcher.live else None
        if found is not None:
            alias, value = found
            note_use(alias)
            return value
        if self.original is not None:
            return self.original(name)
        raise AttributeError(f"module {self.module_name!r} has no attribute {name!r}")


def _answers(module: ModuleType, name: str) -> bool:
    """Whether ``module`` has ``name`` itself (its ``__dict__`` or its own ``__getattr__``)."""
    own = vars(module)
    if name in own:
        return True
    original = own.get("__getattr__")
    if isinstance(original, _AliasGetattr):
        if original.patcher.live and name in original.entries:  # provided by us: present
            return True
        original = original.original
    if original is None:
        return False
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # numpy's __getattr__ warns for reserved names
        try:
            original(name)
        except AttributeError:
            return False
        except Exception:  # answers, though badly: it is the module's name, not ours to give
            return True
    return True


def missing(module: ModuleType) -> dict[str, tuple[Alias, Any]]:
    """The entries for ``module`` to provide now: needed, absent, target present."""
    found: dict[str, tuple[Alias, Any]] = {}
    for alias in entries_for(module.__name__):
        if not needed(alias) or _answers(module, alias.attribute):
            continue
        try:
            value = resolve(alias.target)
        except (ImportError, AttributeError):  # the target is missing too (e.g. torch 2.1)
            continue
        found[alias.attribute] = (alias, value)
    return found


def provided(module: ModuleType) -> list[str]:
    """The names our ``__getattr__`` answers for in ``module`` now."""
    hook = vars(module).get("__getattr__")
    return sorted(hook.entries) if isinstance(hook, _AliasGetattr) and hook.patcher.live else []


def apply(module: ModuleType, patcher: Patcher) -> None:
    """Install the ``__getattr__`` for every missing entry of ``module``."""
    entries = missing(module)
    if not entries:
        return
    current = vars(module).get("__getattr__")
    if isinstance(current, _AliasGetattr):
        if current.patcher.live:  # already armed (installed twice)
            return
        current = current.original  # ours, reverted, put back by a library: not wrapped again
    hook = _AliasGetattr(module.__name__, entries, current, patcher)
    patcher.setattr(module, "__getattr__", hook)
