"""compatshim's curated allowlist: the globals a checkpoint may name, and why each is safe.

A pickle names every class and function it needs as ``module.name``; loading
it means importing that module and calling that object. An :class:`Entry`
says which ``module.name`` compatshim's loader accepts, for which releases of
which distribution (``distribution=None``: the standard library, and then
``versions`` is a Python version range), what kind of object it is (which
decides what the loader may do with it) and why it cannot run code.

Kinds (what compatshim's loader does with each; see ``_objects.py``):

``constant``
    pushed as a value, never called (dtypes, storage types, factory types). A
    ``Class.attribute`` name is ``vars(Class)["attribute"]`` (no descriptor runs).
``constructor``
    called with arguments the loader checks first (``set``, ``datetime``, ...).
``enum``
    an ``Enum`` class: only an existing member is ever returned.
``instance``
    a plain class: an empty instance is made without ``__init__`` and its
    ``__dict__`` filled from a dict of str keys (``argparse.Namespace``).
``dict-subclass``
    a ``dict`` subclass: made empty, filled through ``dict.__setitem__``.
``rebuild``
    a function compatshim re-implements with checked arguments (tensors,
    numpy arrays); the original is never called with the file's arguments.
``method``
    ``Class.function``: a plain function defined in the body of a class of
    this table (read from ``vars(Class)``: no descriptor, no dunder), as
    pickle writes a method reference (protocol 4+ names it, 2-3 spell it
    ``getattr(Class, 'function')``); pushed as a value, never called.
``staticmethod``
    as ``method``, for a function the class body wraps in ``@staticmethod``
    (``vars(Class)`` holds the wrapper; the function is pushed); its class
    may be a ``constant`` row.
``rule``
    a global the loader never calls: its :attr:`Entry.args` rule checks the
    file's arguments and names the row whose object the call stands for
    (``_objects.RULES``); that object is the result.

Argument rules (:attr:`Entry.args`, for ``rule`` entries):

``method-of-listed-class``
    ``getattr(cls, name)`` with exactly two arguments: ``cls`` a class this
    load resolved from this table, and ``Class.name`` a row here that applies
    to the installed release: a ``method`` row of an ``instance`` or
    ``dict-subclass`` class, a ``staticmethod`` row, or a ``constant`` row
    (``builtins.object.__new__``, the one there is), checked to be
    ``vars(cls)[name]``. Anything else (a module, another dunder, a default, a
    name not listed, a staticmethod under a ``method`` row, a property) is
    refused, so plain ``getattr`` stays out.
``new-of-listed-class``
    ``functools.partial``, as pickle protocols 2-3 write an object whose class
    defines ``__getnewargs_ex__`` (GluonTS's ``@validated`` classes):
    ``partial(object.__new__, cls, **kwargs)()``. The loader never makes a
    partial (``_partial.py``): ``partial(f)`` must have ``f`` the
    ``builtins.object.__new__`` row's object; its state must be exactly
    ``(f, (cls,), kwargs or None, None or {})`` with ``cls`` an ``instance``
    class this load resolved from this table (not one of omegaconf's, which
    ``_omegaconf.py`` builds) and no other positional argument; it must be
    called once, after its state and with no arguments, and then stands for
    NEWOBJ of ``cls`` (``object.__new__`` ignores ``kwargs``, as here). The
    instance's state is a dict of plain names, plus ``__init_args__`` (the
    constructor arguments ``@validated`` records, the same names as
    ``kwargs``); ``kwargs`` and every value are plain data (None, bool, int,
    float, str, bytes, and lists, tuples, dicts of them): no class or function
    can shadow a method. The partial is never a value of the result.

Classes, non-callable constants, ``method`` and ``staticmethod`` rows may appear in the loaded
result as values; every other global only serves to build the result, and
``rule`` globals never appear (``functools.partial`` is a class).

omegaconf containers (2.1-2.4) are ``instance`` entries that the loader
builds through ``_omegaconf.py`` instead (never omegaconf's ``__setstate__``):
their state is checked field by field, classes in their metadata must come
through this allowlist or ``allow=``, and every string is checked against an
explicit interpolation policy (``${oc.env:...}``, ``${eval:...}`` and other
resolvers are refused unless ``allow=["omegaconf-resolver:NAME"]``).
numpy.random objects are in (``_numpy.RANDOM``): their ctor functions are
re-implemented for the five bit generators only.

Left out on purpose: numpy object arrays, ``bytearray(n)``, tensor subclasses,
quantized / nested tensors, TorchScript, omegaconf's ``TupleConfig``,
``NoneNode`` and ``LiteralNode`` (2.4 only) and ``Union``/``Tuple[...]`` annotations.

Keep :class:`Entry` and the names here stable: patches import them.
"""

