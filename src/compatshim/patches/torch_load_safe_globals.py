"""Patch ``torch-load-safe-globals``: frameworks resume from their own checkpoints on torch 2.6+.

What breaks
    torch 2.6 made ``torch.load(weights_only=True)`` the default. Framework
    releases that call plain ``torch.load`` on their own checkpoints stopped
    resuming: Lightning 2.3 and 2.6 (``trainer.fit(ckpt_path=...)``,
    ``load_from_checkpoint``) refuse hyper-parameters saved from an
    ``argparse.Namespace``, an ``AttributeDict`` or an omegaconf container
    (``Unsupported global: GLOBAL argparse.Namespace``); the transformers
    Trainer refuses its own ``rng_state.pth`` (numpy arrays; transformers
    issue 40500); accelerate 0.34's ``load_state`` catches the refusal, logs
    "Could not load random states" at INFO and trains on with the wrong RNG;
    DeepSpeed refuses ``ZeroStageEnum`` (issue 8500). The usual answer,
    ``weights_only=False``, runs any code in the file.

Which versions
    torch whose plain ``torch.load`` is weights-only: 2.6 and later (tested
    2.6-2.15). Older releases default to ``weights_only=False``; the probe
    finds nothing to fix there.

How it is detected
    The probe saves a small checkpoint holding an ``argparse.Namespace`` (and
    a numpy array when numpy is already imported) and loads it back with a
    plain ``torch.load``: the defect is present when torch refuses it.

The fix
    ``torch.load`` (and ``torch.serialization.load``, the same function) is
    wrapped. A call runs torch's own ``load`` unchanged; only when it was a
    weights-only load (``weights_only=True``, or left unset where torch
    defaults to True, following torch's ``TORCH_FORCE_(NO_)WEIGHTS_ONLY_LOAD``)
    and torch's unpickler raised ``pickle.UnpicklingError`` is the same file
    read again by :func:`compatshim.checkpoint.load`, with the same
    ``map_location`` and ``mmap``. That loader keeps the weights-only
    guarantees (curated allowlist, no code from the file, no state set on
    classes or functions) and builds the types that were saved: an
    ``AttributeDict`` comes back an ``AttributeDict``, a ``Namespace`` a
    ``Namespace``. ``weights_only=False`` calls (Lightning 2.4/2.5 pass it)
    and calls with a ``pickle_module`` are never touched, and nothing ever
    sets ``weights_only=False``.

    When compatshim's loader refuses the file too, torch's original exception
    is re-raised unchanged, with a note naming what compatshim refused, and a
    :class:`CheckpointRefusedWarning` is emitted, so a caller that swallows
    the error (accelerate 0.34) can no longer drop state silently.

    Why retry and not ``torch.serialization.add_safe_globals``: registering
    compatshim's allowlist changes what every ``weights_only=True`` load in
    the process accepts, including loads whose authors chose torch's strict
    default; it can only name objects whose modules are imported when the
    patch applies (Lightning and omegaconf usually are not, at torch import);
    and it does not cover everything (torch 2.13+'s unpickler refuses to
    SETITEM into an allow-listed ``AttributeDict``). The retry costs nothing
    on loads torch accepts (measured: bench/bench_torch_load_patch.py) and,
    on a refused load, a second read of the file, once per resume.

The revert
    Both attributes get the original function object back (Patcher).
"""

from __future__ import annotations

from .._patch import Patch

TYPE_CHECKING = False  # no ``typing`` import at run time (start-up path)
if TYPE_CHECKING:
    from types import ModuleType
    from typing import Any, Callable

    from .._patching import Patcher

__all__ = ["PATCH", "CheckpointRefusedWarning"]

_NAME = "torch-load-safe-globals"
_TRUE_VALUES = ("1", "y", "yes", "true")  # torch.serialization's own parsing


class CheckpointRefusedWarning(UserWarning):
    """torch and compatshim both refused a checkpoint; emitted even if the caller swallows it."""


def _env_flag(name: str) -> bool:
    import os

    return os.environ.get(name, "0").lower() in _TRUE_VALUES


def _was_weights_only(kwargs: dict[str, Any], args: tuple[Any, ...]) -> bool:
    """Whether torch ran this call with its weights-only unpickler (torch 2.6+ rules)."""
    pickle_module = args[2] if len(args) > 2 else kwargs.get("pickle_module")
    weights_only = kwargs.get("weights_only")
    if _env_flag("TORCH_FORCE_WEIGHTS_ONLY_LOAD"):
        return True
    if weights_only is None:
        return pickle_module is None and not _env_flag("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD")
    return bool(weights_only)


def _position(f: Any) -> int | None:
    """Where a file object stands now (None for paths and unseekable streams)."""
    if isinstance(f, (str, bytes)) or not hasattr(f, "seek"):
        return None
    try:
        return int(f.tell())
    except Exception:
        return None


