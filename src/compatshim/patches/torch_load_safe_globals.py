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
    finds nothing to fix there, except in hardened mode (2.1+).

How it is detected
    The probe saves a small checkpoint holding an ``argparse.Namespace`` (and
    a numpy array when numpy is already imported; in torch's legacy format,
    which the same weights-only rule reads and which is cheaper to write inside
    ``import torch``) and loads it back with a plain ``torch.load``: the defect
    is present when torch refuses it. In
    hardened mode it is also present while ``torch.load(weights_only=False)``
    accepts a file naming ``builtins.len`` (torch's full unpickler runs).

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
    ``Namespace``. Outside hardened mode, ``weights_only=False`` calls
    (Lightning 2.4/2.5 and DeepSpeed pass it) and calls with a
    ``pickle_module`` are never touched; nothing ever sets ``weights_only=False``.

    When compatshim's loader refuses the file too, torch's original exception
    is re-raised (same type), with ``refused`` (the refused globals, a tuple);
    its message leads with what compatshim refused and how to allow a trusted
    global for every load in the process (``compatshim.checkpoint.allow``,
    ``COMPATSHIM_ALLOW``), then torch's own text (which names the first global
    torch met, maybe one compatshim covers), and a
    :class:`CheckpointRefusedWarning` is emitted, so a caller that swallows
    the error (accelerate 0.34) can no longer drop state silently. torch's
    message still says ``add_safe_globals``: PyTorch Geometric's
    ``fs.torch_load`` retries such a refusal with ``weights_only=False``,
    which this mode leaves alone; hardened mode is the answer there.

    compatshim's loader honours what ``torch.serialization.add_safe_globals``
    and ``safe_globals`` registered (as ``allow=``; the deny list still applies).

    Hardened mode (``COMPATSHIM_SAFE_LOAD=1`` when the patch applies; the
    start-up hook arms it whenever the variable is set, as ``compatshim.install()``
    does in a script): every call is
    weights-only, ``weights_only=False`` and ``pickle_module=`` included
    (pickle options are dropped: they only serve torch's full unpickler), and
    compatshim's loader reads every file first and alone, on every torch:
    torch's weights-only unpickler never sees a file, so its failures on
    hostile files (a deep tuple key overflows the C stack while hashing; a
    9-byte length claim raises a bare ``MemoryError``; code execution before
    2.6, CVE-2025-32434) cannot happen in this process. PyTorch Geometric's
    ``add_safe_globals`` registrations keep working.
    A refusal raises :class:`~compatshim.checkpoint.UnsafeCheckpointError`
    (a ``pickle.UnpicklingError``) with ``refused``, advice to allow
    process-wide, and never torch's wording. The probe then also asks
    whether ``weights_only=False`` still runs torch's full unpickler.

    Warnings raised inside the wrapper, torch's and compatshim's, name the
    line that called ``torch.load`` (see :func:`_skipped_by_warnings`).

    Why retry and not ``torch.serialization.add_safe_globals``: registering
    compatshim's allowlist changes what every ``weights_only=True`` load in
    the process accepts, including loads whose authors chose torch's strict
    default; it can only name objects whose modules are imported when the
    patch applies (Lightning and omegaconf usually are not, at torch import);
    and it does not cover everything (torch 2.13+'s unpickler refuses to
    SETITEM into an allow-listed ``AttributeDict``). The retry costs nothing
    on loads torch accepts (measured: bench/bench_torch_load_patch.py) and,
    on a refused load, a second read of the file, once per resume.

Limits of hardened mode
    ``torch.serialization._load`` and ``_legacy_load`` (the loaders inside
    ``torch.load``) refuse torch's full unpickler, so a ``torch.load``
    reference taken before ``compatshim.install()`` and
    ``torch.distributed._serialization._streaming_load(weights_only=False)``
    cannot run code either (that private stream reader still parses its own
    framing with torch's weights-only unpickler before the guard refuses); such a
    stale reference with ``weights_only=True``
    still reaches torch's weights-only unpickler (the start-up hook arms at
    ``import torch``, before any reference can be taken; armed later, the
    modules holding one are named once on stderr: :func:`_warn_stale`). Covered by their own
    patches, because they are not torch's loaders: ``numpy.load(allow_pickle=True)``
    (``numpy-load-hardened``) and ``torch.distributed.checkpoint``'s ``.metadata``
    (``torch-dcp-safe-metadata``). Not covered: plain ``pickle``. The doctor's
    ``checkpoint-safe-load`` row says so.

Confirmed
    Right after the fix, by :func:`confirm` (both attributes are the wrapper);
    end to end, by the probe through the wrapper, when ``status()`` or the
    doctor first asks (not inside ``import torch``: it loads the probe file
    with compatshim's loader).

The revert
    Every attribute gets the original function object back (Patcher), unless a
    library replaced it after compatshim (wrapping ``torch.load`` in turn): its
    object stays, and compatshim's wrapper under it hands every call to torch's
    function. A later ``install()`` wraps torch's function again, not that wrapper;
    while it is in force, every earlier wrapper (a ``torch.load`` reference taken
    under an earlier install) acts as it says, hardened or not.
"""

from __future__ import annotations

import threading

from .._engine.patching import in_force, mark, ours, wrapping
from ._safe_pickle import how_to_allow as _how_to_allow
from ._safe_pickle import refused_hardened

TYPE_CHECKING = False  # no ``typing`` import at run time (start-up path)
if TYPE_CHECKING:
    from types import ModuleType
    from typing import Any, Callable

    from .._engine.patching import Patcher

__all__ = ["CheckpointRefusedWarning"]

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
        global _config
        if _config is None:  # found once: an import statement per load costs a load's 5%
            try:
                from torch.utils.serialization import config as found
            except Exception:
                found = False  # torch < 2.5: no such config, mmap off by default
            _config = found
        try:
            mmap = _config is not False and _config.load.mmap
        except Exception:
            mmap = False
    return bool(mmap)


_config: Any = None  # torch.utils.serialization.config; False where torch has none


def _lead_with(refusal: BaseException, reason: str) -> None:
    """Put compatshim's ``reason`` (and remedy) first in torch's own error, torch's text after.

    torch's text names the first global its unpickler met, which may be one compatshim
    covers (``numpy._core.multiarray._reconstruct``), and advises ``weights_only=False``;
    compatshim's names the global that really stops the load. The error stays torch's
    object (its type, ``except`` clauses and PyG's ``add_safe_globals`` check still match).
    """
    refusal.args = (f"{reason}\n\ntorch's weights-only load refused it first: {refusal}",)


def _warn_refused(message: str) -> None:
    """One warning per refused load, at the first line outside compatshim that led to it:
    the line that called ``torch.load``, or ``compatshim.checkpoint.load(trusted=True)``
    (which calls ``torch.load``: a fixed ``stacklevel`` named compatshim's own line there).
    Under ``-W error`` it goes to stderr, never raises.
    """
    from .._warn import warn

    try:
        warn(message, CheckpointRefusedWarning)
    except Exception:
        import sys

        try:  # noqa: SIM105 (contextlib costs start-up time)
            sys.stderr.write(f"CheckpointRefusedWarning: {message}\n")
        except Exception:
            pass


def _record(event: str, detail: str) -> None:
    from .._engine import decisions

    decisions.record(_NAME, event, detail)


def _retry(
    front: ModuleType, f: Any, start: int | None, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """Read ``f`` (again) with compatshim's loader (``front``: ``checkpoint.request``);
    CheckpointError if it cannot (a refusal without ``checkpoint.load``'s advice: the
    caller words its own)."""
    if start is None and not isinstance(f, (str, bytes)) and not hasattr(f, "__fspath__"):
        from ..checkpoint.errors import CheckpointError, as_well

        try:  # torch's own check (_check_seekable): its error's type is torch's
            f.seek(f.tell())
            kind: type[BaseException] = OSError
        except Exception as exc:
            kind = type(exc)
        raise as_well(CheckpointError, kind)(  # torch's words, as its own check says them
            "the file object cannot be rewound to read it. You can only torch.load from a file "
            "that is seekable. Please pre-load the data into a buffer like io.BytesIO and try "
            "to load from it instead."
        )
    if start is not None:
        f.seek(start)
    global _last_request

    map_location = args[1] if len(args) > 1 else kwargs.get("map_location")
    allow, mmap, encoding = _torch_safe_globals(), _mmap(kwargs), kwargs.get("encoding")
    request = _last_request  # most loads ask what the one before asked: the same value again
    if (
        request is None
        or encoding is not None
        or request.map_location is not map_location
        or request.allow is not allow
        or request.mmap is not mmap
    ):
        request = front.Request(map_location, allow, mmap, encoding=encoding)
        if encoding is None:
            _last_request = request
    return front.read(f, request)


_last_request: Any = None  # a frozen Request; read and replaced whole, so thread-safe


def _torch_safe_globals() -> tuple[Any, ...]:
    """What ``torch.serialization.add_safe_globals`` / ``safe_globals`` registered (PyG
    registers its data classes), as ``allow=`` entries for compatshim's loader: a file
    torch's loader would accept for them loads here too. Globals compatshim's allowlist
    lists keep its checked handling; the deny list refuses what it always refuses.

    Worked out again only when the registrations change (see :func:`_registry`): every
    hardened ``torch.load`` asks, and working them out costs more than a small load's
    pickle. What it gives depends on nothing else but the installed releases.
    """
    import sys

    global _known

    registry = _registry(sys.modules.get("torch._weights_only_unpickler"))
    if registry is None:  # a layout this code does not know: read through torch's API
        get = _attribute(sys.modules.get("torch.serialization"), "get_safe_globals")
        return () if get is None else _not_listed(get())  # torch < 2.4: no registrations
    snapshot = tuple(registry)
    known = _known
    try:
        if known is not None and known[0] == snapshot:  # the same objects: no __eq__ runs
            return known[1]
    except Exception:  # a registered object's own comparison failed: work it out again
        pass
    found = _not_listed(snapshot)
    _known = (snapshot, found)
    return found


# the registrations last worked out, and what they gave
_known: tuple[tuple[Any, ...], tuple[Any, ...]] | None = None


def _registry(unpickler: ModuleType | None) -> Any:
    """torch's own container of registrations (a set from torch 2.6, which each change
    replaces; a list in 2.4-2.5, which ``get_safe_globals`` hands out and ``+=`` extends),
    or None where neither is found. Compared by content, so a change in place counts."""
    for name in ("_marked_safe_globals_set", "_marked_safe_globals_list"):
        found = _attribute(unpickler, name)
        if isinstance(found, (set, list)):
            return found
    return None


def _attribute(module: ModuleType | None, name: str) -> Any:
    """``module.name``, or None, read from the module's namespace: a getattr that fails
    builds an AttributeError and its message (0.5-0.6 us), and on torch < 2.6 every
    hardened load asked for names its torch lacks (2.3 us a load on torch 2.1). A module
    with a ``__getattr__`` (PEP 562) is asked the usual way."""
    if module is None:
        return None
    namespace = vars(module)
    found = namespace.get(name)
    if found is None and "__getattr__" in namespace:
        found = getattr(module, name, None)
    return found


def _not_listed(registered: Any) -> tuple[Any, ...]:
    """The registrations compatshim's allowlist does not cover (on this release)."""
    from ..checkpoint.allowlist import covering

    found = []
    for item in registered:
        if isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], str):
            name = item[1]
        else:
            name = f"{getattr(item, '__module__', '')}.{getattr(item, '__qualname__', '')}"
        entry = covering(*name.rpartition(".")[::2])
        if entry is None or not entry.applies():
            found.append(item)
    return tuple(found)


def _through_compatshim(
    f: Any,
    start: int | None,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    refusal: BaseException | None,
    hardened: bool,
) -> Any:
    """Load what torch refused (``refusal``) or, hardened, every file.

    A refusal by compatshim too raises torch's own error with ``refused`` and a
    note when not hardened; hardened, compatshim's error (never torch's wording).
    """
    global _front
    if _front is None:  # imported at the first load, kept: not at start-up, not per load
        from ..checkpoint import request

        _front = request
    front = _front
    try:
        loaded = _retry(front, f, start, args, kwargs)
    except front.CheckpointError as why:
        if isinstance(why, UnicodeDecodeError):  # as plain torch: a caller's latin1 retry runs
            raise
        what = _describe(f)
        refused = tuple(getattr(why, "refused", ()))
        text = f"{type(why).__name__}: {why}"
        # torch's own type too (errors.as_well): a failure torch has as well (a device this
        # machine lacks, out of memory, an invalid sparse tensor), not compatshim's refusal
        failed_as_torch = getattr(type(why), "_kind", None) is not None
        _record("failed" if failed_as_torch else "refused", f"{what}: {text}")
        if hardened or refusal is None:
            if not failed_as_torch:
                _warn_refused(
                    f"torch.load of {what} refused by compatshim (COMPATSHIM_SAFE_LOAD=1): "
                    f"{text}; whatever was to be loaded from it is missing, even if the "
                    "caller carries on"
                )
            raise refused_hardened(why, what) from None
        if failed_as_torch:  # damage torch failed on too (a pickle cut short): torch's error
            raise refusal from None
        refusal.refused = refused  # type: ignore[attr-defined]
        _lead_with(refusal, f"compatshim.checkpoint.load: {text}.{_how_to_allow(refused)}")
        _warn_refused(
            f"torch.load refused {what} (weights-only) and compatshim.checkpoint.load "
            f"refused it too ({text}); whatever was to be loaded from it is missing, "
            "even if the caller carries on"
        )
        raise refusal from None
    if refusal is not None:  # hardened, every load comes here: not recorded
        _record(
            "retried", f"{_describe(f)}: torch refused it, compatshim.checkpoint.load loaded it"
        )
    return loaded


_front: Any = None  # compatshim.checkpoint.request


def _skipped_by_warnings(function: Callable[..., Any]) -> None:
    """Make ``warnings`` pass over ``function``'s frames, as if callers called torch.load itself.

    A warning's ``stacklevel`` counts frames, so with a wrapper in between, torch's
    own warnings (``stacklevel=2`` in ``torch.load``) would name the wrapper's line.
    CPython skips frames whose file name holds "importlib" and "_bootstrap" when it
    counts (3.9-3.14, C and Python ``warnings`` alike; thread-safe, unlike catching
    and re-emitting); the wrapper's code gets such a name, and linecache the real
    lines under it, so tracebacks still show its source.
    """
    import linecache

    code = function.__code__
    name = f"{code.co_filename} (a frame warnings skip, as importlib._bootstrap's)"
    loader = getattr(__spec__, "loader", None)
    if hasattr(loader, "get_source"):  # read when a traceback needs it, as linecache.lazycache
        linecache.cache[name] = (lambda: loader.get_source(__name__),)  # type: ignore[union-attr]
    function.__code__ = code.replace(co_filename=name)


#: (token, hardened) of each apply in force, the latest last (one at a time: the registry)
_in_force: list[tuple[object, bool]] = []
#: ``load`` True while a wrapper of ours calls torch's load in this thread
_inside = threading.local()


def hardened_in_force() -> bool:
    """Whether ``torch.load`` is hardened now (the apply in force is): then
    ``checkpoint.load(trusted=True)`` does not run the file's code, and says so."""
    return bool(_mode_in_force())


def _mode_in_force() -> bool | None:
    """Whether the apply in force is hardened; None when none is."""
    try:
        return _in_force[-1][1]
    except IndexError:  # read without a lock: emptied meanwhile
        return None


def _wrap(original: Callable[..., Any], hardened: bool, patcher: Patcher) -> Callable[..., Any]:
    """``torch.load`` that retries torch's weights-only refusals through compatshim's loader.

    ``hardened``: compatshim's loader reads every file first and alone (torch's
    weights-only unpickler never sees it: its crashes on hostile files would be ours).
    Once ``patcher`` is reverted it acts as the apply in force says (a ``torch.load``
    reference taken under an earlier install stays hardened through a re-install), except
    when a wrapper of ours in this thread is already calling torch (a library's wrapper
    sits between the two: one retry, one warning); with none in force it is torch's
    ``load`` (a library that wrapped it may hold it).
    """
    import functools
    import pickle

    @functools.wraps(original)
    def load(*args: Any, **kwargs: Any) -> Any:
        if patcher.live:
            mode: bool | None = hardened
        elif getattr(_inside, "load", False):  # under the wrapper in force (a library's
            mode = None  # wrapper between): that one retries, once
        else:
            mode = _mode_in_force()
        if mode is None:
            return original(*args, **kwargs)
        f = args[0] if args else kwargs.get("f")
        start = _position(f)
        if mode:
            return _through_compatshim(f, start, args, kwargs, None, True)
        outer = getattr(_inside, "load", False)
        _inside.load = True
        try:
            return original(*args, **kwargs)
        except pickle.UnpicklingError as refusal:
            if not _was_weights_only(kwargs, args):
                raise
            return _through_compatshim(f, start, args, kwargs, refusal, False)
        finally:
            _inside.load = outer

    _skipped_by_warnings(load)
    return ours(mark(load, __compatshim_hardened__=hardened), original, patcher)


def _guard_inner(original: Callable[..., Any], name: str, patcher: Patcher) -> Callable[..., Any]:
    """Hardened: ``torch.serialization._load`` / ``_legacy_load`` (what ``torch.load`` runs
    inside, also called directly by ``torch.distributed._serialization`` and reached through
    a ``torch.load`` reference taken before ``install()``) refuse torch's full unpickler."""
    import functools
    import sys

    @functools.wraps(original)
    def inner(*args: Any, **kwargs: Any) -> Any:
        if not patcher.live and not _mode_in_force():  # as load's wrapper: see _wrap
            return original(*args, **kwargs)
        pickle_module = args[2] if len(args) > 2 else kwargs.get("pickle_module")
        weights_only = sys.modules.get("torch._weights_only_unpickler")
        if pickle_module is None or pickle_module is not weights_only:
            from ..checkpoint import UnsafeCheckpointError

            raise UnsafeCheckpointError(
                f"torch.serialization.{name} with the unpickler {_describe(pickle_module)} "
                "refused: COMPATSHIM_SAFE_LOAD=1, and it runs any code in a file (a torch.load "
                "reference taken before compatshim.install(), or torch's private loaders); "
                "call torch.load, or compatshim.checkpoint.load",
                (f"torch.serialization.{name}",),
            )
        return original(*args, **kwargs)

    return ours(inner, original, patcher)


def _saved(torch: ModuleType, payload: Any, name: str) -> Any:
    """``payload`` as ``torch.save`` writes it, in memory, named ``name``.

    torch's legacy format where this torch still writes it: the zip writer's first
    use imports and parses torch's serialization config (~1 ms inside ``import
    torch``), and ``torch.load`` runs the same unpickler, weights-only or not, on
    both formats. A torch that no longer writes it gets the zip format.
    """
    import io

    buffer = io.BytesIO()
    try:
        torch.save(payload, buffer, _use_new_zipfile_serialization=False)
    except TypeError:  # the private switch is gone
        buffer = io.BytesIO()
        torch.save(payload, buffer)
    buffer.seek(0)
    # When the registry probes again through the wrapper, it retries and records it:
    # the decision then names the probe rather than "<_io.BytesIO object at 0x...>".
    buffer.name = name
    return buffer


def _probe_file() -> Any:
    import argparse
    import sys

    import torch

    payload: dict[str, Any] = {"hparams": argparse.Namespace(lr=0.1)}
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        payload["numpy"] = numpy.zeros(2)
    return _saved(torch, payload, "the patch's own probe checkpoint")


def _full_unpickler_runs(torch: ModuleType) -> bool:
    """Hardened mode's defect: ``torch.load(weights_only=False)`` runs torch's full unpickler.

    The probe file names ``builtins.len`` (harmless: nothing is called), which
    neither weights-only loader accepts.
    """
    import pickle

    buffer = _saved(torch, {"probe": len}, "the patch's own hardened-mode probe checkpoint")
    try:
        torch.load(buffer, weights_only=False, mmap=False)
    except pickle.UnpicklingError:
        return False
    return True


def probe(torch: ModuleType) -> bool:
    """True while a plain ``torch.load`` refuses a checkpoint holding a Namespace (and numpy),
    or, with ``COMPATSHIM_SAFE_LOAD=1``, while ``weights_only=False`` can run code."""
    import pickle
    import warnings

    from .. import _settings

    buffer = _probe_file()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch 2.4/2.5 warn about their weights_only=False default
        if _settings.safe_load() and _full_unpickler_runs(torch):
            return True
        try:  # mmap as torch defaults it, given: reading torch's config costs ~1 ms here
            torch.load(buffer, mmap=False)
        except pickle.UnpicklingError:
            return True
    return False


def confirm(torch: ModuleType) -> bool:
    """The fix is in place: ``torch.load`` and ``torch.serialization.load`` are the wrapper.

    Run right after :func:`apply`, inside the user's ``import torch``: the probe
    through the wrapper would load its file with compatshim's loader, importing
    most of ``compatshim.checkpoint``. The registry runs the probe when
    ``status()`` (or the doctor) first asks; that is what ``fixed`` reports.
    """
    from torch import serialization

    return all(in_force(vars(owner).get("load")) for owner in (torch, serialization))


def _warn_stale(original: Callable[..., Any], owners: tuple[ModuleType, ...]) -> None:
    """Say, once and on stderr, which modules hold the ``torch.load`` of before hardening.

    Armed inside ``import torch`` (the start-up hook) no other code can hold it. Armed
    later (``compatshim.install()`` after ``import torch``), a ``from torch import load``
    taken before keeps torch's function: its ``weights_only=False`` loads are refused (see
    :func:`_guard_inner`), but its weights-only loads reach torch's own unpickler, whose
    failures on hostile files hardened mode exists to avoid. Only module-level names are
    looked for (``gc.get_referrers``, ~50 ms, paid only on this late path).
    """
    import gc
    import sys

    from .._engine.safe_load import loud

    skip = {id(vars(owner)) for owner in owners}
    holders: dict[int, str] = {}
    for name, module in list(sys.modules.items()):  # the first name of an alias (__main__)
        if module is not None:
            holders.setdefault(id(vars(module)), name)
    found = sorted(
        holders[id(ref)]
        for ref in gc.get_referrers(original)
        if id(ref) in holders and id(ref) not in skip
    )
    if found:
        loud(
            "stale torch.load",
            "COMPATSHIM_SAFE_LOAD=1 is NOT fully in force in this process: "
            f"{', '.join(found)} took torch.load before compatshim armed hardened mode, and its "
            "weights-only loads still reach torch's own unpickler (weights_only=False ones are "
            "refused). Arm before import torch: compatshim installed in this environment with "
            "COMPATSHIM_SAFE_LOAD=1 set at start, or compatshim.install() first.",
        )


def apply(torch: ModuleType, patcher: Patcher) -> None:
    from torch import serialization

    from .. import _settings

    hardened = _settings.safe_load()
    wrapped: dict[int, Callable[..., Any]] = {}
    for owner in (torch, serialization):
        original = wrapping(vars(owner)["load"])
        if original is None:
            continue  # ours, in force (applied twice by hand): wrapping again would nest
        replacement = wrapped.setdefault(id(original), _wrap(original, hardened, patcher))
        patcher.setattr(owner, "load", replacement)
    if wrapped:  # this apply is the one in force: earlier wrappers act as it says
        entry = (object(), hardened)
        _in_force.append(entry)
        patcher.on_revert(lambda: _in_force.remove(entry))
    if hardened:
        from .._engine import import_hooks

        if import_hooks.finishing() is None:  # armed after torch's import: look for old copies
            _warn_stale(vars(serialization)["load"].__compatshim_original__, (torch, serialization))
        for name in ("_load", "_legacy_load"):
            inner = wrapping(vars(serialization).get(name))
            if callable(inner):
                patcher.setattr(serialization, name, _guard_inner(inner, name, patcher))
