"""Removed and renamed names, provided where they are missing (the ``removed-names`` patch).

:mod:`.table` lists every entry; :mod:`.finder` provides missing modules,
:mod:`.attributes` missing attributes, :mod:`.collectives` the torch.distributed
adapters (``gather_single``, ``weights_only=`` on the object collectives). All
are armed by ``compatshim.install()`` (or ``COMPATSHIM_AUTO=1``) through the
``removed-names`` patch, and all undo everything on ``compatshim.uninstall()``.
``compatshim.status()`` lists the entries this process used under that patch's
``used``.
"""

from __future__ import annotations

from .table import TABLE, Alias

__all__ = ["PATCH_NAME", "TABLE", "Alias", "needed", "resolve", "used"]

PATCH_NAME = "removed-names"


def needed(alias: Alias) -> bool:
    """Whether the installed release of ``alias.distribution`` is one that lacks the name."""
    from .._engine.versions import contains, installed_version

    if not isinstance(alias, Alias):  # else an AttributeError that names no argument
        from .._text import short

        raise TypeError(f"alias: expected a compatshim.aliases.Alias, got {short(alias)}")
    version = installed_version(alias.distribution)
    if version is None:
        return alias.when_not_installed
    return contains(alias.needs, version) is True  # unreadable: provide nothing


def resolve(dotted: str) -> object:
    """The object at ``module.attr`` (the module is imported: it is the target's own package)."""
    import sys
    from importlib import import_module

    from .._text import short

    if not isinstance(dotted, str):  # else an AttributeError that names no argument
        raise TypeError(f"dotted: expected a name such as 'os.path.join', got {short(dotted)}")
    module_name, _, attribute = dotted.rpartition(".")
    if not module_name or not attribute:  # else import_module's "Empty module name"
        raise ValueError(f"dotted: expected a name such as 'os.path.join', got {short(dotted)}")
    module = sys.modules.get(module_name) or import_module(module_name)
    return getattr(module, attribute)


def note_use(alias: Alias) -> None:
    from .._engine import decisions

    decisions.note_use(PATCH_NAME, alias.name)


def used() -> list[str]:
    """The entries this process has used so far (also in ``status()``)."""
    from .._engine import decisions

    return decisions.used(PATCH_NAME)
