"""Patch ``numpy-core-names``: pickles load across numpy's ``numpy.core`` -> ``numpy._core`` rename.

What breaks
    numpy 2 renamed ``numpy.core`` to ``numpy._core``; its pickles (and every
    ``torch.save`` file holding numpy values) name ``numpy._core.multiarray.
    _reconstruct``, ``numpy._core.multiarray.scalar``, ``numpy._core.numeric.
    _frombuffer`` (protocol 5) and, for recarrays, ``numpy.rec.recarray``.
    Under numpy 1.x they fail with ``ModuleNotFoundError: No module named
    'numpy._core'`` (numpy issue 28340, ray 48053, nnUNet 2299): numpy 1.24
    has no ``numpy._core`` at all, numpy 1.26 only stubs for ``multiarray``,
    ``umath``, ``_multiarray_umath``, ``_internal``, ``_dtype`` and
    ``_dtype_ctypes`` (so ``numpy._core.numeric`` still fails). The other
    way, numpy 2 loads numpy-1 pickles through its ``numpy.core`` shims, but
    ``numpy.core.numeric._frombuffer`` raises a ``DeprecationWarning`` (an
    error under ``-W error``). torch's weights-only unpickler matches
    allow-listed globals by name, so a user who allow-listed the running
    numpy's ``_reconstruct`` still gets the other spelling refused.

Which versions
    numpy 1.x reading numpy-2 names; numpy 2.x reading numpy-1 names whose
    shim warns (tested: 1.24, 1.26, 2.0, 2.4, 2.5). Written against the
    layouts of numpy 1.17-2.5; on a newer release the probe decides.

How it is detected
    numpy 1.x: a numpy-2 module name (``numpy._core``, its ``multiarray``,
    ``numeric``, ``_multiarray_umath``, ``umath``; ``numpy.rec``) that no
    finder on ``sys.meta_path`` can find, looked up without importing it.
    numpy 2.x: a name that numpy-1 pickles use and that is not a plain
    attribute of its ``numpy.core`` shim (so the shim's ``__getattr__``
    would warn), for shims already imported; a shim not yet imported counts
    until this patch watches it. numpy.random (numpy 1.x): its
    ``numpy.random._pickle.__bit_generator_ctor`` raises ValueError when given
    the MT19937 class (numpy 2's ctor builds one); not yet imported counts
    until watched.

The fix
    numpy 1.x: :class:`NumpyCoreFinder` on ``sys.meta_path`` answers only for
    those numpy-2 names that nothing else finds, with the numpy-1 module
    that holds the same objects (``numpy._core.numeric`` *is*
    ``numpy.core.numeric``): no copies, nothing executed twice, identical
    functions and classes. It answers on demand, so ``import numpy`` gives
    ordinary code exactly what it gave before: no ``numpy._core`` in
    ``sys.modules`` and no ``numpy._core`` attribute until something (a
    pickle) imports that name. Libraries that test ``hasattr(numpy, "_core")``
    to pick a spelling (seen in the wild: ``(np._core if hasattr(np, "_core")
    else np.core).multiarray._reconstruct``) then get the same object either
    way; this is also what numpy 1.26's own stubs do once imported.

    numpy 2.x: when a ``numpy.core`` shim module is imported (post-import
    hook, never eagerly), the reconstructor names that numpy-1 pickles use
    (``multiarray._reconstruct``/``scalar``, ``numeric._frombuffer``, the
    ufuncs in ``_multiarray_umath``) become plain attributes holding the
    ``numpy._core`` objects, which is what numpy itself already does for
    ``_reconstruct`` and ``scalar``. Every other ``numpy.core`` attribute
    keeps its deprecation warning.

    torch's weights-only unpickler (torch 2.4+, where it accepts numpy at
    all, once the user allow-lists it): when ``torch._weights_only_unpickler``
    is imported, its table of user-allowed globals also answers to the other
    numpy spelling of each allow-listed numpy object. Nothing is trusted that
    the user did not allow: the same object under the name the file uses.

    numpy.random (numpy 1.x): when ``numpy.random._pickle`` is imported
    (post-import hook), its three ctors are wrapped, keeping their names (so
    pickles written meanwhile still name numpy's functions). A bit-generator
    *class* (any ``BitGenerator`` subclass, as numpy 2 accepts) makes an
    instance of a subclass whose ``__setstate__`` also takes numpy 2's
    ``(state, SeedSequence)`` (the SeedSequence is dropped: numpy 1's
    ``_seed_seq`` is read-only and its own pickles keep none); a Generator or
    RandomState given a bit generator (numpy 2) gets a plain numpy-1 one with
    the same state, so it is numpy's own class throughout. A bit generator
    pickled on its own stays of that subclass: ``isinstance`` holds, state
    and draws are equal, and it pickles back under numpy's own names. Names
    (numpy 1's form) go to numpy's ctors unchanged.

The revert
    The finder leaves ``sys.meta_path``; alias entries it created leave
    ``sys.modules`` and the parent attributes importlib set for them; the
    shim attributes, numpy.random's ctors and torch's function are put back,
    and the post-import hooks are discarded, all through the :class:`Patcher`.
    A ctor or torch's function that a library wrapped after compatshim keeps
    that library's wrapper; compatshim's under it then acts as the original.
    Objects already loaded keep their types.
"""

