"""The patch registry: version-gated, probe-confirmed, reversible import-time patches.

``install()`` reads the patch catalogue (one table of declarations,
:data:`compatshim.patches.CATALOGUE`) and arms post-import hooks; no patch's
code and no framework is imported. When a
target module and its parent packages have finished importing, the hook reads
the installed version from metadata, runs the patch's probe against the live
module, applies the fix only when the defect is really there, and probes again
to confirm it (a patch whose probe is costly through its fix checks its changes
cheaply instead, and the probe confirms it when ``status()`` first asks:
:class:`~compatshim._engine.patch.Patch`).

Promises, and how they are kept:

- Nothing compatshim does inside a user's import raises into it: every step
  of a hook is guarded, warnings go through :func:`decisions.warn` (which
  cannot raise under ``-W error``), and a broken install warns once and stays
  disarmed.
- Thread safety without deadlock: ``_lock`` guards only this module's tables
  and is never held while probing, applying, importing or warning. A hook
  claims its (patch, target) under the lock, works without it, and records the
  outcome under it again; if the patch was uninstalled meanwhile, the hook
  reverts its own change. ``uninstall()`` waits for hooks still working.
- Exact revert: every change goes through a :class:`~compatshim._engine.patching.Patcher`.
"""

from __future__ import annotations

import sys
from _thread import RLock, get_ident

from .. import _settings
from . import decisions, import_hooks
from .patching import Patcher

TYPE_CHECKING = False  # no ``typing`` import at run time: ``import compatshim.auto`` stays cheap
if TYPE_CHECKING:
    from types import ModuleType
    from typing import Callable, Iterable

    from .._records import PatchStatus, Position
    from .patch import Patch

_WAIT_FOR_HOOKS_S = 30.0
_IMPORT_RACE_S = 2.0  # how long to wait for another thread's import (import_hooks.half_built)


class _State:
    """What the registry knows about one patch in this process."""

    def __init__(self, patch: Patch) -> None:
        self.name = patch.name
        self.patch = patch
        self.armed = False
        self.generation = 0
        self.patcher = Patcher()
        self.claimed: set[str] = set()  # targets decided, or being decided, this generation
        #: (thread, generation) of each hook working on a target outside the lock
        self.workers: list[tuple[int, int]] = []
        self.applied_targets: list[str] = []
        self.defect: dict[str, bool] = {}  # target -> present before the fix
        self.fixed: dict[str, bool] = {}  # target -> probe passes after the fix
        self.unconfirmed: dict[str, ModuleType] = {}  # target -> module its probe is yet to pass
        self.position: Position | None = None
        self.version_note: str | None = None
        self.error: str | None = None
        self.hooks: dict[str, Callable[[ModuleType], None]] = {}

    @property
    def targets(self) -> tuple[str, ...]:
        return self.patch.targets

    def reset_outcomes(self) -> None:
        self.claimed.clear()
        self.applied_targets.clear()
        self.defect.clear()
        self.fixed.clear()
        self.unconfirmed.clear()
        self.error = None


class _Outcome:
    """What one hook found for one target; recorded under the lock afterwards."""

    def __init__(self) -> None:
        self.position: Position | None = None
        self.version_note: str | None = None
        self.defect: bool | None = None
        self.fixed: bool | None = None
        self.checked = False  # the patch's own check ran after apply, not its probe
        self.unconfirmed = False  # fixed by that check; the probe is yet to run
        self.patcher: Patcher | None = None
        self.error: str | None = None
        self.race: str | None = None  # the half-built module the error met (another import)

    def failed(self, error: str, exc: BaseException) -> _Outcome:
        self.error = error
        self.race = import_hooks.half_built(exc)
        return self


_lock = RLock()
_states: dict[str, _State] = {}
_loaded = False


def _no_catalogue() -> tuple[Patch, ...]:
    return ()


#: the built-in patches, read on first use: ``compatshim/__init__.py`` points this at
#: ``compatshim.patches.CATALOGUE`` (the engine imports nothing above itself)
catalogue: Callable[[], Iterable[Patch]] = _no_catalogue


# -- the catalogue -----------------------------------------------------------------------------
def _load() -> dict[str, _State]:
    """Every catalogue patch as a state (a table of declarations: nothing else is imported)."""
    global _loaded
    if not _loaded:
        patches = catalogue()
        with _lock:
            for patch in patches:
                _states.setdefault(patch.name, _State(patch))
            _loaded = True
    return _states


