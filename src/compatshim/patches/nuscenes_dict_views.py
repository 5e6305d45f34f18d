"""Patch ``nuscenes-dict-views``: devkit objects that store a dict view become picklable.

What breaks
    Some nuscenes-devkit classes keep a live dict view (``dict.keys()``) as an
    attribute. Views cannot be pickled or deep-copied, so any object holding
    one (a training ``Dataset`` with an eval config, as in UniAD) fails when
    it is sent to spawned DataLoader workers, to ``mp.spawn`` ranks, or
    deep-copied: ``TypeError: cannot pickle 'dict_keys' object``.

    Every attribute of the devkit that stores a dict view, found by reading
    the wheels of both releases (an AST scan of every assignment to an
    attribute or item whose value is a ``.keys()``/``.values()``/``.items()``
    call, directly or through a local variable); line numbers are the same
    in 1.1.11 and 1.2.0:

    ==========================================  ==========================  =====================
    file:line (1.1.11 and 1.2.0)                class                       attribute
    ==========================================  ==========================  =====================
    nuscenes/eval/detection/data_classes.py:39  ``DetectionConfig``         ``class_names``
    nuscenes/eval/panoptic/evaluate.py:91       ``NuScenesPanopticEval``    ``things``
    nuscenes/eval/panoptic/evaluate.py:92       ``NuScenesPanopticEval``    ``stuff``
    ==========================================  ==========================  =====================

    (``TrackingConfig.class_names`` is ``sorted(...)``, a list, and is fine;
    the other view-valued expressions in the devkit are locals or return
    values, never stored on an object.)

Which versions
    nuscenes-devkit up to 1.2.0, the newest release (tested: 1.1.11, 1.2.0).
    On a newer release the probe alone decides.

How it is detected
    On the live module, never by version. ``DetectionConfig`` is built for
    real from the module's own ``DETECTION_NAMES``. ``NuScenesPanopticEval``
    needs a whole dataset to construct, so its ``__init__`` source is
    scanned for attributes assigned a dict view, and a bare instance holding
    such views stands in for a constructed one. Either way the defect is
    present when an instance holds a dict view and ``pickle.dumps`` of it
    fails.

The fix
    The attribute stays exactly what it was (a live ``dict_keys`` over the
    object's own dict): iteration order, ``'car' in cfg.class_names``,
    equality and ``serialize()`` are untouched. The affected classes get a
    ``__getstate__`` that hands each dict view to pickle as "this view of
    that dict" (:func:`rebuild_dict_view` with the dict itself). Pickle and
    deepcopy memoise the dict, so the copy's view is a live view of the
    copy's own dict, just like a freshly constructed object. A matching
    ``__setstate__`` turns the marker back into a view when ``copy.copy``
    passes the state through unpickled. Loading needs compatshim importable,
    not installed; nothing else in the state changes.

The revert
    ``__getstate__`` and ``__setstate__`` are set on the classes through the
    :class:`Patcher`; uninstalling deletes them, so the classes are exactly as
    they were (they define neither in any devkit release).
"""

from __future__ import annotations

import gc

from .._engine.versions import installed_version

TYPE_CHECKING = False  # no ``typing`` import: this module loads inside its target's import
if TYPE_CHECKING:
    from types import ModuleType
    from typing import Any, Callable

    from .._engine.patching import Patcher

__all__ = ["AFFECTED", "DictViewRef", "is_dict_view", "rebuild_dict_view"]

#: module -> class -> attributes known to store a dict view (see the table above).
AFFECTED: dict[str, dict[str, tuple[str, ...]]] = {
    "nuscenes.eval.detection.data_classes": {"DetectionConfig": ("class_names",)},
    "nuscenes.eval.panoptic.evaluate": {"NuScenesPanopticEval": ("things", "stuff")},
}

_VIEW_METHODS = ("keys", "values", "items")
_VIEW_TYPES: dict[type, str] = {type(getattr({}, kind)()): kind for kind in _VIEW_METHODS}


def is_dict_view(value: Any) -> bool:
    """True for ``dict_keys``/``dict_values``/``dict_items`` and their subclasses' views."""
    return _view_kind(value) is not None


def _view_kind(value: Any) -> str | None:
    kind = _VIEW_TYPES.get(type(value))
    if kind is not None:
        return kind
    for view_type, name in _VIEW_TYPES.items():  # OrderedDict's odict_keys etc. subclass these
        if isinstance(value, view_type):
            return name
    return None


def rebuild_dict_view(kind: str, mapping: Any) -> Any:
    """Unpickling side: ``mapping.keys()`` (or ``values``/``items``) again."""
    if kind not in _VIEW_METHODS:
        raise ValueError(f"not a dict view kind: {kind!r}")
    return getattr(mapping, kind)()


class DictViewRef:
    """A dict view as pickle should see it: which view, of which dict."""

    __slots__ = ("kind", "mapping")

    def __init__(self, view: Any) -> None:
        kind = _view_kind(view)
        if kind is None:
            raise TypeError(f"not a dict view: {type(view).__name__}")
        self.kind = kind
        self.mapping = _viewed_mapping(view, kind)

    def __reduce__(self) -> tuple[Callable[[str, Any], Any], tuple[str, Any]]:
        return rebuild_dict_view, (self.kind, self.mapping)