from __future__ import annotations

from .._engine import alias_finder
from .._engine.alias_finder import Route
from .._engine.patching import mark, ours, wrapping

TYPE_CHECKING = False  # no ``typing`` import at run time (start-up path)
if TYPE_CHECKING:
    from types import ModuleType
    from typing import Any, Callable

    from .._engine.patching import Patcher

__all__ = ["NumpyCoreFinder"]

#: numpy-2 module prefixes and their numpy-1 homes (numpy 1.x direction).
_NUMPY2_TO_NUMPY1 = {
    "numpy._core": "numpy.core",
    "numpy.rec": "numpy.core.records",
    "numpy.char": "numpy.core.defchararray",
}
#: numpy-2 names that numpy-2 pickles use; the probe checks these can be found.
_NUMPY2_PICKLE_MODULES = (
    "numpy._core",
    "numpy._core.multiarray",
    "numpy._core.numeric",
    "numpy._core._multiarray_umath",
    "numpy._core.umath",
    "numpy.rec",
)
#: numpy.core shim -> names numpy-1 pickles use there (``None``: every ufunc of the module).
_NUMPY1_PICKLE_NAMES: dict[str, tuple[str, ...] | None] = {
    "numpy.core.multiarray": ("_reconstruct", "scalar"),
    "numpy.core.numeric": ("_frombuffer",),
    "numpy.core._multiarray_umath": None,
}
_TORCH_UNPICKLER = "torch._weights_only_unpickler"
_OTHER_SPELLING = (("numpy.core.", "numpy._core."), ("numpy._core.", "numpy.core."))


def _numpy_major(numpy: ModuleType) -> int:
    return int(str(numpy.__version__).split(".")[0])


# -- numpy 1.x: numpy-2 names as aliases ------------------------------------------------------
def _alias_target(fullname: str) -> str | None:
    for numpy2, numpy1 in _NUMPY2_TO_NUMPY1.items():
        if fullname == numpy2 or fullname.startswith(numpy2 + "."):
            return numpy1 + fullname[len(numpy2) :]
    return None


class NumpyCoreFinder(alias_finder.AliasFinder):
    """Answers only for numpy-2 names that nothing else finds (the mechanism is shared)."""

    def route(self, fullname: str) -> Route | None:
        aliased_to = _alias_target(fullname)
        if aliased_to is None:
            return None
        import sys

        parent_name = fullname.rpartition(".")[0]
        parent = sys.modules.get(parent_name)
        parent_target = _alias_target(parent_name)
        # A real parent (numpy 1.26's stubs, whose __name__ they overwrite): a real module of
        # this name wins. An alias parent has numpy-1's __path__, where the real finders would
        # load a second copy of numpy.core.<name>: answer for it instead.
        parent_is_alias = (
            parent is not None
            and parent_target is not None
            and (parent is sys.modules.get(parent_target))
        )
        return Route(aliased_to, shadow=parent_is_alias)


def _natively_findable(fullname: str, numpy: ModuleType) -> bool:
    """Whether the real finders find ``fullname`` (a numpy submodule), importing nothing."""
    from importlib.machinery import PathFinder

    path: Any = list(numpy.__path__)
    parts = fullname.split(".")[1:]
    for depth, _ in enumerate(parts):
        name = ".".join(["numpy", *parts[: depth + 1]])
        spec = PathFinder.find_spec(name, path)
        if spec is None:
            return False
        path = spec.submodule_search_locations
        if path is None and depth < len(parts) - 1:
            return False
    return True


