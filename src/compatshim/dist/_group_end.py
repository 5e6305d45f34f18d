"""Notice the end of the default process group: torch offers no hook, so wrap its destroyer.

While the monitor runs, ``torch.distributed.destroy_process_group`` (and the
same function in ``distributed_c10d``) is wrapped so that destroying the
default group stops the monitor first, while the store still answers. The
wrapper is removed when the monitor stops, but only where it is still in place:
if someone replaced it meanwhile (a test's monkeypatch), theirs is left alone.
torch is never imported here: a monitor runs only after torch.distributed is.
"""

from __future__ import annotations

import functools
import sys
import threading
from types import ModuleType
from typing import Any, Callable

_MODULES = ("torch.distributed", "torch.distributed.distributed_c10d")
_installed: list[tuple[ModuleType, Callable[..., Any], Callable[..., Any]]] = []
_lock = threading.Lock()


def install(on_destroy: Callable[[], None]) -> None:
    """Call ``on_destroy()`` before the default process group is destroyed (until ``uninstall``)."""
    with _lock:
        c10d = sys.modules.get("torch.distributed.distributed_c10d")
        if _installed or c10d is None:
            return
        original: Callable[..., Any] = c10d.destroy_process_group
        members = c10d.GroupMember

        @functools.wraps(original)
        def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
            group = args[0] if args else kwargs.get("group")
            if group is None or group is members.WORLD:
                on_destroy()
            return original(*args, **kwargs)

        for name in _MODULES:
            module = sys.modules.get(name)
            if module is not None and getattr(module, "destroy_process_group", None) is original:
                module.destroy_process_group = destroy_process_group  # type: ignore[attr-defined]
                _installed.append((module, original, destroy_process_group))


def uninstall() -> None:
    """Put the original back wherever the wrapper is still the current function."""
    with _lock:
        for module, original, wrapper in _installed:
            if getattr(module, "destroy_process_group", None) is wrapper:
                module.destroy_process_group = original  # type: ignore[attr-defined]
        _installed.clear()
