"""Lightning Fabric: ranks out of step hang silently (Lightning issue 20536).

What breaks: when ranks stop doing the same thing - ``launch()`` inside an
object only the main process builds, ``setup_module`` called on one rank only,
"am I distributed?" decided from ``WORLD_SIZE`` before ``launch()`` - Fabric
blocks forever in a collective (DDP's parameter check, a barrier, the
process-group rendezvous) until torch's 30-minute timeout, printing nothing.
Ranks that build different shapes fail at once, with a cryptic DDP message.

Versions: measured on lightning 2.4.0, 2.5.6 and 2.6.6 (module
``lightning.fabric``) and the standalone lightning-fabric 2.6.6 (module
``lightning_fabric``); nothing in Fabric guards against it, so newer releases
are patched as long as the probe finds the unguarded methods.

Detection: ``Fabric`` has no desync guard of its own; the probe checks that its
methods are still the unguarded originals (and that the methods this fix wraps
exist, else it raises, naming the version and what it looked for).

Fix: ``launch``, ``setup``, ``setup_module``, ``setup_dataloaders``,
``barrier``, ``broadcast``, ``all_reduce``, ``all_gather``, ``save`` and
``load`` leave an in-memory breadcrumb (call site, a few frames); the setup
calls and the end of ``launch()`` meet in :func:`compatshim.dist.sync_point`,
with the module's parameters compared across ranks. In a run of 2+ ranks the
monitor (:mod:`compatshim.desync`) publishes the breadcrumbs, watches the child
ranks the launcher starts (:mod:`._fabric_launcher`), and turns a stuck or
abandoned wait into a :class:`compatshim.dist.DesyncError` report within
``COMPATSHIM_DESYNC_TIMEOUT`` (default 300 s); ``launch`` gets 60 s more,
because the other ranks are still importing torch. A 1-rank run starts no
monitor; it stops when the process group is destroyed.

Revert: every wrapped method is put back through the ``Patcher``; one a library
wrapped after compatshim keeps that library's wrapper, and compatshim's under it
then calls Fabric's method and watches nothing.
"""

from __future__ import annotations

from .._engine.patching import in_force, ours, wrapping

TYPE_CHECKING = False  # no ``typing`` import: this module loads inside its target's import
if TYPE_CHECKING:
    from types import ModuleType
    from typing import Any, Callable

    from .._engine.patching import Patcher

COLLECTIVES = ("barrier", "broadcast", "all_reduce", "all_gather")
BREADCRUMB_ONLY = (*COLLECTIVES, "save", "load")
MEET = ("setup", "setup_module", "setup_dataloaders")
WRAPPED = ("launch", *MEET, *BREADCRUMB_ONLY)
LAUNCH_ALLOWANCE = 60.0  # seconds on top of the timeout: the other ranks import torch first
DISTRIBUTIONS = {"lightning_fabric": "lightning-fabric"}  # top-level module -> distribution


def _fabric_class(module: ModuleType) -> Any:
    from .._engine.versions import installed_version

    fabric = getattr(module, "Fabric", None)
    missing = [name for name in WRAPPED if not callable(getattr(fabric, name, None))]
    if fabric is None or missing:
        distribution = DISTRIBUTIONS.get(module.__name__.split(".")[0], "lightning")
        raise RuntimeError(
            f"{distribution} {installed_version(distribution)}: {module.__name__}.Fabric lacks "
            f"{missing or ['Fabric']}; known layout (2.4-2.6) has "
            f"Fabric.{', Fabric.'.join(WRAPPED)}"
        )
    return fabric


def probe(module: ModuleType) -> bool:
    """True while Fabric's methods are the unguarded originals."""
    fabric = _fabric_class(module)
    return not all(in_force(vars(fabric).get(name)) for name in WRAPPED)


def _breadcrumb(name: str, original: Callable[..., Any], patcher: Patcher) -> Callable[..., Any]:
    from functools import (
        wraps,  # here, not at the top: this module loads inside its target's import
    )

    from ..desync import _framework as watch

    op = f"Fabric.{name}"
    collective = name in COLLECTIVES

    @wraps(original)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not patcher.live:  # reverted, still held by a library that wrapped it
            return original(self, *args, **kwargs)
        watch.watch_process_group()
        # world-wide unless a sub-group is passed: then waiting on it proves no dead lock
        call = watch.enter_call(op, collective=collective and kwargs.get("group") is None)
        try:
            return original(self, *args, **kwargs)
        finally:
            watch.leave_call(call)

    return ours(wrapper, original, patcher)


