"""The patch registry: version-gated, probe-confirmed, reversible import-time patches.

A patch is declared in its own module under ``compatshim.patches`` as a
:class:`Patch`. ``install()`` only arms post-import hooks (cheap; nothing is
imported). When a target module is imported, the registry reads the installed
version from metadata, runs the patch's probe against the live module, and
applies the fix only when the defect is really there. After applying, the
probe runs again to confirm the fix.
"""

from __future__ import annotations

import os
from _thread import RLock

from . import _import_hooks
from ._patching import Patcher
from ._versions import installed_version, range_position

TYPE_CHECKING = False  # no ``typing`` import at run time: ``import compatshim.auto`` stays cheap
if TYPE_CHECKING:
    from types import ModuleType
    from typing import Any, Callable, Iterable

    Probe = Callable[[ModuleType], bool]
    Apply = Callable[[ModuleType, Patcher], None]


class Patch:
    """A declared fix for one upstream defect.

    ``probe(module)`` returns True while the defect is present in ``module``;
    ``apply(module, patcher)`` makes every change through ``patcher`` so that
    revert is exact. Both are called once per target module, after it is
    imported. ``specifier`` is the tested version range of ``distribution``;
    on a release newer than it the probe alone decides, on an older one the
    patch stays off. ``target_distributions`` names the distribution of a
    target that ships in another package (``lightning_fabric`` comes from
    ``lightning-fabric``, ``lightning.fabric`` from ``lightning``).
    """

    __slots__ = (
        "apply",
        "description",
        "distribution",
        "name",
        "probe",
        "specifier",
        "target_distributions",
        "targets",
    )

    def __init__(
        self,
        *,
        name: str,
        distribution: str,
        specifier: str,
        targets: tuple[str, ...],
        probe: Probe,
        apply: Apply,
        description: str,
        target_distributions: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        self.distribution = distribution
        self.specifier = specifier
        self.targets = targets
        self.probe = probe
        self.apply = apply
        self.description = description
        self.target_distributions = dict(target_distributions or {})

    def distribution_for(self, target: str) -> str:
        return self.target_distributions.get(target, self.distribution)

    def installed(self) -> tuple[str, str | None]:
        """The first of this patch's distributions that is installed, and its version."""
        names = dict.fromkeys([self.distribution, *self.target_distributions.values()])
        for name in names:
            version = installed_version(name)
            if version is not None:
                return name, version
        return self.distribution, None


class _State:
    """What the registry knows about one patch in this process.

    The ``Patch`` itself is loaded on first need (a target was imported, or
    ``status()`` was asked for): arming needs only the name and the targets.
    """

    def __init__(self, name: str, targets: tuple[str, ...], loader: Callable[[], Patch]) -> None:
        self.name = name
        self.targets = targets
        self._loader = loader
        self._patch: Patch | None = None
        self.armed = False
        self.patcher = Patcher()
        self.applied_targets: list[str] = []
        self.defect: dict[str, bool] = {}  # target -> present before the fix
        self.fixed: dict[str, bool] = {}  # target -> probe passes after the fix
        self.error: str | None = None
        self.hooks: dict[str, Callable[[ModuleType], None]] = {}

    @property
    def patch(self) -> Patch:
        if self._patch is None:
            patch = self._loader()
            if patch.name != self.name or tuple(patch.targets) != self.targets:
                raise RuntimeError(
                    f"compatshim: patch module for {self.name!r} declares name {patch.name!r} "
                    f"and targets {patch.targets}, but the catalogue says {self.targets}"
                )
            self._patch = patch
        return self._patch


_lock = RLock()
_states: dict[str, _State] = {}
_catalogue_loaded = False


def _load() -> dict[str, _State]:
    global _catalogue_loaded
    with _lock:
        if not _catalogue_loaded:
            from .patches import CATALOGUE, load_patch

            for name, (_, targets) in CATALOGUE.items():

                def loader(name: str = name) -> Patch:
                    return load_patch(name)

                _states.setdefault(name, _State(name, targets, loader))
            _catalogue_loaded = True
        return _states


def register(patch: Patch) -> None:
    """Add a patch to the catalogue (the built-in ones come from ``compatshim.patches``)."""
    with _lock:
        states = _load()
        if patch.name in states and states[patch.name].patch is not patch:
            raise ValueError(f"a different patch named {patch.name!r} is already registered")
        states.setdefault(patch.name, _State(patch.name, tuple(patch.targets), lambda: patch))


def unregister(name: str) -> None:
    """Uninstall and drop a patch from the catalogue."""
    with _lock:
        if name in _load():
            uninstall([name])
            del _states[name]


def _select(names: Iterable[str] | None) -> list[_State]:
    states = _load()
    if names is None:
        return list(states.values())
    if isinstance(names, str):
        names = [names]
    unknown = sorted(set(names) - set(states))
    if unknown:
        raise ValueError(f"unknown patch name(s) {unknown}; known: {sorted(states)}")
    return [states[n] for n in names]


def _disabled_by_env() -> set[str]:
    raw = os.environ.get("COMPATSHIM_DISABLE", "")
    return {part.strip() for part in raw.split(",") if part.strip()}


def _warn(message: str) -> None:
    import warnings

    warnings.warn(message, RuntimeWarning, stacklevel=3)


def _on_import(state: _State, target: str, module: ModuleType) -> None:
    """Probe, apply, confirm. Runs inside the user's import: it never raises into it."""
    with _lock:
        if not state.armed or target in state.applied_targets or target in state.defect:
            return
        try:
            patch = state.patch
        except Exception as exc:
            state.error = f"patch module failed to load: {type(exc).__name__}: {exc}"
            _warn(
                f"compatshim: patch {state.name!r} is unusable ({state.error}); {target} unchanged"
            )
            return
        distribution = patch.distribution_for(target)
        version = installed_version(distribution)
        if version is not None and range_position(version, patch.specifier) == "below":
            return
        try:
            present = bool(patch.probe(module))
        except Exception as exc:  # a probe that cannot decide leaves the module alone
            state.error = f"probe failed on {target}: {type(exc).__name__}: {exc}"
            return
        state.defect[target] = present
        if not present:
            return
        patcher = Patcher()
        try:
            patch.apply(module, patcher)
            state.fixed[target] = not patch.probe(module)
        except Exception as exc:
            patcher.revert()
            state.error = f"apply failed on {target}: {type(exc).__name__}: {exc}"
            _warn(
                f"compatshim: patch {patch.name!r} could not be applied to {target} "
                f"({distribution} {version}): {exc}; the module is left unchanged"
            )
            return
        state.patcher.on_revert(patcher.revert)
        state.applied_targets.append(target)


def install(
    include: Iterable[str] | None = None, exclude: Iterable[str] | None = None
) -> list[str]:
    """Arm every selected patch; return the names armed.

    Nothing is imported: each patch applies when its target module is imported
    (at once if it already is). Installing twice is installing once.
    ``COMPATSHIM_DISABLE=name,name`` removes patches from the selection.
    """
    excluded = set(exclude or ()) | _disabled_by_env()
    armed: list[str] = []
    with _lock:
        selected = _select(include)
        _select(excluded - _disabled_by_env())  # validate explicit names
        for state in selected:
            if state.name in excluded:
                continue
            armed.append(state.name)
            if state.armed:
                continue
            state.armed = True
            for target in state.targets:

                def hook(module: ModuleType, state: _State = state, target: str = target) -> None:
                    _on_import(state, target, module)

                state.hooks[target] = hook
                _import_hooks.when_imported(target, hook)
    return armed


def uninstall(names: Iterable[str] | None = None) -> list[str]:
    """Disarm patches and restore the original objects exactly; return the names undone."""
    undone: list[str] = []
    with _lock:
        for state in _select(names):
            if not state.armed:
                continue
            for target, hook in state.hooks.items():
                _import_hooks.discard(target, hook)
            state.hooks.clear()
            state.patcher.revert()
            state.armed = False
            state.applied_targets.clear()
            state.defect.clear()
            state.fixed.clear()
            undone.append(state.name)
    return undone


def status() -> list[dict[str, Any]]:
    """Per patch: target distribution and version, range, defect, applied, fixed."""
    import sys

    rows: list[dict[str, Any]] = []
    with _lock:
        for state in _load().values():
            patch = state.patch
            distribution, version = patch.installed()
            position = range_position(version, patch.specifier) if version else None
            imported = [t for t in patch.targets if t in sys.modules]
            if state.defect:
                defect = "present" if any(state.defect.values()) else "absent"
            else:
                defect = "not probed"
            rows.append(
                {
                    "name": patch.name,
                    "description": patch.description,
                    "distribution": distribution,
                    "installed_version": version,
                    "specifier": patch.specifier,
                    "in_range": position == "in",
                    "range_position": position,
                    "armed": state.armed,
                    "targets": list(patch.targets),
                    "targets_imported": imported,
                    "defect": defect,
                    "applied": bool(state.applied_targets),
                    "applied_targets": list(state.applied_targets),
                    "fixed": (all(state.fixed.values()) if state.fixed else None),
                    "error": state.error,
                }
            )
    return rows
