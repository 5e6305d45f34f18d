"""The two errors ``compatshim.checkpoint`` raises, whatever the bytes of the file.

Callers catch :class:`CheckpointError` for both; :class:`UnsafeCheckpointError`
is also a ``pickle.UnpicklingError``, the type ``torch.load(weights_only=True)``
raises for a refused global, so code written against torch keeps working. For the
same reason a failure torch reports with its own type (no CUDA for a ``cuda:0``
storage, CUDA out of memory, a ``map_location`` callable's exception, a TorchScript
archive, a zip archive cut short, an empty file, a pickle cut short) is raised as
:func:`as_well` of that type too: ``except RuntimeError: torch.load(f, map_location="cpu")``
still retries.
"""

from __future__ import annotations

import pickle
from typing import TypeVar


class CheckpointError(Exception):
    """A damaged, truncated or unsupported file; the message names the file and the problem."""


class UnsafeCheckpointError(CheckpointError, pickle.UnpicklingError):
    """The file needs something compatshim refuses to run; the message names every refusal.

    ``refused`` lists the ``module.name`` globals (or operations) that were refused: the
    data a caller words its advice from (:func:`advised`).
    """

    def __init__(self, message: str, refused: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.refused = refused


class UndecodableTextError(CheckpointError, UnicodeDecodeError):
    """Text in the pickle that the asked encoding cannot decode: a ``UnicodeDecodeError`` too,
    as pickle (so torch) raises it, so the common ``except UnicodeDecodeError: torch.load(f,
    encoding="latin1")`` retry of a Python 2 checkpoint runs in hardened mode as in plain."""

    _kind = UnicodeDecodeError  # a failure torch has as well, not a refusal

    def __init__(self, cause: UnicodeDecodeError, message: str) -> None:
        UnicodeDecodeError.__init__(
            self, cause.encoding, cause.object, cause.start, cause.end, cause.reason
        )
        self.message = message

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> tuple[object, ...]:
        cause = UnicodeDecodeError(self.encoding, self.object, self.start, self.end, self.reason)
        return type(self), (cause, self.message)


def advised(error: UnsafeCheckpointError, advice: str) -> UnsafeCheckpointError:
    """``error`` (its type, its ``refused``) with ``advice`` after its message: the reader
    reports what it refused; each caller words what to do about it."""
    return as_well(UnsafeCheckpointError, type(error))(f"{error}{advice}", error.refused)


_E = TypeVar("_E", bound="CheckpointError")


def as_well(cls: type[_E], kind: type[BaseException]) -> type[_E]:
    """``cls`` that is also a ``kind``: the type torch raises for the same failure.

    Named as ``cls`` (tracebacks read the same), and picklable (it crosses processes in
    a pool or a spawned rank's report). A ``kind`` that is no ``Exception``, or whose
    layout cannot be combined, leaves ``cls`` as it is.
    """
    kind = getattr(kind, "_kind", kind)  # from an already combined error: its torch type
    if not issubclass(kind, Exception) or issubclass(cls, kind) or _constructs(kind):
        return cls
    made = _combined.get((cls, kind))
    if made is None:
        try:
            # named in the namespace, never set afterwards: setting an attribute on a type
            # is a global state change (an audit hook sees object.__setattr__) mid-load
            namespace = {
                "_kind": kind,
                "__reduce__": _reduce,
                "__module__": cls.__module__,
                "__qualname__": cls.__qualname__,
            }
            made = type(cls.__name__, (cls, kind), namespace)
        except TypeError:
            return cls
        if len(_combined) < 64:  # torch's kinds are few; a caller's callable adds its own
            _combined[(cls, kind)] = made
    return made  # type: ignore[return-value]


_combined: dict[tuple[type, type], type] = {}


def _constructs(kind: type[BaseException]) -> bool:
    """Whether ``kind`` builds itself (an ``__init__``/``__new__`` of its own, as a caller's
    exception may): made with a message alone it could fail, so it is not combined."""
    return any(
        c.__module__ != "builtins" and ("__init__" in vars(c) or "__new__" in vars(c))
        for c in kind.__mro__
    )


def _reduce(self: CheckpointError) -> tuple[object, ...]:
    base = next(c for c in type(self).__mro__ if "_kind" not in vars(c))
    return _rebuilt, (base, type(self)._kind, self.args, self.__dict__)  # type: ignore[attr-defined]


def _rebuilt(
    cls: type[CheckpointError],
    kind: type[BaseException],
    args: tuple[object, ...],
    state: dict[str, object],
) -> CheckpointError:
    made = as_well(cls, kind)
    error = made.__new__(made, *args)
    error.args = args
    error.__dict__.update(state)
    return error


class _PickleCutShort(EOFError, pickle.UnpicklingError):
    """What pickle (so torch) raises for a pickle that ends early: "Ran out of input" (an
    EOFError) or "pickle data was truncated" (an UnpicklingError), by where the cut falls.
    Only ever combined with :class:`CheckpointError` (:data:`CUT_SHORT`), never raised alone."""


#: a pickle cut short (a save that was killed): ``except EOFError`` and ``except
#: pickle.UnpicklingError`` around torch's load of a half-written file still catch it
CUT_SHORT = as_well(CheckpointError, _PickleCutShort)