def register(patch: Patch) -> None:
    """Add a patch to the catalogue (the built-in ones come from ``compatshim.patches``)."""
    states = _load()
    with _lock:
        if patch.name in states and states[patch.name].patch is not patch:
            raise ValueError(f"a different patch named {patch.name!r} is already registered")
        states.setdefault(patch.name, _State(patch))


def unregister(name: str) -> None:
    """Uninstall and drop a patch from the catalogue."""
    if name in _load():
        uninstall([name])
        with _lock:
            _states.pop(name, None)


# -- selection ---------------------------------------------------------------------------------
def _names(names: Iterable[str] | str | None, argument: str) -> list[str] | None:
    """A bare string is one name (``exclude="torch-processgroup-copy"``), never its letters;
    anything else is a TypeError naming ``argument``, not one from deep inside ``list()``."""
    if names is None:
        return None
    if isinstance(names, str):
        return [names]
    from .._text import short  # here, not at the top: importing it costs start-up ``typing``

    if isinstance(names, (bytes, bytearray)):  # would iterate as ints
        raise TypeError(f"{argument}: expected a patch name or names (str), got {short(names)}")
    try:
        iterator = iter(names)
    except TypeError:
        raise TypeError(
            f"{argument}: expected a patch name (str), an iterable of them or None, "
            f"got {short(names)}"
        ) from None
    listed = list(iterator)
    bad = [n for n in listed if not isinstance(n, str)]
    if bad:
        raise TypeError(f"{argument}: patch names must be strings, got {short(bad[0])}")
    return listed


def _select(names: list[str] | None) -> list[_State]:
    states = _load()
    if names is None:
        return list(states.values())
    unknown = sorted(set(names) - set(states))
    if unknown:
        raise ValueError(f"unknown patch name(s) {unknown}; known: {sorted(states)}")
    return [states[n] for n in names]


def _canonical(name: str) -> str:
    return name.strip().lower().replace("_", "-")


def disable_entries(known: Iterable[str]) -> list[tuple[str, str | None]]:
    """Each ``COMPATSHIM_DISABLE`` entry with the patch of ``known`` it names (spelling slips
    honoured: case, ``_`` for ``-``), or None: the one reading the registry and doctor share."""
    by_canonical = {_canonical(name): name for name in known}
    return [(raw, by_canonical.get(_canonical(raw))) for raw in _settings.disabled_names()]


def _disabled_by_env(known: Iterable[str]) -> set[str]:
    """Names in ``COMPATSHIM_DISABLE``; spelling slips are honoured, unknown names warned about."""
    known = sorted(known)
    disabled = set()
    for raw, name in disable_entries(known):
        if name is not None:
            disabled.add(name)
        if name != raw:
            what = f"taken as {name!r}" if name else "matches no patch; ignored"
            decisions.warn_once(
                "registry",
                f"env:{raw}",
                f"compatshim: {_settings.DISABLE} entry {raw!r} {what}; known patches: "
                f"{', '.join(known)}",
            )
    return disabled


def missing_dependency() -> str | None:
    """Why no patch can be armed here (``packaging``, the one runtime dependency, does not
    import), with the command that mends it; None when it imports."""
    try:
        import packaging  # noqa: F401  (the package only: its submodules load inside hooks)
    except Exception as exc:
        import shlex

        return (
            f"its dependency packaging does not import ({type(exc).__name__}: {exc}): "
            f"{shlex.quote(sys.executable)} -m pip install packaging"
        )
    return None


# -- what a hook does --------------------------------------------------------------------------
def _decide(patch: Patch, target: str, module: ModuleType, *, apply: bool = True) -> _Outcome:
    """Gate, probe, then (when ``apply``) apply and confirm, for one target. Never raises."""
    from .versions import installed_version, position

    outcome = _Outcome()
    distribution = patch.distribution_for(target)
    version = installed_version(distribution)
    try:
        outcome.position, outcome.version_note = position(
            distribution, version, patch.requires, patch.tested
        )
    except Exception as exc:  # packaging unusable: the version cannot gate, so nothing applies
        return outcome.failed(
            f"version check failed for {distribution} {version}: {_describe(exc)}", exc
        )
    if outcome.position == "unsupported":
        return outcome
    try:
        probe = patch.probe  # the first use imports the patch's fix module
    except Exception as exc:
        return outcome.failed(
            f"fix module {patch.fix_module} failed to load: {_describe(exc)}", exc
        )
    try:
        with decisions.probing(patch.name):
            outcome.defect = bool(probe(module))
    except Exception as exc:  # a probe that cannot decide leaves the module alone
        return outcome.failed(f"probe failed on {target}: {_describe(exc)}", exc)
    if not outcome.defect or not apply:
        return outcome
    patcher = Patcher()
    try:
        patch.apply(module, patcher)
        confirm = patch.confirm
        if confirm is None:
            with decisions.probing(patch.name):
                outcome.fixed = not patch.probe(module)
        else:  # cheap now; the probe confirms it end to end when status() asks
            outcome.checked = True
            outcome.fixed = bool(confirm(module))
            outcome.unconfirmed = outcome.fixed
    except Exception as exc:
        failure: BaseException = exc
        try:
            patcher.revert()
        except Exception as revert_exc:  # worse: say so rather than claim "unchanged"
            failure = revert_exc
        return outcome.failed(
            f"could not be applied to {target} ({distribution} {version}): "
            f"{_describe(failure)}; the module is left unchanged",
            exc,
        )
    outcome.patcher = patcher
    return outcome