def _numpy1_defect(numpy: ModuleType) -> bool:
    import sys

    if any(isinstance(finder, NumpyCoreFinder) for finder in sys.meta_path):
        return False
    return not all(_natively_findable(name, numpy) for name in _NUMPY2_PICKLE_MODULES)


# -- numpy 2.x: numpy-1 reconstructor names as plain shim attributes --------------------------
_watching: set[str] = set()  # shims whose post-import hook this patch has armed


def _missing_shim_names(shim: ModuleType) -> dict[str, Any]:
    """Names numpy-1 pickles use that ``shim`` gives only through its warning ``__getattr__``."""
    from importlib import import_module

    real = import_module(shim.__name__.replace("numpy.core", "numpy._core", 1))
    names = _NUMPY1_PICKLE_NAMES[shim.__name__]
    if names is None:
        import numpy

        names = tuple(n for n, v in vars(real).items() if isinstance(v, numpy.ufunc))
    present = vars(shim)
    return {n: getattr(real, n) for n in names if n not in present and hasattr(real, n)}


def _numpy2_defect() -> bool:
    import sys

    for shim_name in _NUMPY1_PICKLE_NAMES:
        shim = sys.modules.get(shim_name)
        if shim is None:
            if shim_name not in _watching:
                return True
        elif _missing_shim_names(shim):
            return True
    return False


def _unwatch(shim_name: str) -> Callable[[], None]:
    def undo() -> None:
        _watching.discard(shim_name)

    return undo


def _fill_shim(patcher: Patcher) -> Callable[[ModuleType], None]:
    def fill(shim: ModuleType) -> None:
        for name, value in _missing_shim_names(shim).items():
            patcher.setattr(shim, name, value)

    return fill


# -- torch's weights-only allowlist answers to both spellings ---------------------------------
def _other_spelling(name: str) -> str | None:
    for old, new in _OTHER_SPELLING:
        if name.startswith(old):
            return new + name[len(old) :]
    return None


def _both_spellings(
    original: Callable[[], dict[str, Any]], patcher: Patcher
) -> Callable[[], dict[str, Any]]:
    def user_allowed_globals() -> dict[str, Any]:
        allowed = original()
        if not patcher.live:  # reverted, still held by a library that wrapped it
            return allowed
        for name, obj in list(allowed.items()):
            twin = _other_spelling(name)
            if twin is not None:
                allowed.setdefault(twin, obj)
        return allowed

    return ours(mark(user_allowed_globals, __wrapped__=original), original, patcher)


def _alias_torch_allowlist(patcher: Patcher) -> Callable[[ModuleType], None]:
    def alias(unpickler: ModuleType) -> None:
        original = wrapping(vars(unpickler).get("_get_user_allowed_globals"))
        if original is not None:  # None: torch < 2.4 has none (and refuses numpy), or ours
            patcher.setattr(
                unpickler, "_get_user_allowed_globals", _both_spellings(original, patcher)
            )

    return alias


def _watch(name: str, callback: Callable[[ModuleType], None], patcher: Patcher) -> None:
    from .._engine import import_hooks

    import_hooks.when_imported(name, callback)
    patcher.on_revert(lambda: import_hooks.discard(name, callback))


# -- numpy 1.x: numpy 2's numpy.random pickles -------------------------------------------------
_RANDOM_PICKLE = "numpy.random._pickle"
_adapters: dict[type, type] = {}  # numpy-1 bit generator class -> its numpy-2-state subclass


def _rejects_classes(module: ModuleType) -> bool:
    """Whether numpy 1's ``__bit_generator_ctor`` refuses a class, as numpy 2 pickles pass."""
    ctor = vars(module).get("__bit_generator_ctor")
    classes = vars(module).get("BitGenerators")
    if ctor is None or not isinstance(classes, dict) or "MT19937" not in classes:
        return False  # a layout this patch does not know: leave it alone
    under = wrapping(ctor)  # numpy's, where ours was reverted
    if under is None:
        return False  # ours, in force
    try:
        under(classes["MT19937"])
    except ValueError:
        return True
    return False


def _numpy1_random_defect() -> bool:
    import sys

    module = sys.modules.get(_RANDOM_PICKLE)
    if module is None:
        return _RANDOM_PICKLE not in _watching
    return _rejects_classes(module)


