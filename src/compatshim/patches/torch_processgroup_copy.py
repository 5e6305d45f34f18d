"""Patch ``torch-processgroup-copy``: deep copies share a ProcessGroup; pickles re-bind it.

What breaks
    ``copy.deepcopy`` of anything that holds a ``ProcessGroup`` (a plain
    attribute, ``nn.SyncBatchNorm(process_group=g)``, a model wrapped by DDP,
    nested containers) raises ``TypeError: cannot pickle
    'torch._C._distributed_c10d.ProcessGroup' object``; so do ``pickle`` and
    ``torch.save``. EMA helpers (Open-Sora, yolov5, mmengine) deep-copy the
    model and crash. PyTorch issues 76927 and 73825.

Which versions
    Every torch 2.x release up to 2.15, the newest (tested: 2.1, 2.4, 2.5,
    2.8, 2.13, 2.14, 2.15 on Python 3.9-3.13). On a newer release the probe
    alone decides.

How it is detected
    The probe builds a bare, unregistered ``ProcessGroup`` (no store traffic,
    no initialised default group needed) and tries ``copy.deepcopy`` and
    ``pickle.dumps`` on it. The defect is present when either fails with
    anything but this patch's own "unknown group" error.

The fix
    Three attributes on the ``ProcessGroup`` base class (so every subclass,
    C++ or Python, is covered unless it defines its own):

    - ``__deepcopy__`` / ``__copy__`` return the group itself: a group is a
      communicator handle, not data, so a copy talks through the same group.
    - ``__reduce_ex__`` records the group's global ranks (ordered by group
      rank), backend and name; unpickling calls :func:`rebind_process_group`.

    Re-binding happens **at load**: the loader returns the existing group of
    this process with the same global ranks (the same name wins a tie, then
    the same backend, then WORLD, then the oldest). When no such group
    exists, what happens depends on whether torch.distributed is initialised:

    - initialised (this rank is not a member, or nobody made the group yet):
      the load raises :class:`ProcessGroupUnavailableError` naming the ranks.
      Raising here, not later, matters: torch's c10d logging wrapper
      replaces errors from an unregistered group with an unrelated one
      (torch 2.4: ``TypeError: Invariant encountered``).
    - not initialised (evaluating a whole-model checkpoint in one process,
      or unpickling ``mp.spawn`` arguments before ``init_process_group``):
      the load succeeds and the attribute holds an
      :class:`UnboundProcessGroup`; its **first use** raises
      :class:`ProcessGroupUnavailableError` naming the ranks.

    Either way nothing communicates over a wrong group. Loading needs
    compatshim importable, not installed.

    Pickling a group torch.distributed does not know (not WORLD, not from
    ``new_group``) raises :class:`ProcessGroupPickleError`.

    ``torch.load(weights_only=True)`` refuses the re-bind function like any
    global it was not told about (a full ``nn.Module`` needs
    ``weights_only=False`` anyway). It is safe to allow: it only looks up
    groups that already exist. Allow it with
    ``torch.serialization.add_safe_globals([rebind_process_group])`` (torch
    2.4+); compatshim does not edit that list for you.

The revert
    All three class attributes are set through the :class:`Patcher`;
    uninstalling deletes them again, so the class is exactly as it was.
"""

from __future__ import annotations

from .._engine.versions import installed_version

TYPE_CHECKING = False  # no ``typing`` import: this module loads inside its target's import
if TYPE_CHECKING:
    from types import ModuleType
    from typing import Any

    from .._engine.patching import Patcher

__all__ = [
    "ProcessGroupPickleError",  # noqa: F822 - made on first use by the module __getattr__
    "ProcessGroupUnavailableError",
    "UnboundProcessGroup",
    "rebind_process_group",
]

_REGISTRY_LAYOUTS = ("distributed_c10d._world.pg_group_ranks", "distributed_c10d._pg_group_ranks")
_NAME_LAYOUTS = ("distributed_c10d._world.pg_names", "distributed_c10d._pg_names")


def _pickle_error() -> type[Exception]:
    """``ProcessGroupPickleError``, a ``pickle.PicklingError``, made on first use.

    Its base lives in ``_pickle``, whose imports (functools, collections) would
    add to the hook's cost inside ``import torch``; nothing is pickled before then.
    """
    made = globals().get("ProcessGroupPickleError")
    if made is None:
        from _pickle import PicklingError  # pickle.PicklingError itself, without pickle

        class ProcessGroupPickleError(PicklingError):
            """A ProcessGroup cannot be pickled: torch.distributed does not know its ranks."""

        ProcessGroupPickleError.__module__ = __name__
        ProcessGroupPickleError.__qualname__ = "ProcessGroupPickleError"
        made = globals().setdefault("ProcessGroupPickleError", ProcessGroupPickleError)
    error: type[Exception] = made
    return error