def _settled(patch: Patch, target: str, module: ModuleType, *, apply: bool = True) -> _Outcome:
    """:func:`_decide`, again after a short wait when another thread's import raced it.

    A probe, or packaging's import, that runs while another thread is importing
    the same standard modules can be handed a half-built module (importlib's
    deadlock avoidance) and fail for no reason of its own. The race ends when the
    other import does, so the decision is retried for up to ``_IMPORT_RACE_S``.
    """
    import time

    outcome = _decide(patch, target, module, apply=apply)
    deadline = time.monotonic() + _IMPORT_RACE_S
    delay = 0.005
    while outcome.race is not None and time.monotonic() < deadline:
        time.sleep(delay)
        delay = min(delay * 2, 0.1)
        outcome = _decide(patch, target, module, apply=apply)
    return outcome


def _describe(exc: BaseException) -> str:
    try:
        return f"{type(exc).__name__}: {exc}"
    except Exception:
        return type(exc).__name__


def _on_import(state: _State, target: str, module: ModuleType) -> None:
    """The hook: claim, decide without the lock, record. Runs inside the user's import."""
    patch = state.patch
    with _lock:
        if not state.armed or target in state.claimed:
            return
        state.claimed.add(target)
        generation = state.generation
        worker = (get_ident(), generation)
        state.workers.append(worker)
    outcome = _Outcome()
    try:
        # hooks of an earlier install, uninstalled while they work, revert their changes when
        # done: a probe before that would run through a fix about to vanish, find no defect,
        # and leave the patch armed but unapplied
        _wait_for_hooks([state], before=generation)
        outcome = _settled(patch, target, module)
    finally:
        try:
            with _lock:
                current = state.armed and state.generation == generation
                if current:
                    _record(state, target, outcome, module)
            if not current and outcome.patcher is not None:
                outcome.patcher.revert()  # uninstalled while this hook worked
        finally:
            with _lock:  # only now: newer hooks and uninstall() wait for this revert
                state.workers.remove(worker)
    _report(state.name, target, outcome, applied=current)


def _record(state: _State, target: str, outcome: _Outcome, module: ModuleType | None) -> None:
    state.position = outcome.position
    state.version_note = outcome.version_note
    if outcome.error is not None:
        state.error = outcome.error
    if outcome.defect is not None:
        state.defect[target] = outcome.defect
    if outcome.patcher is not None:
        state.patcher.on_revert(outcome.patcher.revert)
        state.applied_targets.append(target)
        state.fixed[target] = bool(outcome.fixed)
        if outcome.unconfirmed and module is not None:
            state.unconfirmed[target] = module


def _report(name: str, target: str, outcome: _Outcome, *, applied: bool) -> None:
    if outcome.position == "unsupported":
        decisions.record(name, "left alone", f"{target}: outside the releases the patch supports")
    elif outcome.error is not None:
        decisions.record(name, "failed", outcome.error)
        decisions.warn_once(
            "registry", f"{name}:{outcome.error}", f"compatshim: patch {name!r} {outcome.error}"
        )
    elif outcome.defect is False:
        decisions.record(name, "defect absent", target)
    elif outcome.patcher is not None and applied:
        note = "" if outcome.position == "tested" else f"; {outcome.version_note or 'untested'}"
        if outcome.unconfirmed:
            note = f"; changes in place, the probe confirms on status(){note}"
        decisions.record(name, "applied", f"{target}, fixed={outcome.fixed}{note}")
        if not outcome.fixed:
            _warn_unfixed(name, target, "its changes are not in place" if outcome.checked else "")