def _meeting(name: str, original: Callable[..., Any], patcher: Patcher) -> Callable[..., Any]:
    from functools import wraps

    from ..desync import _framework as watch

    op = f"Fabric.{name}"
    compares_module = name != "setup_dataloaders"

    @wraps(original)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not patcher.live:  # reverted, still held by a library that wrapped it
            return original(self, *args, **kwargs)
        distributed = watch.watch_process_group()
        call = watch.enter_call(op)
        try:
            if call is not None and distributed:
                module = kwargs.get("module", args[0] if args else None)
                watch.meet(op, module if compares_module else None)
            return original(self, *args, **kwargs)
        finally:
            watch.leave_call(call)

    return ours(wrapper, original, patcher)


def _rank_number(fabric: Any, name: str, default: int) -> int:
    """``fabric.world_size`` / ``global_rank`` / ``local_rank``, or ``default`` when it is not
    a number (a test's stand-in strategy): the patch never fails a call Fabric would not."""
    try:
        value = getattr(fabric, name, default)
    except Exception:
        return default
    return value if isinstance(value, int) else default


def _watch_launch(fabric: Any) -> list[Any]:
    """Before ``launch()`` of a run of 2+ ranks: watch it, and the child ranks it starts."""
    from ..desync import _framework as watch
    from ._fabric_launcher import LauncherChildren, launcher_children

    if _rank_number(fabric, "world_size", 1) < 2:
        return []  # nobody to be out of step with: no monitor
    watches = [watch.watch_calls({"Fabric.launch": LAUNCH_ALLOWANCE})]
    procs = launcher_children(fabric)
    if procs is not None and _rank_number(fabric, "local_rank", 0) == 0:
        rank = _rank_number(fabric, "global_rank", 0)
        watches.append(LauncherChildren(procs, rank=rank))
        watch.add_watch(watches[-1])
    return watches


def _with_function(
    args: tuple[Any, ...], kwargs: dict[str, Any], function: Callable[..., Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``launch``'s arguments with ``function`` in place of the one given."""
    if "function" in kwargs:
        return args, {**kwargs, "function": function}
    return (function, *args[1:]), kwargs


class _Launching:
    """The watched ``Fabric.launch`` call, left once: when the user's function starts, or at
    the end of ``launch()``."""

    def __init__(self) -> None:
        from ..desync import _framework as watch

        self._watch = watch
        self.call = watch.enter_call("Fabric.launch")
        self._open = self.call is not None

    def leave(self) -> None:
        if self._open:
            self._open = False
            self._watch.leave_call(self.call)

    def then(self, function: Callable[..., Any]) -> Callable[..., Any]:
        """``function``, ending the launch when it starts (the group exists by then)."""
        from functools import wraps

        @wraps(function)
        def run(*args: Any, **kwargs: Any) -> Any:
            self.leave()
            self._watch.watch_process_group()
            return function(*args, **kwargs)

        return run


def _launch(original: Callable[..., Any], patcher: Patcher) -> Callable[..., Any]:
    """``launch()`` is watched until the process group is set up, not while ``function`` runs.

    With a function, Fabric's script launcher runs it in this process once the
    group exists: the launch ends there, and the function's own Fabric calls
    are watched one by one. The spawn/fork launchers run it in worker
    processes (armed through ``COMPATSHIM_AUTO``) while this one only waits
    for them: nothing to watch here.
    """
    from functools import wraps

    from ..desync import _framework as watch
    from ._fabric_launcher import end_children, launcher_children

    @wraps(original)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not patcher.live:  # reverted, still held by a library that wrapped it
            return original(self, *args, **kwargs)
        given = bool(args) or "function" in kwargs
        function: Any = kwargs["function"] if "function" in kwargs else (args[0] if args else None)
        if given and (not callable(function) or launcher_children(self) is None):
            return original(self, *args, **kwargs)  # Fabric's own error, or spawn/fork workers
        launching = _Launching()
        if launching.call is None:  # launch() inside a watched call: only the outer one counts
            return original(self, *args, **kwargs)
        watches: list[Any] = []
        try:
            watches = _watch_launch(self)
            if given:
                args, kwargs = _with_function(args, kwargs, launching.then(function))
            result = original(self, *args, **kwargs)
        except BaseException:  # the child ranks it started would wait for this one
            end_children(watches)
            raise
        finally:
            launching.leave()
            distributed = watch.watch_process_group()
            if not distributed:  # it failed, or ran no group here: nothing left to watch
                for each in watches:
                    watch.remove_watch(each)
        if not given and distributed:  # launch() returns on every rank: meet there
            watch.meet("Fabric.launch")
        return result

    return ours(wrapper, original, patcher)


def apply(module: ModuleType, patcher: Patcher) -> None:
    fabric = _fabric_class(module)
    for name in WRAPPED:
        original = wrapping(vars(fabric).get(name, getattr(fabric, name)))
        if original is None:  # ours, in force
            continue
        if name == "launch":
            wrapped = _launch(original, patcher)
        elif name in MEET:
            wrapped = _meeting(name, original, patcher)
        else:
            wrapped = _breadcrumb(name, original, patcher)
        patcher.setattr(fabric, name, wrapped)
