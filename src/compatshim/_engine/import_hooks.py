"""Post-import hooks: run a callback once a module is imported, never import it early.

Modelled on ``wrapt.when_imported``: a finder at the front of ``sys.meta_path``
watches a few names (each target and its parent packages). For a watched name
it lets the other finders find the real spec, then wraps the loader so that,
right after the module body has run, every callback whose target is now
*ready* is called. The module's own ``__loader__``/``__spec__.loader`` are put
back to the real loader before its body runs, so nothing downstream can tell a
hook was there.

Ready means the target and every parent package have finished executing:
``torch.distributed`` is imported half-way through ``torch/__init__.py``, and
a callback that ran then would meet a half-built ``torch``. A callback for a
module that is still initialising is deferred until the last package of its
chain finishes (that package is watched too), or, when the import began before
any watching did, until the next import anywhere or the next registration.

Callbacks run with no lock held: the lock here only guards the tables, so a
callback may import, and another thread may register or discard hooks, without
either waiting on the other. Each callback is claimed before it runs, so it is
called once per module object even when threads race.
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
_claimed: dict[str, tuple[object, set[int]]] = {}  # target -> (module object, callback ids run)
_hooked: frozenset[str] = frozenset()  # targets and their parent packages
_deferred = False  # a target's chain is initialising where no hooked loader will report its end
_executing: set[str] = set()  # modules whose body runs under a hooked loader right now
_finding = _local()
_finishing = _local()  # .name: the module whose hooked import this thread is completing


_chains: dict[str, tuple[str, ...]] = {}


def _chain(name: str) -> tuple[str, ...]:
    """``a.b.c`` -> ``("a", "a.b", "a.b.c")`` (memoised: asked after every hooked import)."""
    chain = _chains.get(name)
    if chain is None:
        parts = name.split(".")
        chain = _chains[name] = tuple(".".join(parts[: i + 1]) for i in range(len(parts)))
    return chain


def _initialising(module: object) -> bool:
    spec = getattr(module, "__spec__", None)
    return bool(getattr(spec, "_initializing", False))


def half_built(exc: BaseException | None) -> str | None:
    """The module, still initialising, that ``exc`` (or its cause) met half-built, if any.

    Python's answer when two threads' imports would deadlock is a half-built module:
    ``ImportError.name`` or ``AttributeError.obj`` (3.10+) names it; the caller may
    wait and retry while that module is initialising. An ``AttributeError`` whose
    module has finished since and now holds the attribute it lacked (``.name``) met
    it half-built too: the other import ended between the error and this check.
    """
    for _ in range(8):  # the cause chain, bounded
        if exc is None:
            return None
        name = exc.name if isinstance(exc, ImportError) else None
        if isinstance(exc, AttributeError):
            obj = getattr(exc, "obj", None)
            name = getattr(obj, "__name__", None)
            attr = getattr(exc, "name", None)
            finished = type(name) is str and sys.modules.get(name) is obj
            if finished and type(attr) is str and attr in getattr(obj, "__dict__", {}):
                return name
        if type(name) is str and _initialising(sys.modules.get(name)):
            return name
        exc = exc.__cause__ or exc.__context__
    return None


def finishing() -> str | None:
    """The module whose import this thread is completing (callbacks run right after its
    body, before its importer sees it), else None: a callback then runs for a module
    imported before it was registered, which other code may already hold parts of."""
    return getattr(_finishing, "name", None)


def ready(name: str) -> ModuleType | None:
    """``sys.modules[name]`` once it and all its parents have finished importing, else None."""
    for prefix in _chain(name):
        module = sys.modules.get(prefix)
        if module is None or _initialising(module):
            return None
    return sys.modules.get(name)


def _unreported(name: str) -> bool:
    """Whether ``name`` is imported but part of its chain initialises outside a hooked loader."""
    if name not in sys.modules:
        return False
    return any(
        prefix not in _executing and _initialising(sys.modules.get(prefix))
        for prefix in _chain(name)
    )


def _claim_due() -> list[tuple[Callback, ModuleType]]:
    """Every (callback, module) that is ready and not yet called, marked as called."""
    global _deferred
    due: list[tuple[Callback, ModuleType]] = []
    with _lock:
        waiting = False
        for name, callbacks in _callbacks.items():
            module = ready(name)
            if module is None:
                waiting = waiting or _unreported(name)
                continue
            owner, done = _claimed.get(name, (None, set()))
            if owner is not module:
                done = set()
                _claimed[name] = (module, done)
            for callback in callbacks:
                if id(callback) not in done:
                    done.add(id(callback))
                    due.append((callback, module))
        _deferred = waiting
    return due


def run_due() -> None:
    """Call every callback whose target is ready and that has not run for it yet."""
    for callback, module in _claim_due():
        try:  # noqa: SIM105 (contextlib would cost start-up time)
            callback(module)
        except Exception:  # callbacks guard themselves; an import must never see this
            pass


class _HookedLoader:
    """Delegates to the real loader; runs due callbacks after the module body."""

    def __init__(self, real: Loader) -> None:
        self._real = real

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return self._real.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        name = module.__name__
        module.__loader__ = self._real
        spec = module.__spec__
        if spec is not None:
            spec.loader = self._real
        _executing.add(name)
        try:
            self._real.exec_module(module)
        finally:
            _executing.discard(name)
        if spec is not None:
            # importlib clears _initializing only after exec_module returns; the body is done.
            spec._initializing = False  # type: ignore[attr-defined]
        outer = getattr(_finishing, "name", None)
        _finishing.name = name
        try:
            run_due()
        finally:
            _finishing.name = outer

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
        if _deferred:
            run_due()
        if fullname not in _hooked:
            return None
        active: set[str] = getattr(_finding, "names", set())
        if fullname in active:
            return None
        active.add(fullname)
        _finding.names = active
        try:
            for finder in list(sys.meta_path):
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
        spec.loader = _HookedLoader(loader)  # type: ignore[assignment]
        return spec


_watcher = _Watcher()


def _rehook() -> None:
    global _hooked
    _hooked = frozenset(prefix for name in _callbacks for prefix in _chain(name))
    if _callbacks and _watcher not in sys.meta_path:
        sys.meta_path.insert(0, _watcher)
    elif not _callbacks and _watcher in sys.meta_path:
        sys.meta_path.remove(_watcher)


def _wait_for_other_threads(name: str) -> None:
    """Block until another thread finishes importing ``name``'s chain (imports nothing new).

    ``import_module`` of a name already in ``sys.modules`` only waits on its
    import lock; in the importing thread itself, or when waiting would deadlock,
    it returns the half-built module at once, and the callback stays deferred.
    """
    for prefix in _chain(name):
        module = sys.modules.get(prefix)
        if module is None:
            return
        if _initialising(module):
            from importlib import import_module  # only here: importlib costs start-up time

            try:
                import_module(prefix)
            except Exception:  # importlib's deadlock guard, or the import failed there
                return


def register(name: str, callback: Callback) -> None:
    """Watch ``name`` for ``callback`` without calling anything yet (see :func:`settle`)."""
    with _lock:
        callbacks = _callbacks.setdefault(name, [])
        if callback not in callbacks:
            callbacks.append(callback)
        _rehook()


def settle(names: Sequence[str] = ()) -> None:
    """Wait for other threads importing ``names``, then call every due callback."""
    for name in names:
        if name in sys.modules:
            _wait_for_other_threads(name)
    run_due()


def when_imported(name: str, callback: Callback) -> None:
    """Call ``callback(module)`` once ``name`` is imported (at once if it already is)."""
    register(name, callback)
    settle([name])


def discard(name: str, callback: Callback) -> None:
    """Stop calling ``callback`` for ``name``; drop the finder when nothing is watched."""
    with _lock:
        callbacks = _callbacks.get(name)
        if callbacks and callback in callbacks:
            callbacks.remove(callback)
            owner_done = _claimed.get(name)
            if owner_done is not None:
                owner_done[1].discard(id(callback))
        if callbacks is not None and not callbacks:
            del _callbacks[name]
            _claimed.pop(name, None)
        _rehook()


def watched() -> list[str]:
    with _lock:
        return sorted(_callbacks)