def _warn_unfixed(name: str, target: str, why: str = "") -> None:
    decisions.warn_once(
        "registry",
        f"{name}:unfixed",
        f"compatshim: patch {name!r} applied to {target} but "
        f"{why or 'its probe still finds the defect'}",
    )


def _confirm(states: list[_State]) -> None:
    """Run the probe, through the fix, for targets a patch's own check confirmed at import.

    Same guards as a hook: outside the lock, never raises; a probe that meets
    another thread's half-built import leaves the target to the next call.
    """
    with _lock:
        work = [
            (state, target, module, state.generation)
            for state in states
            if state.armed
            for target, module in state.unconfirmed.items()
        ]
    for state, target, module, generation in work:
        error = None
        try:
            with decisions.probing(state.name):
                fixed = not state.patch.probe(module)
        except Exception as exc:
            if import_hooks.half_built(exc) is not None:
                continue
            fixed, error = False, f"probe failed on {target} after the fix: {_describe(exc)}"
        with _lock:
            if state.generation != generation or state.unconfirmed.pop(target, None) is None:
                continue  # uninstalled meanwhile, or another thread confirmed it
            state.fixed[target] = fixed
            if error is not None:
                state.error = error
        decisions.record(
            state.name, "confirmed" if fixed else "not fixed", f"{target}, by the probe"
        )
        if error is not None:
            decisions.warn_once(
                "registry", f"{state.name}:{error}", f"compatshim: patch {state.name!r} {error}"
            )
        elif not fixed:
            _warn_unfixed(state.name, target)


# -- public API --------------------------------------------------------------------------------
def install(
    include: Iterable[str] | str | None = None, exclude: Iterable[str] | str | None = None
) -> list[str]:
    """Arm every selected patch; return the names armed.

    Nothing is imported but compatshim's own patch modules: each patch applies
    when its target module is imported (at once if it already is). Installing
    twice is installing once. ``COMPATSHIM_DISABLE=name,name`` removes patches
    from the selection; a bare string for ``include``/``exclude`` is one name.
    ``exclude`` leaves a patch unarmed; one armed before (``COMPATSHIM_AUTO=1``, an
    earlier ``install()``) stays armed, with a warning: ``uninstall(name)`` disarms it.
    A patch ``include`` names that ``COMPATSHIM_DISABLE`` names too stays unarmed, with a
    warning (an explicit request is not dropped silently).
    """
    return _install(include, exclude, tell_disabled=True)


def _install(
    include: Iterable[str] | str | None, exclude: Iterable[str] | str | None, tell_disabled: bool
) -> list[str]:
    """:func:`install`; ``tell_disabled`` False for a caller that says itself which of the
    patches it asked for ``COMPATSHIM_DISABLE`` kept off (``safe_load.arm``, on stderr)."""
    include_names, exclude_names = _names(include, "include"), _names(exclude, "exclude")
    missing = missing_dependency()
    if missing is not None:
        decisions.warn_once("registry", "dependencies", f"compatshim: no patch is armed: {missing}")
        return []
    selected = _select(include_names)
    _select(exclude_names or [])  # validate explicit names
    disabled = _disabled_by_env(_states)
    excluded = set(exclude_names or ()) | disabled
    if include_names is not None and tell_disabled:  # asked for by name, kept off by the env
        for name in dict.fromkeys(s.name for s in selected):
            if name in disabled and name not in (exclude_names or ()):
                decisions.warn(
                    f"compatshim: install(include=...) leaves {name!r} unarmed: "
                    f"{_settings.DISABLE} names it; remove it there to arm it"
                )
    armed: list[str] = []
    to_settle: list[str] = []
    with _lock:
        still = [name for name in dict.fromkeys(exclude_names or ()) if _states[name].armed]
        for state in selected:
            if state.name in excluded:
                continue
            armed.append(state.name)
            if state.armed:
                continue
            state.armed = True
            state.generation += 1
            state.reset_outcomes()
            for target in state.targets:

                def hook(module: ModuleType, state: _State = state, target: str = target) -> None:
                    _on_import(state, target, module)

                state.hooks[target] = hook
                import_hooks.register(target, hook)
                to_settle.append(target)
            decisions.record(state.name, "armed", ", ".join(state.targets))
    for name in still:  # the caller asked for it off: say that it is on, and how to end it
        decisions.warn(
            f"compatshim: install(exclude=...) leaves {name!r} armed: it was armed before this "
            f"call (COMPATSHIM_AUTO=1, import compatshim.auto or an earlier install()); "
            f"compatshim.uninstall({name!r}) disarms it"
        )
    import_hooks.settle(to_settle)
    return armed


