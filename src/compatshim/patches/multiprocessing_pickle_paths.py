"""Patch ``multiprocessing-pickle-paths``: a child process that cannot be started says where.

What breaks
    Under the ``spawn`` and ``forkserver`` start methods every child process
    (a DataLoader worker with ``num_workers > 0``, an ``mp.spawn`` rank, a
    launcher's child) gets its target and arguments by pickle. Python 3.14 made
    ``forkserver`` the default on Linux, so objects that ``fork`` used to share
    now fail to start the child, with pickle's first error and no location:
    ``TypeError: cannot pickle 'dict_keys' object`` (nuscenes-devkit configs),
    ``cannot pickle 'torch._C._distributed_c10d.ProcessGroup' object``,
    ``Can't pickle local object 'main.<locals>.<lambda>'``. torch's DataLoader
    only warns and suggests ``fork``. Python 3.14 adds notes naming the types
    pickle was in ("when serializing dict item 'x'"), not a path a user can act on.

Which versions
    CPython 3.9 and later (``distribution="python"``: the running interpreter;
    tested 3.9-3.13). On a newer Python the probe alone decides.

How it is detected
    The probe pickles, through ``multiprocessing.reduction.dump`` (the call
    every start method but ``fork`` makes), an object holding a lock two
    attributes down. The defect is present when the error names neither
    attribute.

The fix
    ``multiprocessing.reduction.dump`` is wrapped. A dump that works is
    untouched (one extra call frame). One that fails re-raises the same
    exception object, its message followed by one line from
    :func:`compatshim.find_unpicklable`: the attribute paths inside the child's
    target and arguments that cannot be pickled, their types and the compatshim
    fix that covers each, if any. compatshim never switches the start method,
    and the known fixes themselves (``torch-processgroup-copy``,
    ``nuscenes-dict-views``) are separate patches that ``COMPATSHIM_AUTO=1``
    arms in the parent and in every child.

Confirmed
    Right after the fix, by :func:`confirm` (the wrapper is in place); by the
    probe, which then imports ``compatshim.pickling``, when ``status()`` or the
    doctor first asks.

The revert
    The module attribute gets the original function back (Patcher). The
    popen modules look ``reduction.dump`` up at each start, so nothing else
    holds the wrapper, unless a library wrapped it after compatshim: that
    library's wrapper stays, and compatshim's under it passes every call on.
"""

from __future__ import annotations

from .._engine.patching import in_force, ours, wrapping

TYPE_CHECKING = False  # no ``typing`` import at run time (start-up path)
if TYPE_CHECKING:
    from types import ModuleType
    from typing import Any, Callable

    from .._engine.patching import Patcher

__all__ = ["apply", "confirm", "probe"]

_NAME = "multiprocessing-pickle-paths"
_MARK = "compatshim: "
_MAX_FINDINGS = 3
_MAX_LINE = 600


def _parts(obj: Any) -> list[tuple[str, Any]]:
    """What a child receives, named as a user wrote it: a Process's target and arguments."""
    from multiprocessing.process import BaseProcess

    if not isinstance(obj, BaseProcess):
        return [("obj", obj)]
    target = getattr(obj, "_target", None)
    name = getattr(target, "__qualname__", None) or "target"
    parts: list[tuple[str, Any]] = [(name, target)]
    parts += [(f"{name} args[{i}]", arg) for i, arg in enumerate(getattr(obj, "_args", ()))]
    kwargs = getattr(obj, "_kwargs", None) or {}
    parts += [(f"{name} kwargs[{key!r:.40}]", value) for key, value in kwargs.items()]
    return parts


def _line(obj: Any) -> str | None:
    """One line naming where ``obj`` cannot be pickled, or None when nothing can be found."""
    from ..pickling import find_unpicklable

    findings: list[Any] = []
    for root, part in _parts(obj):
        findings += find_unpicklable(part, root=root, limit=_MAX_FINDINGS - len(findings))
        if len(findings) >= _MAX_FINDINGS:
            break
    if not findings:
        return None
    text = "; ".join(str(finding) for finding in findings)
    if len(text) > _MAX_LINE:
        text = text[: _MAX_LINE - 3] + "..."
    return f"{_MARK}the child process cannot be sent {text}"


def _annotate(exc: BaseException, obj: Any) -> None:
    """Append the line to ``exc``'s message, once; never raises."""
    try:
        args = exc.args
        if args and type(args[0]) is str and _MARK in args[0]:
            return
        line = _line(obj)
        if line is None:
            return
        if args and type(args[0]) is str:
            exc.args = (f"{args[0]}\n{line}", *args[1:])
        else:
            exc.args = (*args, line)
    except Exception:
        pass


def _wrap(original: Callable[..., Any], patcher: Patcher) -> Callable[..., Any]:
    import functools

    @functools.wraps(original)
    def dump(obj: Any, file: Any, protocol: Any = None) -> Any:
        try:
            return original(obj, file, protocol)
        except Exception as exc:
            if patcher.live:  # not reverted (a library that wrapped ours may still hold it)
                _annotate(exc, obj)
            raise

    return ours(dump, original, patcher)


def probe(reduction: ModuleType) -> bool:
    """True while a failed ``reduction.dump`` does not name the attribute path to the culprit."""
    import io
    import threading
    import types

    holder = types.SimpleNamespace(inner=types.SimpleNamespace(lock=threading.Lock()))
    try:
        reduction.dump(holder, io.BytesIO())
    except Exception as exc:
        return "inner.lock" not in " ".join(str(arg) for arg in exc.args)
    return False


def confirm(reduction: ModuleType) -> bool:
    """The fix is in place: ``reduction.dump`` is the wrapper.

    Run right after :func:`apply`; the probe through the wrapper would import
    ``compatshim.pickling`` inside the user's import. The registry runs the
    probe when ``status()`` (or the doctor) first asks; that is what ``fixed``
    reports.
    """
    return in_force(vars(reduction).get("dump"))


def apply(reduction: ModuleType, patcher: Patcher) -> None:
    original = wrapping(vars(reduction)["dump"])
    if original is not None:
        patcher.setattr(reduction, "dump", _wrap(original, patcher))
