"""Reversible changes: every patch makes its edits through a :class:`Patcher`.

The patcher records exactly what was there before (including "nothing was
there"), so reverting restores the original objects, not equal copies. It
restores only what still holds compatshim's own object: a library that replaced
it afterwards (wrapping ``torch.load`` over compatshim's wrapper, say) keeps its
object. Wrappers that check :attr:`Patcher.live` (or their patch's own switch)
then pass calls through where such a library still holds them; :func:`wrapping`
tells a patch what to wrap when a leftover of ours is back in place.
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
        self._set: list[Any] = []  # every object set: our wrappers are known by identity
        #: False once reverted; a wrapper checks it, so that one another library still
        #: holds (it wrapped ours) passes calls through
        self.live = True

    def setattr(self, obj: Any, name: str, value: Any) -> None:
        """Set ``obj.name`` (looking only at ``obj.__dict__`` for the original)."""
        original = vars(obj).get(name, _MISSING) if hasattr(obj, "__dict__") else _MISSING
        setattr(obj, name, value)
        self._set.append(value)

        def undo() -> None:
            if _current(obj, name) is not value:
                return  # replaced after compatshim: the newer object stays
            if original is _MISSING:
                delattr(obj, name)
            else:
                setattr(obj, name, original)

        self._undo.append(undo)

    def setitem(self, mapping: MutableMapping[Any, Any], key: Any, value: Any) -> None:
        original = mapping.get(key, _MISSING)
        mapping[key] = value
        self._set.append(value)

        def undo() -> None:
            if mapping.get(key, _MISSING) is not value:
                return  # replaced after compatshim: the newer object stays
            if original is _MISSING:
                mapping.pop(key, None)
            else:
                mapping[key] = original

        self._undo.append(undo)

    def on_revert(self, undo: Callable[[], None]) -> None:
        """Register any other undo step."""
        self._undo.append(undo)

    def revert(self) -> None:
        self.live = False
        while self._undo:
            self._undo.pop()()

    def __bool__(self) -> bool:
        return bool(self._undo)

    def made(self, obj: Any) -> bool:
        """Whether this patcher set ``obj`` (by identity: ``functools.wraps`` copies our
        marks onto another library's wrapper of ours, which must not pass for ours)."""
        return any(value is obj for value in self._set)


def _current(obj: Any, name: str) -> Any:
    if hasattr(obj, "__dict__"):
        return vars(obj).get(name, _MISSING)
    return getattr(obj, name, _MISSING)


def _maker(function: Any) -> Patcher | None:
    """The patcher that set ``function``, a wrapper marked with it; None for anything else."""
    patcher = getattr(function, "__compatshim_patcher__", None)
    return patcher if isinstance(patcher, Patcher) and patcher.made(function) else None


_DEPTH = 16  # how far down ``__wrapped__`` a wrapper of ours in force is looked for


def in_force(function: Any) -> bool:
    """Whether ``function`` is a wrapper of ours whose patch is not reverted, or another
    library's wrapper over one (``functools.wraps`` sets ``__wrapped__``, followed a few
    deep): calls through it still reach ours, so the fix is in force there."""
    seen: list[Any] = []
    for _ in range(_DEPTH):
        patcher = _maker(function)
        if patcher is not None and patcher.live:
            return True
        seen.append(function)
        try:
            function = getattr(function, "__wrapped__", None)
        except Exception:  # an odd object's __getattr__: nothing of ours to find
            return False
        if function is None or any(function is earlier for earlier in seen):
            return False
    return False


def wrapping(current: Any) -> Any:
    """What a patch should wrap in place of ``current``: ``current`` itself; for a wrapper of
    ours whose patch was reverted while another library held it (it passes calls through,
    and that library has since put it back), the function it wraps; None for a wrapper of
    ours in force, or another library's wrapper over one (:func:`in_force`: a patch applied
    twice by hand, a library wrapping in between; wrapping again would nest)."""
    if in_force(current):
        return None
    patcher = _maker(current)
    return current if patcher is None else current.__compatshim_original__


def ours(function: F, original: Any, patcher: Patcher) -> F:
    """``function``, a wrapper of ``original`` set by ``patcher``, marked so that
    :func:`in_force` and :func:`wrapping` know it. The wrapper itself checks
    ``patcher.live`` and calls ``original`` once reverted."""
    return mark(function, __compatshim_original__=original, __compatshim_patcher__=patcher)


def mark(function: F, **attributes: object) -> F:
    """``function`` with ``attributes`` set (``__wrapped__``, compatshim's own marks): a
    wrapper's bookkeeping in one typed place instead of an attribute assignment mypy refuses."""
    for name, value in attributes.items():
        setattr(function, name, value)
    return function