def uninstall(names: Iterable[str] | str | None = None) -> list[str]:
    """Disarm patches and restore the original objects exactly; return the names undone."""
    undone: list[_State] = []
    with _lock:
        for state in _select(_names(names, "names")):
            if not state.armed:
                continue
            for target, hook in state.hooks.items():
                import_hooks.discard(target, hook)
            state.hooks.clear()
            state.armed = False
            state.generation += 1
            state.patcher.revert()
            state.reset_outcomes()
            undone.append(state)
            decisions.record(state.name, "uninstalled")
    _wait_for_hooks(undone)
    names_undone = [state.name for state in undone]
    if names_undone:
        from .safe_load import disarmed

        disarmed(names_undone)
    return names_undone


def _wait_for_hooks(states: list[_State], before: int | None = None) -> None:
    """Let the hooks of ``states`` (of a generation before ``before``, if given) still working
    in other threads finish, and revert themselves if stale; at most ``_WAIT_FOR_HOOKS_S``.
    Never this thread's own: an import inside its apply would wait for itself."""
    me = get_ident()

    def busy() -> bool:
        with _lock:
            return any(
                thread != me and (before is None or generation < before)
                for state in states
                for thread, generation in state.workers
            )

    if not busy():
        return
    import time

    deadline = time.monotonic() + _WAIT_FOR_HOOKS_S
    while busy() and time.monotonic() < deadline:
        time.sleep(0.001)


def armed() -> list[str]:
    """The names armed in this process (by ``install()`` or the start-up hook); cheap: no
    probe, no metadata read (the doctor asks what its own start-up armed)."""
    with _lock:
        return sorted(name for name, state in _states.items() if state.armed)


def probe_unarmed() -> None:
    """Probe patches that are not armed (disabled), so the doctor can say "present, not fixed".

    Same version gate and guards as a hook; nothing is applied. Targets must
    already be imported: nothing is imported here.
    """
    for state in list(_load().values()):
        patch = state.patch
        with _lock:
            if state.armed:
                continue
        for target in patch.targets:
            module = import_hooks.ready(target)
            if module is None:
                continue
            outcome = _settled(patch, target, module, apply=False)
            with _lock:
                if not state.armed:
                    _record(state, target, outcome, None)  # no patcher: nothing applied


def status() -> list[PatchStatus]:
    """One :class:`~compatshim._records.PatchStatus` per patch; never raises for one bad patch."""
    import time

    deadline = time.monotonic() + _IMPORT_RACE_S
    while True:
        try:
            return _status()
        except (ImportError, AttributeError) as exc:  # see _settled: another thread's import
            if import_hooks.half_built(exc) is None or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def _status() -> list[PatchStatus]:
    from .._records import PatchStatus

    import_hooks.run_due()
    disabled = _disabled_by_env(_load())
    rows: list[PatchStatus] = []
    with _lock:
        states = list(_states.values())
    _confirm(states)
    for state in states:
        with _lock:
            rows.append(_status_row(PatchStatus, state, state.name in disabled))
    return rows


def _status_row(record: type[PatchStatus], state: _State, disabled: bool) -> PatchStatus:
    from .versions import installed_version, position

    patch = state.patch
    distribution, version = _installed(patch)
    where, note = state.position, state.version_note
    if where is None and note is None:
        try:
            where, note = position(distribution, version, patch.requires, patch.tested)
        except Exception as exc:
            note = f"version check failed: {_describe(exc)}"
    if version is None:
        version = installed_version(distribution)
    defect = "not probed"
    if state.defect:
        defect = "present" if any(state.defect.values()) else "absent"
    return record(
        name=patch.name,
        description=patch.description,
        distribution=distribution,
        installed_version=version,
        requires=patch.requires,
        tested=patch.tested,
        range_position=where,
        armed=state.armed,
        disabled=disabled,
        targets=list(patch.targets),
        targets_imported=[t for t in patch.targets if t in sys.modules],
        defect=defect,  # type: ignore[arg-type]
        applied=bool(state.applied_targets),
        applied_targets=list(state.applied_targets),
        fixed=(all(state.fixed.values()) if state.fixed else None),
        error=state.error,
        version_note=note,
        decisions=decisions.recent(state.name),
        used=decisions.used(state.name),
    )


def _installed(patch: Patch) -> tuple[str, str | None]:
    """The first of the patch's distributions that is installed, and its version."""
    from .versions import installed_version

    for name in patch.distributions():
        version = installed_version(name)
        if version is not None:
            return name, version
    return patch.distribution, None