from __future__ import annotations

import importlib
import sys
import typing
from dataclasses import dataclass
from typing import Any, Literal

from ._dtypes import BY_TORCH, NUMPY_CLASSES, STORAGES
from ._names import Key, canonical, canonical_name

Kind = Literal[
    "constant",
    "constructor",
    "enum",
    "instance",
    "dict-subclass",
    "rebuild",
    "method",
    "staticmethod",
    "rule",
]
KINDS: tuple[str, ...] = typing.get_args(Kind)
ArgRule = Literal["method-of-listed-class", "new-of-listed-class"]
ARG_RULES: tuple[str, ...] = typing.get_args(ArgRule)


@dataclass(frozen=True)
class Entry:
    """One allowed global (``module.name``) and the releases it applies to."""

    module: str
    name: str
    distribution: str | None
    versions: str
    kind: Kind
    reason: str
    importable: bool = True
    args: ArgRule | None = None
    """For ``rule`` entries: the argument rule every call must pass (see the module doc)."""

    @property
    def qualname(self) -> str:
        return f"{self.module}.{self.name}"

    @property
    def key(self) -> Key:
        """One name for a global's aliases (``_names.canonical``): what the table and the
        handlers are indexed by."""
        return canonical(self.module, self.name)

    def problem(self) -> str | None:
        """Why this entry does not apply to the installed release, or None."""
        return _version_problem(self)

    def applies(self) -> bool:
        """Whether the installed distribution (or Python) is inside :attr:`versions`."""
        return _version_problem(self) is None

    def absent(self) -> bool:
        """Whether its distribution is not installed: nothing it names can exist here."""
        return self.distribution is not None and _installed(_distribution(self)) is None

    def resolve(self) -> Any:
        """The object this entry names in this process; LookupError says why not.

        Imports the module only when :attr:`importable` and the distribution is
        installed in range; numpy's ``numpy.core`` / ``numpy._core`` names resolve
        to whichever the running numpy has, without importing the deprecated one.
        """
        problem = _version_problem(self)
        if problem is not None:
            raise LookupError(problem)
        for module_name in candidate_modules(self.module):
            module = sys.modules.get(module_name)
            if module is None and self.importable:
                try:
                    module = importlib.import_module(module_name)
                except ImportError:
                    continue
            if module is None:
                continue
            found = _member(self, module)
            if found is not _MISSING:
                _check_kind(self, found)
                return found
        if not self.importable:
            raise LookupError(f"{self.module} is not imported and this entry does not import it")
        raise LookupError(f"{self.qualname} does not exist in this install")


_MISSING = object()


def _member(entry: Entry, module: Any) -> Any:
    """``module.name``; for a ``method`` row ``Class.function``, ``vars(Class)["function"]``
    (a plain function of the class); for another ``Class.attribute`` row,
    ``vars(Class)["attribute"]`` as stored (no descriptor runs)."""
    owner_name, dotted, name = entry.name.partition(".")
    if not dotted:
        return vars(module).get(entry.name, _MISSING)
    owner = vars(module).get(owner_name, _MISSING)
    if owner is _MISSING:
        return _MISSING
    if entry.kind in ("method", "staticmethod"):
        return class_function(owner, name, static=entry.kind == "staticmethod")
    if not isinstance(owner, type) or "." in name:
        return _MISSING
    return vars(owner).get(name, _MISSING)


