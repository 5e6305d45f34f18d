"""Patch ``torch-dcp-metadata-error``: a DCP load that cannot read ``.metadata`` says why.

What breaks
    ``torch.distributed.checkpoint``'s load step (``_load_state_dict``, behind
    ``dcp.load``, ``load_state_dict``, ``format_utils.dcp_to_torch_save`` and every
    framework's DCP resume) catches any exception from ``storage_reader.read_metadata()``,
    logs "Global metadata is not found" at INFO without it, tries a rank-local
    ``.metadata``, then raises ``AssertionError("metadata is None")``. A missing or
    truncated folder, a ``.metadata`` written by a newer torch (2.15's
    ``TensorProperties``), and a hardened refusal (``torch-dcp-safe-metadata``) all
    read "metadata is None". torch 2.12 puts the reasons back
    ("metadata is None; global metadata read failed: ...").

Which versions
    torch 2.9 (the rank-local fallback arrives) to 2.11, read in 2.8.0, 2.9.1, 2.10.0,
    2.11.0 and 2.12.0's ``state_dict_loader.py``; the probe decides on every release
    (2.1 to 2.8 and 2.12+ let the reader's error through: nothing to do).

How it is detected
    The probe runs the module's own ``_load_state_dict`` (2.1: ``load_state_dict``; no
    process group, no files) on a reader whose ``read_metadata`` raises with a marker:
    the defect is present when the error torch raises does not carry the marker. The log
    records that step makes on this thread are held back (2.12+ log it at WARNING).

The fix
    The module's ``logger`` (the root logger) becomes a stand-in that, when torch logs
    the fallback from inside its ``except`` block, notes the error being handled (on this
    thread); the ``_wrap_exception`` that ``_DistWrapper`` calls on a failed step, before
    ranks exchange failures, completes ``AssertionError("metadata is None")`` with those
    notes in torch 2.12's words. Same exception types, same control flow; every rank's
    failure says why.

The revert
    The module's ``logger`` and the ``_wrap_exception`` of ``_DistWrapper``'s module get
    torch's objects back (Patcher); a library's wrapper put on ``_wrap_exception`` after
    compatshim stays, and compatshim's under it adds nothing.
"""

from __future__ import annotations

import sys
import threading

from .._engine.patching import mark, ours, wrapping

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import ModuleType
    from typing import Any, Callable

    from .._engine.patching import Patcher

_NAME = "torch-dcp-metadata-error"
_MISSING = "metadata is None"  # torch's words, 2.9 to 2.11
# torch's fallback log lines, and the words torch 2.12 gives each failure
_FELL_BACK = {
    "Global metadata is not found": "global metadata read failed",
    "Rank local metadata is not found": "rank local metadata read failed",
}
_REASON_LIMIT = 4000
_notes = threading.local()


def _note(message: Any) -> None:
    """Called as torch logs ``message``: note the error it is handling, if a fallback."""
    error = sys.exc_info()[1]
    if error is None or type(message) is not str:
        return
    for start, words in _FELL_BACK.items():
        if message.startswith(start):
            from .._text import cut

            try:  # inside torch's except block: nothing here may raise
                said = cut(" ".join(str(error).splitlines()), _REASON_LIMIT)  # one line
            except Exception:
                said = f"a {type(error).__name__} whose message cannot be read"
            notes = [] if words.startswith("global") else getattr(_notes, "reasons", [])
            _notes.reasons = [*notes, f"{words}: {said}"]


class _Witness:
    """``state_dict_loader.logger`` under the fix: torch's logger that notes fallbacks."""

    def __init__(self, real: Any) -> None:
        self._real = real

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def info(self, message: Any, *args: Any, **kwargs: Any) -> None:
        _note(message)
        kwargs["stacklevel"] = kwargs.get("stacklevel", 1) + 1  # torch's line, not this one
        self._real.info(message, *args, **kwargs)


def _completing(
    real: Callable[[BaseException], Any], patcher: Patcher
) -> Callable[[BaseException], Any]:
    def _wrap_exception(exc: BaseException) -> Any:
        reasons = getattr(_notes, "reasons", None)
        _notes.reasons = None
        if type(exc) is AssertionError and exc.args == (_MISSING,) and reasons and patcher.live:
            exc.args = ("; ".join([_MISSING, *reasons]),)
        return real(exc)

    return ours(mark(_wrap_exception, __wrapped__=real), real, patcher)


class _ProbeError(RuntimeError):
    pass


def _quiet_here() -> Any:
    """A logging filter dropping the records of the thread that made it (the probe's)."""
    import logging

    thread = threading.get_ident()

    class _ThisThread(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            return threading.get_ident() != thread

    return _ThisThread()


def _logger(module: ModuleType) -> Any:
    found = vars(module).get("logger")
    return found._real if isinstance(found, _Witness) else found


def probe(module: ModuleType) -> bool:
    """True while ``_load_state_dict`` raises without the reason its reader failed."""
    import logging

    marker = f"compatshim {_NAME} probe {id(module):x}"
    asked: list[bool] = []

    class _Unreadable:  # a storage reader whose metadata cannot be read
        def read_metadata(self) -> Any:
            asked.append(True)
            raise _ProbeError(marker)

    # torch 2.1 has no _load_state_dict: its load_state_dict is that step, same arguments
    load = vars(module).get("_load_state_dict") or vars(module).get("load_state_dict")
    if load is None:
        raise LookupError(
            f"{module.__name__} has no _load_state_dict (2.2+) nor load_state_dict (2.1): "
            "layout not known"
        )
    logger, quiet = _logger(module), _quiet_here()
    if isinstance(logger, logging.Logger):
        logger.addFilter(quiet)
    try:
        load({}, _Unreadable(), no_dist=True)
    except BaseException as error:  # CheckpointException is a BaseException
        if not asked:
            raise LookupError(
                f"{module.__name__}._load_state_dict never read its reader's metadata "
                f"({type(error).__name__}): layout not known"
            ) from None
        return marker not in str(error)
    finally:
        if isinstance(logger, logging.Logger):
            logger.removeFilter(quiet)
    raise LookupError(f"{module.__name__}._load_state_dict loaded without metadata")


def apply(module: ModuleType, patcher: Patcher) -> None:
    import logging

    logger = vars(module).get("logger")
    wrapper = vars(module).get("_DistWrapper")
    utils = sys.modules.get(getattr(wrapper, "__module__", ""))
    current = vars(utils).get("_wrap_exception") if utils is not None else None
    if not isinstance(logger, logging.Logger) or not callable(current):
        raise LookupError(
            f"{module.__name__}: looked for its logging.Logger 'logger' (found "
            f"{type(logger).__name__}) and _DistWrapper's _wrap_exception (found "
            f"{type(current).__name__}): layout not known"
        )
    patcher.setattr(module, "logger", _Witness(logger))
    real = wrapping(current)
    if real is not None:  # None: ours, in force
        patcher.setattr(utils, "_wrap_exception", _completing(real, patcher))
