"""``find_unpicklable(obj)``: every place inside ``obj`` that stops it from being pickled.

Why: pickle reports only the first failure and no location
(``TypeError: cannot pickle 'dict_keys' object``), and ``dill.detect`` lists
bad objects without saying where they hang. Here each culprit is named by its
access path from the root (``dataset.eval_cfg.class_names``), with pickle's
own error for it and the compatshim fix that covers it, if any.

A clean graph costs one pickling pass into a sink that keeps nothing; only a
graph that fails is walked (``walk``), the way pickle walks it. Objects that
raise while being looked at are findings too, never a crash of the tool.
torch is never imported here; ``nn.Module`` children and tensors are
recognised only when torch is already loaded (it is, when the graph holds them).
"""

from __future__ import annotations

import pickle
import sys
from typing import Any

from .._text import short
from .finding import Finding, error_text, type_name
from .walk import Walker

__all__ = ["Finding", "find_unpicklable"]


def find_unpicklable(
    obj: Any,
    *,
    root: str = "obj",
    protocol: int | None = pickle.DEFAULT_PROTOCOL,
    limit: int | None = None,
) -> list[Finding]:
    """Every innermost object in ``obj`` that ``pickle.dumps(obj, protocol)`` cannot handle.

    ``root`` names ``obj`` in the paths. ``protocol`` is taken as pickle takes
    it: 0 to ``pickle.HIGHEST_PROTOCOL``, a negative one for the highest, None
    for the default. ``limit`` (a positive int; None: no limit) stops after
    that many findings.
    An empty list means pickle gets past every object (a failure inside a
    custom ``__reduce__`` callable at load time is out of reach). When pickle
    fails but no single object is to blame (a chain deeper than the recursion
    limit), the one finding is the root with pickle's own error. The walk stops
    ``walk.MAX_DEPTH`` (200,000) objects down, with a RecursionError finding there: a
    ``__reduce__`` that makes a new object every time would otherwise be walked forever.

    A clean graph costs one pickling pass into a sink that discards the bytes
    (tensor storages are stood in by a reference, as ``torch.save`` does, so
    no tensor data is copied); only when that fails is the graph walked.
    """
    protocol = _checked_arguments(root, protocol, limit)
    failure = _pickling_failure(obj, protocol)
    if failure is None:
        return []
    findings = Walker(protocol, limit).run(obj, root)
    if not findings:  # pickle failed somewhere no single object explains (e.g. too deep)
        findings.append(Finding(root, type_name(type(obj)), error_text(failure)))
    return findings


def _checked_arguments(root: Any, protocol: Any, limit: Any) -> int:
    """The protocol as a number from 0 to the highest, after a TypeError or ValueError naming
    a bad argument: a bad one would otherwise turn into a finding on every object (or none)."""
    if not isinstance(root, str):
        raise TypeError(f"root: expected the name of obj in the paths (a str), got {short(root)}")
    if protocol is None:
        protocol = pickle.DEFAULT_PROTOCOL
    if isinstance(protocol, bool) or not isinstance(protocol, int):
        raise TypeError(f"protocol: expected an int or None, got {short(protocol)}")
    if protocol > pickle.HIGHEST_PROTOCOL:
        raise ValueError(
            f"protocol: expected at most pickle.HIGHEST_PROTOCOL ({pickle.HIGHEST_PROTOCOL}), "
            f"got {short(protocol)}"
        )
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)):
        raise TypeError(f"limit: expected a positive int or None, got {short(limit)}")
    if limit is not None and limit <= 0:
        raise ValueError(f"limit: expected a positive int or None, got {short(limit)}")
    # pickle reads a negative protocol as the highest; the walk asks __reduce_ex__ with it, and
    # object.__reduce_ex__(-1) answers as protocol 0 would (blaming the class, not the object)
    return pickle.HIGHEST_PROTOCOL if protocol < 0 else protocol


class _DiscardingSink:
    """A write-only file that keeps nothing: the pickling pass costs no memory for output."""

    def write(self, data: bytes) -> int:
        return len(data)


class _StorageSkippingPickler(pickle.Pickler):
    """Stands a reference in for tensor storages, so the clean-graph check copies no data."""

    def __init__(self, protocol: int, storage_types: tuple[type, ...]) -> None:
        super().__init__(_DiscardingSink(), protocol)  # type: ignore[arg-type]
        self._storage_types = storage_types

    def persistent_id(self, obj: Any) -> Any:
        if issubclass(type(obj), self._storage_types):  # not isinstance: no __class__ lookup
            return id(obj)
        return None


def _pickling_failure(obj: Any, protocol: int) -> Exception | None:
    """What one pickling pass over ``obj`` raises, or None when it goes through."""
    torch = sys.modules.get("torch")
    storage_types = tuple(
        t
        for t in (
            getattr(torch, "UntypedStorage", None),
            getattr(getattr(torch, "storage", None), "TypedStorage", None),
        )
        if isinstance(t, type)
    )
    try:
        if storage_types:
            _StorageSkippingPickler(protocol, storage_types).dump(obj)
        else:
            pickle.Pickler(_DiscardingSink(), protocol).dump(obj)  # type: ignore[arg-type]
    except Exception as exc:  # RecursionError included: the walk is iterative
        return exc
    return None
