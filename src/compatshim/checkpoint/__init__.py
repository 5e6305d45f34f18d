"""Load any training checkpoint safely, on every torch and numpy: ``load`` and ``inspect``.

``load(f, map_location=None, *, allow=(), trusted=False, mmap=False)`` reads
torch.save files (zip and legacy formats), plain pickles and safetensors files
(a dict of tensors, as ``torch.load`` returns for a ``.safetensors`` path) with the same
weights-only guarantees on every torch release: only globals on compatshim's
allowlist (``compatshim.checkpoint.allowlist``) or in ``allow=`` are used, no
code from the file runs (never ``torch.jit.load``), no state is set on a
class, function, module or any object the file did not create, memory is
bounded by what the file holds, and only :class:`UnsafeCheckpointError` or
:class:`CheckpointError` escape (a missing path stays ``FileNotFoundError``).

``inspect(f)`` says what a file needs without constructing anything from it, except
for omegaconf configs, which are judged once built: a file naming them (and nothing
refused) is also read by ``load``'s own machine, with no tensor data.

``allow(*globals, reason=...)`` adds globals that every load in this process
accepts, ``compatshim.checkpoint.load`` and the patched ``torch.load`` alike;
``COMPATSHIM_ALLOW``, ``COMPATSHIM_ALLOW_FILE`` and the ``compatshim.allow``
entry points do the same for processes you do not write
(:mod:`compatshim.checkpoint.process_allow`). ``allowed()`` lists them all.

Importing this package imports neither torch nor numpy.
"""

from __future__ import annotations

import logging
from typing import Any, Iterable

from .._text import short
from .errors import CheckpointError, UnsafeCheckpointError

__all__ = [
    "Allowed",
    "CheckpointError",
    "CheckpointInfo",
    "DowngradeError",
    "DowngradeReport",
    "ResumePlan",
    "UnsafeCheckpointError",
    "allow",
    "allowed",
    "disallow",
    "doctor_rows",
    "downgrade_dcp",
    "inspect",
    "load",
    "plan_resume",
]

log = logging.getLogger("compatshim.checkpoint")

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ._downgrade import DowngradeError, DowngradeReport
    from ._inspect import CheckpointInfo
    from ._resume_plan import ResumePlan
    from .process_allow import Allowed


def load(
    f: Any,
    map_location: Any = None,
    *,
    allow: Iterable[Any] = (),
    trusted: bool = False,
    mmap: bool = False,
) -> Any:
    """Load a checkpoint without running code from it.

    ``f``: a path or a seekable binary file object. ``map_location``: as in
    ``torch.load`` (None keeps each storage's saved device; a str or
    ``torch.device`` moves all; a dict maps saved to new locations; a callable
    ``(storage, location) -> storage or None``). ``allow``: extra globals for
    this call, as objects, ``"module.name"`` strings or ``(object,
    "module.name")`` pairs; allowed classes are constructed and callables
    called with the file's arguments, and instances they make may receive
    state, but the classes and callables themselves never do;
    ``"omegaconf-resolver:NAME"`` lets loaded omegaconf configs keep
    ``${NAME:...}`` interpolations (refused by default, see ``_omegaconf.py``). ``mmap``: map
    tensor data from the file instead of reading it (zip format and safetensors; the
    legacy format raises CheckpointError). ``trusted=True`` is plain
    ``torch.load(weights_only=False)``: it RUNS ANY CODE IN THE FILE; use it
    only for files you made yourself. Hardened mode (``COMPATSHIM_SAFE_LOAD=1``, in force)
    overrides it: ``torch.load`` is then weights-only whatever it is asked, so the file is
    read as without ``trusted`` (a log line says so; a refusal warns at the caller's line).
    """
    for name, flag in (("trusted", trusted), ("mmap", mmap)):  # "false" is truthy: refused
        if flag is not True and flag is not False:
            raise TypeError(f"{name}: expected True or False, got {short(flag)}")
    if trusted:
        import sys

        import torch

        from .. import _settings

        patch = sys.modules.get("compatshim.patches.torch_load_safe_globals")
        if patch is not None and patch.hardened_in_force():  # torch.load is weights-only
            log.warning(
                "compatshim.checkpoint.load(trusted=True): trusted=True is not honoured: "
                "hardened mode (%s=1) is in force, so %s is loaded weights-only, as "
                "torch.load is",
                _settings.SAFE_LOAD,
                getattr(f, "name", f),
            )
        else:
            log.warning(
                "compatshim.checkpoint.load(trusted=True): %s is loaded with "
                "torch.load(weights_only=False), which runs any code in the file",
                getattr(f, "name", f),
            )
        return torch.load(f, map_location=map_location, weights_only=False, mmap=mmap)
    from ._load import load as safe_load

    return safe_load(f, map_location, allow=allow, mmap=mmap)


