"""Reversible changes: every patch makes its edits through a :class:`Patcher`.

The patcher records exactly what was there before (including "nothing was
there"), so reverting restores the original objects, not equal copies.
"""

from __future__ import annotations

TYPE_CHECKING = False  # no ``typing`` import at run time (start-up path)
if TYPE_CHECKING:
    from typing import Any, Callable, MutableMapping, TypeVar

    F = TypeVar("F", bound=Callable[..., Any])

_MISSING: Any = object()


class Patcher:
    """Records attribute and mapping edits so they can be undone in reverse order."""

    def __init__(self) -> None:
        self._undo: list[Callable[[], None]] = []

    def setattr(self, obj: Any, name: str, value: Any) -> None:
        """Set ``obj.name`` (looking only at ``obj.__dict__`` for the original)."""
        original = vars(obj).get(name, _MISSING) if hasattr(obj, "__dict__") else _MISSING
        setattr(obj, name, value)

        def undo() -> None:
            if original is _MISSING:
                delattr(obj, name)
            else:
                setattr(obj, name, original)

        self._undo.append(undo)

    def setitem(self, mapping: MutableMapping[Any, Any], key: Any, value: Any) -> None:
        original = mapping.get(key, _MISSING)
        mapping[key] = value

        def undo() -> None:
            if original is _MISSING:
                mapping.pop(key, None)
            else:
                mapping[key] = original

        self._undo.append(undo)

    def on_revert(self, undo: Callable[[], None]) -> None:
        """Register any other undo step."""
        self._undo.append(undo)

    def revert(self) -> None:
        while self._undo:
            self._undo.pop()()

    def __bool__(self) -> bool:
        return bool(self._undo)


def mark(function: F, **attributes: object) -> F:
    """``function`` with ``attributes`` set (``__wrapped__``, compatshim's own marks): a
    wrapper's bookkeeping in one typed place instead of an attribute assignment mypy refuses."""
    for name, value in attributes.items():
        setattr(function, name, value)
    return function
