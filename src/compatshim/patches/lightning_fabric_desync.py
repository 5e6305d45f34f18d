"""Lightning Fabric: ranks out of step hang silently (Lightning issue 20536).

What breaks: when ranks stop doing the same thing - ``launch()`` inside an
object only the main process builds, ``setup_module`` called on one rank only,
"am I distributed?" decided from ``WORLD_SIZE`` before ``launch()`` - Fabric
blocks forever in a collective (DDP's parameter check, a barrier, the
process-group rendezvous) until torch's 30-minute timeout, printing nothing.
Ranks that build different shapes fail at once, with a cryptic DDP message.

Versions: measured on lightning 2.4.0, 2.5.6 and 2.6.6 (module
``lightning.fabric``); nothing in Fabric guards against it, so newer releases
are patched as long as the probe finds the unguarded methods.

Detection: ``Fabric`` has no desync guard of its own; the probe checks that its
methods are still the unguarded originals (and that the methods this fix wraps
exist, else it raises, naming the version and what it looked for).

Fix: ``launch``, ``setup``, ``setup_module``, ``setup_dataloaders``,
``barrier``, ``broadcast``, ``all_reduce``, ``all_gather``, ``save`` and
``load`` leave an in-memory breadcrumb (call site, a few frames); the setup
calls and the end of ``launch()`` meet in :func:`compatshim.dist.sync_point`,
with the module's parameters compared across ranks. A background monitor
publishes breadcrumbs, watches the child ranks the launcher starts, and turns
a stuck or abandoned wait into a :class:`compatshim.dist.DesyncError` report
within ``COMPATSHIM_DESYNC_TIMEOUT`` (default 300 s).

Revert: every wrapped method is put back through the ``Patcher``.
"""

from __future__ import annotations

import functools

from .._patch import Patch

TYPE_CHECKING = False  # no ``typing`` import at run time: install() imports this module at start-up
if TYPE_CHECKING:
    from types import ModuleType
    from typing import Any, Callable

    from .._patching import Patcher

MARK = "__compatshim_desync__"
COLLECTIVES = ("barrier", "broadcast", "all_reduce", "all_gather")
BREADCRUMB_ONLY = (*COLLECTIVES, "save", "load")
MEET = ("setup", "setup_module", "setup_dataloaders")
WRAPPED = ("launch", *MEET, *BREADCRUMB_ONLY)


def _fabric_class(module: ModuleType) -> Any:
    from .._versions import installed_version

    fabric = getattr(module, "Fabric", None)
    missing = [name for name in WRAPPED if not callable(getattr(fabric, name, None))]
    if fabric is None or missing:
        raise RuntimeError(
            f"lightning {installed_version('lightning')}: {module.__name__}.Fabric lacks "
            f"{missing or ['Fabric']}; known layout (2.4-2.6) has "
            f"Fabric.{', Fabric.'.join(WRAPPED)}"
        )
    return fabric


def probe(module: ModuleType) -> bool:
    """True while Fabric's methods are the unguarded originals."""
    fabric = _fabric_class(module)
    return not all(getattr(getattr(fabric, name), MARK, False) for name in WRAPPED)


_attached = False


def _attach() -> None:
    """Give the monitor the process group's store once it exists (cheap after the first time)."""
    global _attached
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    _attached = True
    if dist.get_world_size() > 1:
        from ..dist._store import default_meeting
        from ..dist.monitor import ensure_monitor

        meeting = default_meeting()
        if meeting is not None:
            ensure_monitor(meeting).watch_ops = True


def _breadcrumb(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    from ..dist._trail import TRAIL

    op = f"Fabric.{name}"
    collective = name in COLLECTIVES

    @functools.wraps(original)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not _attached:
            _attach()
        # world-wide unless a sub-group is passed: then waiting on it proves no dead lock
        crumb = TRAIL.enter(op, collective and kwargs.get("group") is None)
        try:
            return original(self, *args, **kwargs)
        finally:
            TRAIL.leave(crumb)

    setattr(wrapper, MARK, True)
    return wrapper


def _distributed() -> bool:
    import torch.distributed as dist

    return bool(dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1)


def _meeting(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    from ..dist._trail import TRAIL
    from ..dist.consistency import first_difference, module_summary
    from ..dist.sync import meet

    op = f"Fabric.{name}"

    @functools.wraps(original)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not _attached:
            _attach()
        crumb = TRAIL.enter(op)
        try:
            if crumb is not None and _distributed():
                module = kwargs.get("module", args[0] if args else None)
                if name != "setup_dataloaders" and module is not None:
                    meet(op, payload=module_summary(module), compare=first_difference)
                else:
                    meet(op)
            return original(self, *args, **kwargs)
        finally:
            TRAIL.leave(crumb)

    setattr(wrapper, MARK, True)
    return wrapper


def _launch(original: Callable[..., Any]) -> Callable[..., Any]:
    from ..dist._trail import TRAIL
    from ..dist.monitor import get_monitor
    from ..dist.sync import meet

    @functools.wraps(original)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        crumb = TRAIL.enter("Fabric.launch")
        if crumb is None:
            return original(self, *args, **kwargs)
        monitor = get_monitor()
        monitor.watch_ops = True
        monitor.start_up_ops.add("Fabric.launch")  # children import torch first: allow for it
        launcher = getattr(getattr(self, "_strategy", None), "launcher", None)
        procs = getattr(launcher, "procs", None)
        if isinstance(procs, list):
            first = int(getattr(self, "global_rank", 0)) + 1
            monitor.launcher_children = lambda: [(first + i, p) for i, p in enumerate(procs)]
        monitor.start()
        try:
            result = original(self, *args, **kwargs)
        finally:
            TRAIL.leave(crumb)
        _attach()
        if not args and not kwargs and _distributed():  # no function: every rank returns here
            meet("Fabric.launch")
        return result

    setattr(wrapper, MARK, True)
    return wrapper


def apply(module: ModuleType, patcher: Patcher) -> None:
    fabric = _fabric_class(module)
    for name in WRAPPED:
        original = vars(fabric).get(name, getattr(fabric, name))
        if getattr(original, MARK, False):
            continue
        if name == "launch":
            wrapped = _launch(original)
        elif name in MEET:
            wrapped = _meeting(name, original)
        else:
            wrapped = _breadcrumb(name, original)
        patcher.setattr(fabric, name, wrapped)


PATCH = Patch(
    name="lightning-fabric-desync",
    distribution="lightning",
    requires=">=2.4",
    tested=">=2.4,<=2.6.6",
    targets=("lightning.fabric.fabric", "lightning_fabric.fabric"),
    target_distributions={"lightning_fabric.fabric": "lightning-fabric"},
    probe=probe,
    apply=apply,
    description="Fabric ranks out of step: a DesyncError report within a timeout, not a hang",
)