def class_function(owner: Any, name: str, static: bool = False) -> Any:
    """``vars(owner)[name]`` when it is a plain function written in ``owner``'s own body
    (``static``: a ``staticmethod`` of one, and then the function it wraps).

    No attribute lookup runs (no descriptor, no metaclass ``__getattr__``);
    dunders, classmethods, properties, builtins, functions defined elsewhere and
    assigned to the class, and staticmethods unless ``static`` (only then) are
    refused (LookupError).
    """
    import types

    if not isinstance(owner, type) or not name.isidentifier() or name.startswith("__"):
        raise LookupError("not a plain method name of a class")
    found = vars(owner).get(name)
    if static:
        found = found.__func__ if type(found) is staticmethod else None
    if (
        type(found) is not types.FunctionType
        or found.__qualname__ != f"{owner.__qualname__}.{name}"
        or found.__module__ != owner.__module__
    ):
        raise LookupError(f"{owner.__qualname__}.{name} is not a function defined on the class")
    return found


def _installed(distribution: str) -> str | None:
    from .._engine.versions import installed_version

    return installed_version(distribution)


def _distribution(entry: Entry) -> str:
    """The distribution whose version decides ``entry`` (one with a distribution)."""
    if _mirror(entry.module) is not None:  # read in Lightning's unified package, whose
        return _MIRROR[2]  # releases are numbered as the standalone one's
    return str(entry.distribution)


def _version_problem(entry: Entry) -> str | None:
    from .._engine.versions import contains

    if entry.distribution is None:
        version = ".".join(map(str, sys.version_info[:3]))
        what = "Python"
    else:
        what = _distribution(entry)
        found = _installed(what)
        if found is None:
            return f"{entry.distribution} is not installed"
        version = found
    if not entry.versions:
        return None
    inside = contains(entry.versions, version)
    if inside is None:
        return f"cannot read the {what} version {version!r}"
    if not inside:
        return f"allow-listed for {what} {entry.versions}, installed {version}"
    return None


def numpy_major() -> int | None:
    """The installed numpy's major version, from metadata (numpy is not imported)."""
    version = _installed("numpy")
    if version is None:
        return None
    try:
        return int(version.split(".")[0])
    except ValueError:
        return None


NUMPY_CORES = {"numpy.core": 1, "numpy._core": 2}  # numpy 2 renamed numpy.core


def numpy_core(module: str) -> tuple[int, str] | None:
    """``(numpy major, rest)`` for a module under either core spelling, else None."""
    for core, major in NUMPY_CORES.items():
        if module == core or module.startswith(core + "."):
            return major, module[len(core) :]
    return None


def candidate_modules(module: str) -> tuple[str, ...]:
    """Where to look for ``module`` here: numpy's core renamed in 2.0, pathlib split in 3.13."""
    core = numpy_core(module)
    if core is not None:
        return (("numpy._core" if (numpy_major() or 0) >= 2 else "numpy.core") + core[1],)
    if module == "pathlib._local" and sys.version_info < (3, 13):
        return ("pathlib",)
    return (_mirror(module) or module,)


# Lightning's unified package (``lightning``) holds a copy of ``pytorch_lightning`` as
# ``lightning.pytorch`` (other class objects), and its loader reads a checkpoint's
# ``pytorch_lightning`` names there: inside ``pl_legacy_patch`` (its Trainer and
# ``load_from_checkpoint`` loads), ``pickle.Unpickler`` is its ``_RedirectingUnpickler``.
# Lightning < 1.5 files name callback classes that a restore looks up by identity, so such
# a load reads them where Lightning's does (else the state is silently not restored).
_MIRROR = ("pytorch_lightning", "lightning.pytorch", "lightning")


def _mirror(module: str) -> str | None:
    """``module`` as Lightning's unified loader reads it while it is the one loading; else None."""
    name, unified, _ = _MIRROR
    if module != name and not module.startswith(name + "."):
        return None
    redirecting = getattr(sys.modules.get("pickle"), "Unpickler", None)
    if getattr(redirecting, "__name__", None) != "_RedirectingUnpickler" or not str(
        getattr(redirecting, "__module__", "")
    ).startswith(unified + "."):
        return None
    return unified + module[len(name) :]