def _viewed_mapping(view: Any, kind: str) -> Any:
    """The dict behind ``view`` (the same object, so pickle's memo keeps it shared)."""
    for referent in gc.get_referents(view):  # CPython: a view's only referent is its dict
        if isinstance(referent, dict):
            return referent
    # No way to reach the dict: an equal, detached one keeps order and membership.
    if kind == "keys":
        return dict.fromkeys(view)
    if kind == "items":
        return dict(view)
    return dict(enumerate(view))


def _getstate(self: Any) -> dict[str, Any]:
    """Pickle/deepcopy state with every dict view replaced by a :class:`DictViewRef`."""
    state = dict(vars(self))
    for name, value in state.items():
        if is_dict_view(value):
            state[name] = DictViewRef(value)
    return state


def _setstate(self: Any, state: dict[str, Any]) -> None:
    """Restore state; ``copy.copy`` hands the markers back unpickled, so rebuild them here."""
    for name, value in state.items():
        if isinstance(value, DictViewRef):
            value = rebuild_dict_view(value.kind, value.mapping)
        vars(self)[name] = value


# -- detection --------------------------------------------------------------------------


def _view_attributes_in_init(cls: type[Any]) -> tuple[str, ...]:
    """Attributes that ``cls.__init__`` assigns a ``.keys()``/``.values()``/``.items()`` call."""
    import ast  # here, not at the top: ``import compatshim.auto`` loads this module
    import inspect
    import textwrap

    init = vars(cls).get("__init__")
    if init is None:
        return ()
    tree = ast.parse(textwrap.dedent(inspect.getsource(init)))
    found: list[str] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Assign):
            continue
        value = node.value
        is_view_call = (
            isinstance(value, ast.Call)
            and isinstance(value.func, ast.Attribute)
            and value.func.attr in _VIEW_METHODS
            and not value.args
        )
        if not is_view_call:
            continue
        for target in node.targets:
            if (
                isinstance(target, ast.Attribute)
                and isinstance(target.value, ast.Name)
                and target.value.id == "self"
            ):
                found.append(target.attr)
    return tuple(found)


def _detection_config_sample(module: ModuleType) -> Any:
    """A real ``DetectionConfig`` built from the module's own class list."""
    names = module.DETECTION_NAMES
    return module.DetectionConfig(
        class_range={name: 50 for name in names},
        dist_fcn="center_distance",
        dist_ths=[0.5, 1.0, 2.0, 4.0],
        dist_th_tp=2.0,
        min_recall=0.1,
        min_precision=0.1,
        max_boxes_per_sample=500,
        mean_ap_weight=5,
    )


def _bare_sample(cls: type[Any]) -> Any:
    """An unconstructed instance holding the views ``__init__`` would store."""
    attributes = _view_attributes_in_init(cls)
    if not attributes:
        return None
    sample: Any = object.__new__(cls)
    for index, attribute in enumerate(attributes):
        setattr(sample, attribute, {f"class_{index}": index}.keys())
    return sample


_SAMPLE_BUILDERS: dict[str, Callable[[ModuleType], Any]] = {
    "DetectionConfig": _detection_config_sample,
}


def _samples(module: ModuleType) -> list[Any]:
    samples = []
    for class_name in AFFECTED.get(module.__name__, {}):
        cls = getattr(module, class_name, None)
        if not isinstance(cls, type):
            continue
        builder = _SAMPLE_BUILDERS.get(class_name)
        try:
            sample = builder(module) if builder is not None else _bare_sample(cls)
        except (TypeError, ValueError, AssertionError, AttributeError):
            sample = _bare_sample(cls)  # constructor changed: fall back to the source scan
        if sample is not None:
            samples.append(sample)
    return samples


def _holds_unpicklable_view(sample: Any) -> bool:
    import pickle

    if not any(is_dict_view(value) for value in vars(sample).values()):
        return False
    try:
        pickle.dumps(sample)
    except (TypeError, pickle.PicklingError):
        return True
    return False


def probe(module: ModuleType) -> bool:
    """True while an affected class of ``module`` stores a dict view that blocks pickling."""
    return any(_holds_unpicklable_view(sample) for sample in _samples(module))


# -- fix --------------------------------------------------------------------------------


def apply(module: ModuleType, patcher: Patcher) -> None:
    """Give each affected class of ``module`` the view-aware ``__getstate__``/``__setstate__``."""
    for class_name in AFFECTED.get(module.__name__, {}):
        cls = getattr(module, class_name, None)
        if not isinstance(cls, type):
            continue
        own = vars(cls)
        if own.get("__getstate__") is _getstate:
            continue  # already fixed (installed twice through another path)
        if "__getstate__" in own or "__setstate__" in own:
            raise RuntimeError(
                f"nuscenes-devkit {installed_version('nuscenes-devkit')}: "
                f"{module.__name__}.{class_name} defines its own __getstate__/__setstate__; "
                f"nuscenes-dict-views knows only classes that define neither (1.1.11, 1.2.0)"
            )
        patcher.setattr(cls, "__getstate__", _getstate)
        patcher.setattr(cls, "__setstate__", _setstate)
