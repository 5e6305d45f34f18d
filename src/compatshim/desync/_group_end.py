"""Notice the end of the default process group: torch offers no hook, so wrap its destroyer.

While the monitor runs, ``torch.distributed.destroy_process_group`` (and the
same function in ``distributed_c10d``) is wrapped so that destroying the
default group stops the monitor first, while the store still answers. The
wrapper is removed when the monitor stops, but only where it is still in place:
if someone replaced it meanwhile (a test's monkeypatch), theirs is left alone.
torch is never imported here: a monitor runs only after torch.distributed is.

Before the default group is destroyed, the wrapper also gives torch's gloo
workers a moment without the GIL (``SETTLE``). A worker that drops a finished
work whose thread-local state holds a Python object (torch 2.15's backward
stashes a ``contextvars.Context`` there, so every DDP gradient all-reduce
carries one) must take the GIL to do it, and ``~ProcessGroupGloo`` joins its
workers while the thread that drops the last reference to the group holds the
GIL (pytorch issue 56297): if a worker is still waiting for the GIL then, the
process hangs at exit. The monitor's thread competes for the GIL too, and in
2-rank Fabric runs on a loaded 2-core machine it made that race a few percent
likely (gdb: main thread in ``~ProcessGroupGloo`` -> ``thread::join``, worker in
``~AsyncAllreduceWork`` -> ``SafePyObject`` decref -> ``take_gil``); no new work
is queued after ``destroy_process_group``, so a worker still waiting gets the
GIL during the pause and the group goes with nothing pending.
"""

from __future__ import annotations

import functools
import sys
import threading
import time
from types import ModuleType
from typing import Any, Callable

_MODULES = ("torch.distributed", "torch.distributed.distributed_c10d")
SETTLE = 0.1  # seconds without the GIL before the default group goes (see the docstring)
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
                time.sleep(SETTLE)  # gloo workers finish dropping what they hold
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