def _check_kind(entry: Entry, found: Any) -> None:
    import enum

    if entry.kind == "enum" and not (isinstance(found, type) and issubclass(found, enum.Enum)):
        raise LookupError(f"{entry.qualname} is not an Enum here")
    if entry.kind in ("instance", "dict-subclass") and not isinstance(found, type):
        raise LookupError(f"{entry.qualname} is not a class here")
    if entry.kind == "dict-subclass" and not issubclass(found, dict):
        raise LookupError(f"{entry.qualname} is not a dict subclass here")


# --------------------------------------------------------------------------- the table

_NUMPY = ">=1.21"
_TORCH = ">=2.0"
_DS = ">=0.10,<1"  # checked against the source of deepspeed 0.10.0 and 0.16.4
_MMENGINE = ">=0.9,<0.11"  # Runner resume tested on 0.9.1, 0.10.4, 0.10.7 (tests/zoo)


def _std(module: str, name: str, kind: Kind, reason: str) -> Entry:
    return Entry(module, name, None, "", kind, reason)


def _torch(name: str, kind: Kind, reason: str, module: str = "torch") -> Entry:
    return Entry(module, name, "torch", _TORCH, kind, reason)


_TORCH_DTYPES = list(BY_TORCH)  # every name torch has for a dtype a checkpoint holds
# storage type name (as torch.save writes it) -> (torch dtype attribute, item size)
STORAGE_DTYPES: dict[str, tuple[str, int]] = STORAGES
_NUMPY_RANDOM_CLASSES = (
    ("numpy.random._mt19937", "MT19937"),
    ("numpy.random._pcg64", "PCG64"),
    ("numpy.random._pcg64", "PCG64DXSM"),
    ("numpy.random._philox", "Philox"),
    ("numpy.random._sfc64", "SFC64"),
    ("numpy.random.bit_generator", "SeedSequence"),
)
_NUMPY_RANDOM_CTORS = (
    ("numpy.random._pickle", "__bit_generator_ctor"),
    ("numpy.random._pickle", "__generator_ctor"),
    ("numpy.random._pickle", "__randomstate_ctor"),
    ("numpy.random", "__RandomState_ctor"),  # numpy < 1.17 pickles
    ("numpy.random.bit_generator", "__pyx_unpickle_SeedSequence"),
)
_PATH_CLASSES = ("Path", "PosixPath", "WindowsPath", "PurePath", "PurePosixPath", "PureWindowsPath")
_AT = "lightning"
_OC = ">=2.1,<2.5"