def _describe(f: Any) -> str:
    """A path as given, a file object by its name (``Path.name`` would drop the folder)."""
    import os

    if isinstance(f, (str, bytes, os.PathLike)):
        return repr(os.fsdecode(f))
    return repr(getattr(f, "name", f))


def _mmap(kwargs: dict[str, Any]) -> bool:
    mmap = kwargs.get("mmap")
    if mmap is None:  # torch's own default (torch.utils.serialization.config, 2.5+)
        try:
            from torch.utils.serialization import config

            mmap = config.load.mmap
        except Exception:
            mmap = False
    return bool(mmap)


def _note(exc: BaseException, text: str) -> None:
    add_note = getattr(exc, "add_note", None)
    if add_note is not None:
        add_note(text)
    else:  # Python < 3.11: tracebacks ignore it, but the note is kept
        exc.__notes__ = [*getattr(exc, "__notes__", []), text]  # type: ignore[attr-defined]


def _warn_refused(message: str) -> None:
    """One warning per refused load; under ``-W error`` it goes to stderr, never raises."""
    import warnings

    try:
        warnings.warn(message, CheckpointRefusedWarning, stacklevel=3)
    except Exception:
        import sys

        try:  # noqa: SIM105 (contextlib costs start-up time)
            sys.stderr.write(f"CheckpointRefusedWarning: {message}\n")
        except Exception:
            pass


def _record(event: str, detail: str) -> None:
    from .. import _decisions

    _decisions.record(_NAME, event, detail)


def _retry(f: Any, start: int | None, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Read ``f`` again with compatshim's loader; raise ``LookupError`` explaining a refusal."""
    from ..checkpoint import CheckpointError, load

    if start is None and not isinstance(f, (str, bytes)) and not hasattr(f, "__fspath__"):
        raise LookupError("the file object cannot be rewound to read it again")
    if start is not None:
        f.seek(start)
    map_location = args[1] if len(args) > 1 else kwargs.get("map_location")
    try:
        return load(f, map_location, mmap=_mmap(kwargs))
    except CheckpointError as exc:
        raise LookupError(f"{type(exc).__name__}: {exc}") from None


def _wrap(original: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.load`` that retries torch's weights-only refusals through compatshim's loader."""
    import functools
    import pickle

    @functools.wraps(original)
    def load(*args: Any, **kwargs: Any) -> Any:
        f = args[0] if args else kwargs.get("f")
        start = _position(f)
        try:
            return original(*args, **kwargs)
        except pickle.UnpicklingError as refusal:
            if not _was_weights_only(kwargs, args):
                raise
            what = _describe(f)
            try:
                loaded = _retry(f, start, args, kwargs)
            except LookupError as why:
                _record("refused", f"{what}: {why}")
                _note(refusal, f"compatshim.checkpoint.load refused it too: {why}")
                _warn_refused(
                    f"torch.load refused {what} (weights-only) and compatshim.checkpoint.load "
                    f"refused it too ({why}); whatever was to be loaded from it is missing, "
                    "even if the caller carries on"
                )
                raise refusal from None
            _record("retried", f"{what}: torch refused it, compatshim.checkpoint.load loaded it")
            return loaded

    load.__compatshim_original__ = original  # type: ignore[attr-defined]
    return load


def _probe_file() -> Any:
    import argparse
    import io
    import sys

    import torch

    payload: dict[str, Any] = {"hparams": argparse.Namespace(lr=0.1)}
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        payload["numpy"] = numpy.zeros(2)
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    buffer.seek(0)
    # After apply, the registry probes again through the wrapper, which retries and records it:
    # the decision then names the probe rather than "<_io.BytesIO object at 0x...>".
    buffer.name = "the patch's own probe checkpoint"
    return buffer


def probe(torch: ModuleType) -> bool:
    """True while a plain ``torch.load`` refuses a checkpoint holding a Namespace (and numpy)."""
    import pickle
    import warnings

    buffer = _probe_file()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch 2.4/2.5 warn about their weights_only=False default
        try:
            torch.load(buffer)
        except pickle.UnpicklingError:
            return True
    return False


def apply(torch: ModuleType, patcher: Patcher) -> None:
    from torch import serialization

    wrapped: dict[int, Callable[..., Any]] = {}
    for owner in (torch, serialization):
        original = vars(owner)["load"]
        if getattr(original, "__compatshim_original__", None) is not None:
            continue  # already ours (installed twice by hand): wrapping again would nest
        replacement = wrapped.setdefault(id(original), _wrap(original))
        patcher.setattr(owner, "load", replacement)


PATCH = Patch(
    name=_NAME,
    distribution="torch",
    requires=">=2.1",
    tested=">=2.1,<2.16",
    targets=("torch",),
    probe=probe,
    apply=apply,
    description=(
        "a weights-only torch.load that torch refuses is read again by compatshim.checkpoint.load "
        "(same weights-only guarantees, curated allowlist), so frameworks resume on torch 2.6+ "
        "without weights_only=False; a refusal by both warns"
    ),
)
