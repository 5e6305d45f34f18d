"""Post-import hooks: run a callback when a module is imported, never import it early.

Modelled on ``wrapt.when_imported``: a finder at the front of ``sys.meta_path``
watches a small set of names. For a watched name it lets the other finders find
the real spec, then wraps the loader so the callbacks run right after the
module body has executed. The module's own ``__loader__``/``__spec__.loader``
are put back to the real loader before its body runs, so nothing downstream can
tell a hook was there.
"""

from __future__ import annotations

import sys
from _thread import RLock, _local

TYPE_CHECKING = False  # no ``typing`` import at run time: this module is on the start-up path
if TYPE_CHECKING:
    from importlib.abc import Loader
    from importlib.machinery import ModuleSpec
    from types import ModuleType
    from typing import Callable, Sequence

    Callback = Callable[[ModuleType], None]

_lock = RLock()
_callbacks: dict[str, list[Callback]] = {}
_finding = _local()


class _HookedLoader:
    """Delegates to the real loader; runs the callbacks after the module body."""

    def __init__(self, name: str, real: Loader) -> None:
        self._name = name
        self._real = real

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return self._real.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = self._real
        if module.__spec__ is not None:
            module.__spec__.loader = self._real
        self._real.exec_module(module)
        _fire(self._name, module)

    def __getattr__(self, item: str) -> object:
        return getattr(self._real, item)


class _Watcher:
    """A ``sys.meta_path`` finder that only ever answers for watched names."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> ModuleSpec | None:
        if fullname not in _callbacks:
            return None
        active: set[str] = getattr(_finding, "names", set())
        if fullname in active:
            return None
        active.add(fullname)
        _finding.names = active
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            active.discard(fullname)
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        spec.loader = _HookedLoader(fullname, loader)  # type: ignore[assignment]
        return spec


_watcher = _Watcher()


def _fire(name: str, module: ModuleType) -> None:
    with _lock:
        callbacks = list(_callbacks.get(name, ()))
    for callback in callbacks:
        callback(module)


def when_imported(name: str, callback: Callback) -> None:
    """Call ``callback(module)`` once ``name`` is imported (at once if it already is)."""
    with _lock:
        _callbacks.setdefault(name, [])
        if callback not in _callbacks[name]:
            _callbacks[name].append(callback)
        if _watcher not in sys.meta_path:
            sys.meta_path.insert(0, _watcher)
        module = sys.modules.get(name)
    if module is not None:
        callback(module)


def discard(name: str, callback: Callback) -> None:
    """Stop calling ``callback`` for ``name``; drop the finder when nothing is watched."""
    with _lock:
        callbacks = _callbacks.get(name)
        if callbacks and callback in callbacks:
            callbacks.remove(callback)
        if callbacks is not None and not callbacks:
            del _callbacks[name]
        if not _callbacks and _watcher in sys.meta_path:
            sys.meta_path.remove(_watcher)


def watched() -> list[str]:
    with _lock:
        return sorted(_callbacks)