def __getattr__(name: str) -> Any:
    if name == "ProcessGroupPickleError":
        return _pickle_error()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class ProcessGroupUnavailableError(RuntimeError):
    """An unpickled ProcessGroup had no group with the same ranks to re-bind to."""


def _c10d() -> ModuleType:
    from torch.distributed import distributed_c10d

    module: ModuleType = distributed_c10d
    return module


def _lookup(root: Any, dotted: str) -> Any:
    for part in dotted.split(".")[1:]:
        root = getattr(root, part)
    return root


def _first_dict(layouts: tuple[str, ...]) -> dict[Any, Any] | None:
    """The first of ``layouts`` (dotted paths under c10d) that holds a dict."""
    c10d = _c10d()
    for dotted in layouts:
        try:
            found = _lookup(c10d, dotted)
        except AttributeError:
            continue
        if isinstance(found, dict):
            return found
    return None


def _group_ranks_registry() -> dict[Any, dict[int, int]]:
    """torch's map ``group -> {global rank: group rank}``; an unknown layout is an error."""
    registry = _first_dict(_REGISTRY_LAYOUTS)
    if registry is not None:
        return registry
    raise RuntimeError(
        f"compatshim torch-processgroup-copy: torch {installed_version('torch')} keeps its "
        f"process-group registry in an unknown place; looked for torch.distributed."
        f"{' and torch.distributed.'.join(_REGISTRY_LAYOUTS)} (the layouts of torch 2.0-2.13)"
    )


def _live_groups() -> dict[Any, dict[int, int]]:
    """Groups this process is a member of (torch also files ``NON_GROUP_MEMBER``, an int)."""
    c10d = _c10d()
    if not c10d.is_initialized():
        return {}
    return {
        group: mapping
        for group, mapping in _group_ranks_registry().items()
        if isinstance(group, c10d.ProcessGroup)
    }


def _group_names() -> dict[Any, str]:
    return _first_dict(_NAME_LAYOUTS) or {}


def _backend_of(group: Any) -> str | None:
    try:
        return str(_c10d().get_backend(group))
    except Exception:  # a backend name is a tie-breaker, never required
        return None


def _global_ranks(mapping: dict[int, int]) -> tuple[int, ...]:
    return tuple(sorted(mapping, key=lambda global_rank: mapping[global_rank]))


def _default_group() -> Any:
    c10d = _c10d()
    return c10d._get_default_group() if c10d.is_initialized() else None


def _share(self: Any, memo: Any = None) -> Any:
    """``__deepcopy__``/``__copy__``: a communicator handle is shared, never duplicated."""
    return self


def _reduce_group(self: Any, protocol: int = 2) -> tuple[Any, tuple[Any, ...]]:
    """``__reduce_ex__``: record global ranks, backend, name; :func:`rebind_process_group` loads."""
    mapping = _group_ranks_registry().get(self)
    if mapping is None:
        raise _pickle_error()(
            f"cannot pickle {self!r}: torch.distributed does not know this process group "
            "(it is neither WORLD nor made by new_group), so its global ranks are unknown"
        )
    return rebind_process_group, (
        _global_ranks(mapping),
        _backend_of(self),
        _group_names().get(self),
    )


def rebind_process_group(
    ranks: tuple[int, ...], backend: str | None = None, name: str | None = None
) -> Any:
    """Return this process's group over the same global ``ranks`` (see the module docstring).

    Called by the unpickler. Looks only at groups that already exist; never
    creates one and never runs code from the file.
    """
    ranks = tuple(int(r) for r in ranks)
    candidates = [g for g, mapping in _live_groups().items() if _global_ranks(mapping) == ranks]
    if not candidates:
        unbound = UnboundProcessGroup(ranks, backend, name)
        if _c10d().is_initialized():
            raise ProcessGroupUnavailableError(unbound._explain())
        return unbound
    names = _group_names()
    world = _default_group()

    def preference(group: Any) -> tuple[bool, bool, bool]:
        return (
            name is not None and names.get(group) == name,
            backend is not None and _backend_of(group) == backend,
            group is world,
        )

    return max(candidates, key=preference)  # max keeps the oldest among equals