def _adapter(cls: type) -> type:
    """``cls`` whose ``__setstate__`` also takes numpy 2's ``(state dict, SeedSequence)``."""
    found = _adapters.get(cls)
    if found is not None:
        return found
    setstate = cls.__setstate__  # type: ignore[attr-defined]

    def __setstate__(self: Any, state: Any) -> None:
        if type(state) is tuple and len(state) == 2 and isinstance(state[0], dict):
            state = state[0]  # numpy 1 keeps no SeedSequence across pickling
        setstate(self, state)

    made = type(cls.__name__, (cls,), {"__slots__": (), "__setstate__": __setstate__})
    made.__qualname__ = cls.__qualname__
    _adapters[cls] = made
    return made


def _plain(bit_generator: Any) -> Any:
    """A numpy-1 bit generator of numpy's own class with the state of ``bit_generator``."""
    base = {adapter: cls for cls, adapter in _adapters.items()}.get(type(bit_generator))
    if base is None:
        return bit_generator
    plain = base()
    plain.state = bit_generator.state
    return plain


def _named_like(
    original: Callable[..., Any], wrapper: Callable[..., Any], patcher: Patcher
) -> Callable[..., Any]:
    for attribute in ("__module__", "__name__", "__qualname__", "__doc__"):
        setattr(wrapper, attribute, getattr(original, attribute))
    return ours(mark(wrapper, __wrapped__=original), original, patcher)


def _adapt_random(patcher: Patcher) -> Callable[[ModuleType], None]:
    def adapt(module: ModuleType) -> None:
        from importlib import import_module

        if not _rejects_classes(module):
            return
        names = vars(module)
        bit_generator_ctor = wrapping(names["__bit_generator_ctor"])
        base = vars(import_module("numpy.random.bit_generator"))["BitGenerator"]

        def new_bit_generator_ctor(bit_generator_name: Any = "MT19937") -> Any:
            if (
                patcher.live
                and isinstance(bit_generator_name, type)
                and issubclass(bit_generator_name, base)
            ):
                return _adapter(bit_generator_name)()
            return bit_generator_ctor(bit_generator_name)

        patcher.setattr(
            module,
            "__bit_generator_ctor",
            _named_like(bit_generator_ctor, new_bit_generator_ctor, patcher),
        )
        for name, kind in (
            ("__generator_ctor", "Generator"),
            ("__randomstate_ctor", "RandomState"),
        ):
            original = wrapping(names.get(name))
            if original is not None:
                patcher.setattr(
                    module, name, _over_bit_generator(original, names[kind], base, patcher)
                )

    return adapt


def _over_bit_generator(
    original: Callable[..., Any], kind: type, base: type, patcher: Patcher
) -> Callable[..., Any]:
    """numpy 1's Generator/RandomState ctor that also takes a bit generator (numpy 2)."""

    def ctor(bit_generator_name: Any = "MT19937", bit_generator_ctor: Any = None) -> Any:
        if patcher.live and isinstance(bit_generator_name, base):
            return kind(_plain(bit_generator_name))
        if bit_generator_ctor is None:
            return original(bit_generator_name)
        return original(bit_generator_name, bit_generator_ctor)

    return _named_like(original, ctor, patcher)


# -- the patch ---------------------------------------------------------------------------------
def probe(numpy: ModuleType) -> bool:
    """True while a pickle naming the other numpy's modules (or numpy.random forms) would fail."""
    if _numpy_major(numpy) < 2:
        return _numpy1_defect(numpy) or _numpy1_random_defect()
    return _numpy2_defect()


def apply(numpy: ModuleType, patcher: Patcher) -> None:
    if _numpy_major(numpy) < 2:
        import sys

        finder = NumpyCoreFinder(patcher)
        sys.meta_path.insert(0, finder)
        patcher.on_revert(lambda: sys.meta_path.remove(finder))
        _watching.add(_RANDOM_PICKLE)
        patcher.on_revert(_unwatch(_RANDOM_PICKLE))
        _watch(_RANDOM_PICKLE, _adapt_random(patcher), patcher)
    else:
        for shim_name in _NUMPY1_PICKLE_NAMES:
            _watching.add(shim_name)
            patcher.on_revert(_unwatch(shim_name))
            _watch(shim_name, _fill_shim(patcher), patcher)
    _watch(_TORCH_UNPICKLER, _alias_torch_allowlist(patcher), patcher)