def _build_table() -> tuple[Entry, ...]:
    e: list[Entry] = []
    # ---- standard library
    e += [
        _std("builtins", "set", "constructor", "set(list) of already-built items"),
        _std("builtins", "frozenset", "constructor", "frozenset(list) of built items"),
        _std("builtins", "slice", "constructor", "slice of ints or None"),
        _std("builtins", "complex", "constructor", "complex(float, float) only"),
        _std(
            "builtins",
            "bytearray",
            "constructor",
            "bytearray(bytes) or (str, 'latin-1') only; never bytearray(n)",
        ),
        _std(
            "builtins",
            "bytes",
            "constructor",
            "bytes() only, as protocols 0-2 write b'' (empty numpy arrays); never bytes(n)",
        ),
    ]
    for name in ("object", "list", "dict", "int", "float", "str", "tuple", "bool"):
        e.append(
            _std(
                "builtins",
                name,
                "constant",
                "a builtin type used as a value (defaultdict factory, copyreg base); never called",
            )
        )
    e += [
        _std(
            "_codecs",
            "encode",
            "rebuild",
            "(str, 'latin1') -> bytes, as protocol 2 writes bytes",
        ),
        _std(
            "copyreg",
            "_reconstructor",
            "rebuild",
            "protocol 0/1 object: (allowed class, object or dict, None) -> empty instance",
        ),
        _std("collections", "OrderedDict", "constructor", "empty or from (key, value) pairs"),
        _std("collections", "Counter", "constructor", "from a dict of counts"),
        _std(
            "collections",
            "defaultdict",
            "constructor",
            "factory must be a builtin container/number type; torch would accept any callable",
        ),
        _std("collections", "deque", "constructor", "deque(list, maxlen int or None)"),
        _std("argparse", "Namespace", "instance", "plain attribute holder, no __setstate__"),
        Entry(
            "builtins",
            "getattr",
            None,
            "",
            "rule",
            "never called: only getattr(<class from this table>, <its 'method' row>) is read",
            args="method-of-listed-class",
        ),
        _std(
            "builtins",
            "object.__new__",
            "constant",
            "getattr(object, '__new__'): only as functools.partial's function; never called",
        ),
        Entry(
            "functools",
            "partial",
            None,
            "",
            "rule",
            "never made: partial(object.__new__, <instance class>, **plain data)() is NEWOBJ",
            args="new-of-listed-class",
        ),
    ]
    for name in ("datetime", "date", "time", "timedelta", "timezone"):
        e.append(_std("datetime", name, "constructor", "C type built from checked bytes/ints"))
    for name in _PATH_CLASSES:
        reason = "path from str parts; a WindowsPath off Windows comes back as PureWindowsPath"
        e.append(_std("pathlib", name, "constructor", reason))
        e.append(_std("pathlib._local", name, "constructor", reason + " (Python 3.13 name)"))
    # ---- numpy: one row under numpy 2's name covers numpy 1.x's too (``Entry.key``), and
    # resolves to whichever the running numpy has (``candidate_modules``)
    e += [
        Entry(
            "numpy._core.multiarray",
            "_reconstruct",
            "numpy",
            _NUMPY,
            "rebuild",
            "plain ndarray (a subclass only where an allow entry admits it; no object "
            "dtype), data length checked first",
        ),
        Entry(
            "numpy._core.multiarray",
            "scalar",
            "numpy",
            _NUMPY,
            "rebuild",
            "numpy scalar from a non-object dtype and exactly itemsize bytes",
        ),
        Entry(
            "numpy._core.numeric",
            "_frombuffer",
            "numpy",
            _NUMPY,
            "rebuild",
            "protocol-5 array: non-object dtype, buffer length checked before use",
        ),
        Entry(
            "numpy",
            "ndarray",
            "numpy",
            _NUMPY,
            "constant",
            "the ndarray type as _reconstruct's argument; never called",
        ),
        Entry(
            "numpy",
            "dtype",
            "numpy",
            _NUMPY,
            "constructor",
            "simple (non-object, non-structured) dtypes; state checked before __setstate__",
        ),
    ]
    for module, name in _NUMPY_RANDOM_CLASSES:
        e.append(
            Entry(
                module,
                name,
                "numpy",
                _NUMPY,
                "constant",
                "a numpy.random class as a ctor's argument, checked by identity; never called",
            )
        )
    for module, name in _NUMPY_RANDOM_CTORS:
        e.append(
            Entry(
                module,
                name,
                "numpy",
                _NUMPY,
                "rebuild",
                "re-implemented: only numpy's five bit generators (by name or class), "
                "every state field checked (numpy's own calls any class or callable given)",
            )
        )
    for name in NUMPY_CLASSES:
        e.append(
            Entry(
                "numpy.dtypes",
                name,
                "numpy",
                ">=1.25",
                "constant",
                "a dtype class as a value; never called",
            )
        )
    # ---- torch
    for name in _TORCH_DTYPES:
        e.append(_torch(name, "constant", "a torch.dtype value"))
    for name in STORAGE_DTYPES:
        e.append(_torch(name, "constant", "a storage type naming a dtype in persistent ids"))
    e.append(_torch("UntypedStorage", "constant", "untyped storage type", module="torch.storage"))
    for name in ("contiguous_format", "channels_last", "channels_last_3d", "preserve_format"):
        e.append(_torch(name, "constant", "a torch.memory_format value"))
    e += [
        _torch("Size", "constructor", "torch.Size of non-negative ints"),
        _torch("device", "constructor", "torch.device(str[, int])"),
        _torch("Tensor", "constant", "the tensor type as _rebuild_from_type_v2's argument"),
        _torch("Parameter", "constant", "the Parameter type", module="torch.nn.parameter"),
    ]
    for name in (
        "_rebuild_tensor",
        "_rebuild_tensor_v2",
        "_rebuild_parameter",
        "_rebuild_parameter_with_state",
        "_rebuild_meta_tensor_no_storage",
    ):
        e.append(
            _torch(
                name,
                "rebuild",
                "re-implemented: storage offset/size/stride checked against the storage",
                module="torch._utils",
            )
        )
    e.append(
        Entry(
            "torch._utils",
            "_rebuild_tensor_v3",
            "torch",
            ">=2.2",
            "rebuild",
            "re-implemented: as _rebuild_tensor_v2, dtype given (no storage type for it)",
        )
    )
    e.append(
        _torch(
            "_rebuild_sparse_tensor",
            "rebuild",
            "re-implemented: this file's tensors through torch's constructors, "
            "check_invariants=True on every release (torch 2.8-2.13 check only if asked)",
            module="torch._utils",
        )
    )
    e.append(
        _torch(
            "_get_layout",
            "rebuild",
            "re-implemented: a torch.layout by its name ('torch.sparse_coo'), nothing else",
            module="torch.serialization",
        )
    )
    e.append(
        _torch(
            "_rebuild_from_type_v2",
            "rebuild",
            "re-implemented: only torch.Tensor / Parameter with plain attributes",
            module="torch._tensor",
        )
    )
    e.append(
        Entry(
            "torch.storage",
            "_load_from_bytes",
            "torch",
            _TORCH,
            "rebuild",
            "a storage pickled with plain pickle: its bytes are loaded by this same loader",
        )
    )
    # Schedulers that kept their anneal staticmethod in state_dict()["anneal_func"]: OneCycleLR
    # to torch 2.2, SWALR to 2.5 (Lightning's StochasticWeightAveraging saves its state);
    # later releases store a name instead and still resume from the function
    for module, owner, functions in (
        ("torch.optim.lr_scheduler", "OneCycleLR", ("_annealing_cos", "_annealing_linear")),
        ("torch.optim.swa_utils", "SWALR", ("_cosine_anneal", "_linear_anneal")),
    ):
        e.append(_torch(owner, "constant", "a class, never called", module))
        for name in functions:
            e.append(
                _torch(
                    f"{owner}.{name}",
                    "staticmethod",
                    f"arithmetic on numbers; returned as {owner}'s anneal_func, never called",
                    module,
                )
            )
    # ---- frameworks
    for module, dist, versions in (
        ("lightning.fabric.utilities.data", _AT, ">=2.0"),
        ("lightning.pytorch.utilities.parsing", _AT, ">=2.0"),
        ("lightning_fabric.utilities.data", "lightning-fabric", ">=2.0"),
        ("pytorch_lightning.utilities.parsing", "pytorch-lightning", ">=1.0"),
    ):
        e.append(
            Entry(
                module,
                "AttributeDict",
                dist,
                versions,
                "dict-subclass",
                "dict subclass with attribute access only; filled via dict.__setitem__",
            )
        )
    # Lightning < 1.5 keyed each callback's state by its class (1.5 moved to string keys; 2.x
    # still looks states up by the class too): the stateful built-in callbacks of 1.0-1.4.
    # Read from a real 1.4.9 checkpoint and 1.4.9's source.
    for module, name in (
        ("pytorch_lightning.callbacks.early_stopping", "EarlyStopping"),
        ("pytorch_lightning.callbacks.model_checkpoint", "ModelCheckpoint"),
        ("pytorch_lightning.callbacks.timer", "Timer"),
        ("pytorch_lightning.callbacks.finetuning", "BackboneFinetuning"),
        ("pytorch_lightning.callbacks.pruning", "ModelPruning"),
    ):
        e.append(
            Entry(
                module,
                name,
                "pytorch-lightning",
                ">=1.0",
                "constant",
                "a callback class as the key of its state (Lightning < 1.5): returned, never "
                "called; a dict key hashes by identity",
            )
        )
    for module, name, kind, versions in (
        ("deepspeed.runtime.zero.config", "ZeroStageEnum", "enum", _DS),
        ("deepspeed.runtime.zero.offload_config", "OffloadDeviceEnum", "enum", _DS),
        ("deepspeed.runtime.zero.offload_config", "OffloadStateTypeEnum", "enum", ">=0.16,<1"),
        ("deepspeed.runtime.fp16.loss_scaler", "LossScaler", "instance", _DS),
        ("deepspeed.runtime.fp16.loss_scaler", "DynamicLossScaler", "instance", _DS),
        ("deepspeed.utils.tensor_fragment", "fragment_address", "instance", _DS),
    ):
        reason = (
            "Enum: only an existing member is returned (not torch-safe: torch's BUILD could "
            "mutate a shared member)"
            if kind == "enum"
            else "plain class with numeric attributes, no __setstate__"
        )
        e.append(
            Entry(module, name, "deepspeed", versions, kind, reason)  # type: ignore[arg-type]
        )
    # ---- omegaconf (Hydra / Lightning hyper-parameters); built by _omegaconf.py, never by
    # omegaconf's __setstate__; checked against the source of 2.1.2, 2.2.3, 2.3.0 and 2.4.0
    for module, name, versions in (
        ("omegaconf.dictconfig", "DictConfig", _OC),
        ("omegaconf.listconfig", "ListConfig", _OC),
        ("omegaconf.base", "Metadata", _OC),
        ("omegaconf.base", "ContainerMetadata", _OC),
        ("omegaconf.nodes", "AnyNode", _OC),
        ("omegaconf.nodes", "StringNode", _OC),
        ("omegaconf.nodes", "IntegerNode", _OC),
        ("omegaconf.nodes", "FloatNode", _OC),
        ("omegaconf.nodes", "BooleanNode", _OC),
        ("omegaconf.nodes", "EnumNode", _OC),
        ("omegaconf.nodes", "BytesNode", ">=2.2,<2.5"),
        ("omegaconf.nodes", "PathNode", ">=2.2,<2.5"),
    ):
        reason = (
            "state checked field by field into a fresh __dict__; strings pass the "
            "interpolation policy (_omegaconf.py)"
        )
        e.append(Entry(module, name, "omegaconf", versions, "instance", reason))
    for name in ("Any", "Dict", "List"):
        e.append(_std("typing", name, "constant", "a type annotation in omegaconf metadata"))
    # mmengine's MessageHub state (Runner checkpoints: mmdet, mmseg, mmpretrain, mmdet3d, ...)
    e.append(
        Entry(
            "mmengine.logging.history_buffer",
            "HistoryBuffer",
            "mmengine",
            _MMENGINE,
            "instance",
            "log history: numpy arrays and ints; its __setstate__ (writes a class-wide dict) is "
            "never called, so not torch-safe",
        )
    )
    for name in ("min", "max", "current", "mean"):
        e.append(
            Entry(
                "mmengine.logging.history_buffer",
                f"HistoryBuffer.{name}",
                "mmengine",
                _MMENGINE,
                "method",
                "a statistics method HistoryBuffer pickles in its state; returned, never called",
            )
        )
    # GluonTS 0.16 Lightning checkpoints: hyper-parameters hold the distribution head, pickled
    # as functools.partial(object.__new__, StudentTOutput, beta=...)() (read from a real
    # 0.16.2 file; 0.17 saves weights only). State: plain data only (new-of-listed-class).
    e.append(
        Entry(
            "gluonts.torch.distributions.studentT",
            "StudentTOutput",
            "gluonts",
            ">=0.16,<0.17",
            "instance",
            "DeepAR's default head: beta float and __init_args__; no __setstate__ or __new__",
        )
    )
    e += _dcp_rows()
    return tuple(e)