class UnboundProcessGroup:
    """Stands in for a pickled group that had no counterpart when loaded; fails on first use.

    Deep copies and pickles of it keep working (they re-bind again on load),
    so saving a loaded model does not lose the ranks.
    """

    __slots__ = ("_backend", "_name", "_ranks")

    def __init__(self, ranks: tuple[int, ...], backend: str | None, name: str | None) -> None:
        object.__setattr__(self, "_ranks", tuple(ranks))
        object.__setattr__(self, "_backend", backend)
        object.__setattr__(self, "_name", name)

    @property
    def ranks(self) -> tuple[int, ...]:
        """The global ranks of the group that was pickled."""
        return tuple(object.__getattribute__(self, "_ranks"))

    def _explain(self) -> str:
        ranks = list(self.ranks)
        backend = object.__getattribute__(self, "_backend")
        here = "torch.distributed is not initialised in this process"
        try:
            c10d = _c10d()
            if c10d.is_initialized():
                existing = sorted({_global_ranks(m) for m in _live_groups().values()})
                here = (
                    f"this process is global rank {c10d.get_rank()} and its groups have ranks "
                    f"{', '.join(str(list(r)) for r in existing)}"
                )
        except Exception:
            pass
        return (
            f"this ProcessGroup was pickled from a group over global ranks {ranks} "
            f"(backend {backend}); when it was loaded no group with these ranks existed "
            f"({here}). Create it first (init_process_group / new_group(ranks={ranks})) and "
            "load again, or assign a live group to this attribute"
        )

    def __getattr__(self, item: str) -> Any:
        if item.startswith("__") and item.endswith("__"):
            raise AttributeError(item)
        raise ProcessGroupUnavailableError(self._explain())

    def __setattr__(self, key: str, value: Any) -> None:
        raise ProcessGroupUnavailableError(self._explain())

    def __repr__(self) -> str:
        # torch's own errors quote this repr (e.g. "Process group <...> is not initialized").
        ranks = list(self.ranks)
        return (
            f"<UnboundProcessGroup over global ranks {ranks}: no group with these ranks existed "
            f"when it was loaded; create it (new_group(ranks={ranks})) before loading>"
        )

    def __copy__(self) -> UnboundProcessGroup:
        return self

    def __deepcopy__(self, memo: Any) -> UnboundProcessGroup:
        return self

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return rebind_process_group, (
            self.ranks,
            object.__getattribute__(self, "_backend"),
            object.__getattribute__(self, "_name"),
        )


def _process_group_class(module: ModuleType) -> type | None:
    if not module.is_available():
        return None
    from torch._C import _distributed_c10d

    cls = _distributed_c10d.ProcessGroup
    return cls if isinstance(cls, type) else None


def _bare_group(cls: type) -> Any:
    """An unregistered group: ``(rank, size)`` on new torch, ``(store, rank, size[, options])``."""
    from torch._C import _distributed_c10d

    attempts: list[tuple[Any, ...]] = [(0, 1)]
    store = _distributed_c10d.HashStore()
    attempts.append((store, 0, 1))
    options = getattr(cls, "Options", None)
    if options is not None:
        for args in ((), ("gloo",)):
            try:
                attempts.append((store, 0, 1, options(*args)))
            except Exception:
                continue
    errors = []
    for args in attempts:
        try:
            return cls(*args)
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
    raise RuntimeError(
        f"torch {installed_version('torch')}: cannot build a bare ProcessGroup to probe with "
        f"(tried (rank, size), (store, rank, size), (store, rank, size, options)): {errors[-1]}"
    )


def probe(module: ModuleType) -> bool:
    cls = _process_group_class(module)
    if cls is None:
        return False  # a torch build without torch.distributed has nothing to copy
    cached = "__slotnames__" in vars(cls)
    try:
        return _copy_fails(cls)
    finally:
        if not cached and "__slotnames__" in vars(cls):  # copyreg's cache, set by the copy
            delattr(cls, "__slotnames__")  # uninstall leaves the class as it found it


def _copy_fails(cls: type) -> bool:
    import copy
    import pickle

    group = _bare_group(cls)
    try:
        copy.deepcopy(group)
    except Exception:
        return True
    try:
        pickle.dumps(group)
    except _pickle_error():
        return False  # our reducer ran and rightly refused an unregistered group
    except Exception:
        return True
    return False


def apply(module: ModuleType, patcher: Patcher) -> None:
    cls = _process_group_class(module)
    if cls is None:
        raise RuntimeError("torch.distributed is not available in this torch build")
    patcher.setattr(cls, "__deepcopy__", _share)
    patcher.setattr(cls, "__copy__", _share)
    patcher.setattr(cls, "__reduce_ex__", _reduce_group)