def allow(*globals: Any, reason: str) -> None:
    """Let every checkpoint load in this process use ``globals``: ``"module.name"`` strings
    (imported only when a file needs them), classes/functions, or ``(object, "module.name")``.

    Honoured by :func:`load` and by ``torch.load`` while compatshim's
    torch-load-safe-globals patch is applied (also in hardened mode,
    ``COMPATSHIM_SAFE_LOAD=1``). ``reason`` says why they are trusted. Allowed
    classes are constructed and functions called with the file's arguments:
    name only globals you trust. Idempotent and thread-safe.
    """
    from .process_allow import allow as add

    add(*globals, reason=reason)


def disallow(*globals: Any) -> None:
    """Undo :func:`allow` for ``globals`` (``COMPATSHIM_ALLOW``, the file and entry points stay)."""
    from .process_allow import disallow as remove

    remove(*globals)


def allowed() -> list[Allowed]:
    """Every process-wide entry (code, ``COMPATSHIM_ALLOW``, file, entry points), with reasons."""
    from .process_allow import allowed as entries

    return entries()


def doctor_rows() -> list[Any]:
    """``compatshim doctor`` rows: the allowlist, and torch's own loader where it is unsafe."""
    from .doctor import doctor_rows as rows

    return list(rows())


def inspect(f: Any) -> CheckpointInfo:
    """What ``f`` needs and holds, and what ``load`` does with it: ``load``'s own machine
    reads it with every storage on meta, so no tensor data is read (``_inspect``)."""
    from ._inspect import inspect as run

    return run(f)


def downgrade_dcp(src: Any, dst: Any, *, torch: str, link: bool = True) -> DowngradeReport:
    """Write ``dst``: the DCP folder ``src`` rewritten for torch release ``torch`` ("2.8"),
    or raise DowngradeError naming what that release cannot represent (``_downgrade``)."""
    from ._downgrade import downgrade_dcp as run

    return run(src, dst, torch=torch, link=link)


def plan_resume(
    folder: Any, state_dict: Any, optimizers: Any = None, *, hardened: bool = True
) -> ResumePlan:
    """The dry run of a DCP resume of ``folder`` into ``state_dict`` (or a function building
    it): what loads, what ``compatshim.optim.load_dcp`` fills, what is missing or refused
    (``_resume_plan``); ``.ok`` is False where the resume would fail. Reads no tensor data."""
    from ._resume_plan import plan_resume as run

    return run(folder, state_dict, optimizers, hardened=hardened)


def __getattr__(name: str) -> Any:
    if name == "CheckpointInfo":
        from ._inspect import CheckpointInfo

        return CheckpointInfo
    if name in ("DowngradeError", "DowngradeReport"):
        from . import _downgrade

        return getattr(_downgrade, name)
    if name == "ResumePlan":
        from ._resume_plan import ResumePlan

        return ResumePlan
    if name == "Allowed":
        from .process_allow import Allowed

        return Allowed
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