# torch.distributed.checkpoint (DCP): the globals a folder's .metadata names, read from real
# checkpoints saved by torch 2.1.2 (save_state_dict) and 2.15.0 (dcp.save); the classes were
# checked in the source of 2.1.2, 2.2.2, 2.5.1, 2.13.0 and 2.15.0. Bounded above: the tuple
# state of TensorProperties is rebuilt field by field (_dcp.py), so a new layout is refused.
_DCP = ">=2.1,<2.16"
_DCP_2_3 = ">=2.3,<2.16"
_DCP_MODULE = "torch.distributed.checkpoint.metadata"
_SHARD_MODULE = "torch.distributed._shard.sharded_tensor.metadata"  # 2.1-2.2's, kept since


def _dcp_rows() -> list[Entry]:
    dataclass_reason = "DCP dataclass, no __setstate__: str-named fields into a fresh __dict__"
    rows = [
        Entry(module, name, "torch", _DCP, "instance", dataclass_reason)
        for module, name in (
            (_DCP_MODULE, "Metadata"),
            (_DCP_MODULE, "MetadataIndex"),
            (_DCP_MODULE, "TensorStorageMetadata"),
            (_DCP_MODULE, "ChunkStorageMetadata"),
            (_DCP_MODULE, "BytesStorageMetadata"),
            ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
        )
    ]
    # StorageMeta and DCP's own _MEM_FORMAT_ENCODING: absent in 2.2.2, present in 2.4.1 (2.3 not
    # read: the range takes it, and a name a release lacks is refused when it is resolved)
    rows.append(Entry(_DCP_MODULE, "StorageMeta", "torch", _DCP_2_3, "instance", dataclass_reason))
    for module, enum_name, enum_versions in (
        (_DCP_MODULE, "_MEM_FORMAT_ENCODING", _DCP_2_3),
        (_SHARD_MODULE, "MEM_FORMAT_ENCODING", _DCP),
    ):
        rows.append(
            Entry(
                module,
                "TensorProperties",
                "torch",
                _DCP,
                "instance",
                "its __setstate__ is never called: the 5- or 6-field tuple state is checked "
                "field by field (dtype, layout, bools, memory-format member, int strides)",
            )
        )
        rows.append(
            Entry(
                module,
                enum_name,
                "torch",
                enum_versions,
                "enum",
                "memory-format code: an existing member",
            )
        )
    return rows


