"""Every known master-param layout: one module per layout in this package, found by listing it.

Each module defines ``LAYOUT = Layout(...)`` (see ``_layout``) and says in
its docstring which releases store the map that way. A ColossalAI release
that moves the map again is one new module here: the resolver, the
``UnknownLayoutError`` message and ``compatshim doctor`` all read ``LAYOUTS``.

The package is listed (``pkgutil``) rather than imported by a hand-kept list
so that the new module is the only edit; the order is each layout's own
``precedence``, not the order of files. Modules whose names start with ``_``
(``_layout``, the declaration itself) are not layouts.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

from ._layout import Layout

__all__ = ["LAYOUTS", "Layout", "detect"]


def _discover() -> tuple[Layout, ...]:
    found: list[Layout] = []
    for module_info in pkgutil.iter_modules(__path__):
        if module_info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{module_info.name}")
        layout = getattr(module, "LAYOUT", None)
        if not isinstance(layout, Layout):
            raise TypeError(f"{module.__name__} must define LAYOUT = Layout(...)")
        found.append(layout)
    return tuple(sorted(found, key=lambda layout: (layout.precedence, layout.name)))


LAYOUTS: tuple[Layout, ...] = _discover()
"""Every layout, in the order the resolver tries them."""


def detect(optimizer: Any) -> Layout | None:
    """The first layout that recognises ``optimizer`` itself (no unwrapping)."""
    for layout in LAYOUTS:
        try:
            if layout.matches(optimizer):
                return layout
        except Exception:  # a probe must never break on a foreign object
            continue
    return None