ENTRIES: tuple[Entry, ...] = _build_table()
# by canonical key, the one judge asks: a row under another spelling (numpy.core) would be dead
_INDEX: dict[Key, Entry] = {x.key: x for x in ENTRIES}


def entries() -> tuple[Entry, ...]:
    """Every entry, whether or not it applies to this install."""
    return ENTRIES


def lookup(module: str, name: str) -> Entry | None:
    """The entry for ``module.name``, or None, however the pickle splits or spells a dotted
    name (``("module", "Class.function")`` or ``("module.Class", "function")``; numpy's two
    core names): what is imported is always the entry's own ``module`` and ``name``."""
    return _INDEX.get(canonical(module, name))


def row(key: Key) -> tuple[Entry | None, str | None]:
    """The entry that covers the global ``key``: its own row, or its enum's for
    ``Enum.MEMBER`` named as one global (protocol 4), with the member's name."""
    entry = _INDEX.get(key)
    if entry is not None:
        return entry, None
    owner, _, member = key.rpartition(".")
    entry = _INDEX.get(canonical_name(owner))  # a canonical key's prefix is canonical: no-op
    return (entry, member) if entry is not None and entry.kind == "enum" else (None, None)


def listed(obj: Any) -> Entry | None:
    """The applicable entry that names this very object in a module already imported, or
    None: an allow entry for another name of an allow-listed object (``restore =
    torch._tensor._rebuild_from_type_v2`` re-exported) gets the entry's checked handling,
    never a free call. Imports nothing."""
    for entry in ENTRIES:
        for module_name in candidate_modules(entry.module):
            module = sys.modules.get(module_name)
            if module is not None and _member_or_missing(entry, module) is obj:
                return entry if entry.applies() else None
    return None


def _member_or_missing(entry: Entry, module: Any) -> Any:
    try:
        return _member(entry, module)
    except LookupError:  # a method row whose class holds no plain function there
        return _MISSING


def covering(module: str, name: str) -> Entry | None:
    """The entry that admits ``module.name``: its own row, or its enum's for a member."""
    return row(canonical(module, name))[0]


def storage_type(entry: Entry | None) -> str | None:
    """The storage type (a :data:`STORAGE_DTYPES` key) an entry names, or None."""
    return entry.name if entry is not None and entry.name in STORAGE_DTYPES else None
