"""The loading policy: which globals resolve, what may be called, and what may receive state.

Rules, whatever the bytes:

* A global resolves only as :func:`_gate.judge` admits it (the allowlist, then the call's
  ``allow=`` and the process-wide entries; nothing the deny list names).
* REDUCE/NEWOBJ reach only handlers chosen by the global's *kind*; the
  allow-listed originals of rebuild functions are never called with the
  file's arguments.
* BUILD, SETITEM, APPEND and ADDITEMS act only on objects this load created
  (plain lists/dicts/sets from opcodes, or instances a handler registered),
  never on a global, a class, a function, a module or a shared enum member.
* Work is charged to one :class:`Budget` per load, shared by nested loads: every
  call, NEWOBJ and BUILD pays for the size of what it is handed, so a memoized
  argument passed a thousand times costs a thousand times (opcodes themselves
  are bounded by the file's length).
* The result is walked once (:func:`check_result`): its real nesting depth, over
  every path (memo shortcuts do not shorten it), and no allow-listed function
  that could run code is handed back as a value (classes and constants may be).
"""

from __future__ import annotations

import collections
import enum
import functools
import gc
import itertools
import pathlib
import sys
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from .._text import cut, short
from .._text import named as describe
from . import _dcp, _numpy, _objects, _omegaconf, _partial, _tensors
from ._gate import ALLOWLIST, NOT_LISTED, Allow, judge
from ._limits import SIZED, Budget, weight
from ._machine import MAX_NESTING, Machine, Source
from .allowlist import Entry, listed, storage_type
from .deny import REFUSAL as DENIED_REFUSAL
from .deny import denied_object
from .errors import CheckpointError, UnsafeCheckpointError

Builder = Callable[[Any, Any], None]
StorageGetter = Callable[["str | None", tuple[Any, ...]], Any]


@dataclass(frozen=True)
class Role:
    """What a resolved global is to the loader: its name, kind and handler key."""

    qualname: str
    kind: str  # an allowlist kind, "user" for the call's allow=, "partial" (_partial.py)
    key: str
    obj: Any
    entry: Entry | None = None
    value_ok: bool = True  # may appear in the result as a value


def harmless_value(entry: Entry, obj: Any) -> bool:
    """A class, a non-callable or a listed method may be returned as data; no other function,
    and no rule global (``functools.partial`` is a class)."""
    if entry.kind == "rule":
        return False
    return isinstance(obj, type) or not callable(obj) or entry.kind in ("method", "staticmethod")


class SafeMachine(Machine):
    """The machine ``load`` runs: allowlist, checked handlers, state only on its own objects."""

    def __init__(
        self,
        source: Source,
        *,
        allow: Allow,
        tensors: _tensors.Tensors,
        storages: StorageGetter | None,
        budget: Budget,
        load_nested: Callable[[bytes], Any] | None = None,
        encoding: str = "utf-8",
        object_arrays: bool = False,
    ) -> None:
        super().__init__(source, encoding)
        self.object_arrays = object_arrays  # numpy object dtypes admitted (Request's)
        self.budget = budget
        self.allow = allow
        self.tensors = tensors
        self.storages = storages
        self.load_nested = load_nested
        self._roles: dict[int, Role] = {}
        self._unsafe: dict[int, str] = {}  # id -> name of the roles that may not be values
        self._cache: dict[tuple[str, str], Any] = {}
        self._rules: dict[Any, tuple[Any, Any]] = {}  # (rule, id(owner), name) -> (owner, made)
        self._from_bytes: dict[int, tuple[bytes, Any]] = {}  # id(bytes) -> (bytes, storage)
        # objects this load made that BUILD may give state (by id), and how: the first builder
        # registered for their type, else their own (a row per object only where it differs)
        self._created: dict[int, Any] = {}
        self._usual: dict[int, Builder] = {}  # by id(type): no metaclass __hash__ runs
        self._builders: dict[int, Builder] = {}
        self._dicts: dict[int, Any] = {}  # owned dict subclasses and deques
        self._random_quota = _numpy.random_quota()
        self._omegaconf: _omegaconf.Builder | None = None

    def run(self) -> Any:
        value = super().run()
        if self._omegaconf is not None:
            self._omegaconf.finish()  # parents, depth, interpolations: once everything is built
        return value

    def release(self) -> None:
        super().release()  # and what only BUILD and the calls needed; created() stays
        self._usual, self._builders, self._dicts, self._rules, self._from_bytes = {}, {}, {}, {}, {}
        self._omegaconf = None

    # ------------------------------------------------------------------ globals
    def find_global(self, module: str, name: str) -> Any:
        key = (module, name)
        if key in self._cache:
            return self._cache[key]
        found = self._resolve(module, name)
        self._cache[key] = found
        return found

    def _resolve(self, module: str, name: str) -> Any:
        verdict = judge(module, name, self.allow)  # the one gate: inspect asks it too
        if not verdict.admitted:
            raise refused(f"{module}.{name}", verdict.why or NOT_LISTED)
        entry = verdict.entry
        if verdict.source == ALLOWLIST and entry is not None:
            if verdict.member is not None:  # Class.MEMBER as one global (protocol 4)
                owner = self._resolve_entry(entry)
                return _objects.enum_member_by_name(owner, verdict.member)
            return self._resolve_entry(entry)
        try:
            user = self.allow.obtain(verdict, module)
        except (ImportError, LookupError) as exc:  # no attack: this process lacks the module
            raise CheckpointError(
                f"global {cut(f'{module}.{name}')} is allowed but cannot be imported here: "
                f"{cut(str(exc), 400)} (an allowed global is imported where the file is loaded: "
                "its module must be on sys.path there)"
            ) from None
        reason = denied_object(user)  # a string entry, now that it is imported
        if reason is not None:
            raise refused(f"{module}.{name}", f"{DENIED_REFUSAL}: {reason}")
        entry = listed(user)  # an allow-listed object by another name: its checked handling
        if entry is not None:
            return self._resolve_entry(entry)
        self._add_role(Role(f"{module}.{name}", "user", f"{module}.{name}", user))
        return user

    def _resolve_entry(self, entry: Entry) -> Any:
        try:
            obj = entry.resolve()
        except LookupError as exc:
            raise refused(entry.qualname, str(exc)) from None
        self._add_role(
            Role(entry.qualname, entry.kind, entry.key, obj, entry, harmless_value(entry, obj))
        )
        return obj

    def _add_role(self, role: Role) -> None:
        self._roles[id(role.obj)] = role
        if not role.value_ok:
            self._unsafe[id(role.obj)] = role.qualname

    def created(self) -> dict[int, Any]:
        """Objects this load made and may have given state (walked by :func:`check_result`)."""
        return self._created

    def forbidden_values(self) -> dict[int, str]:
        """``id -> name`` of the resolved globals that must not come back as values."""
        return self._unsafe

    def role_of(self, value: Any) -> Role | None:
        role = self._roles.get(id(value))
        return role if role is not None and role.obj is value else None

    def entry_of(self, value: Any) -> Entry | None:
        """The allowlist entry ``value`` was resolved from in this load (None: not from it)."""
        role = self.role_of(value)
        return role.entry if role is not None else None

    def hand_to_user(self, value: Any, to: Any) -> None:
        """Refuse to hand ``value`` to the caller's own callable ``to`` (an ``allow=`` or
        process-wide global) where it holds a global that may only be called while loading:
        the checked ``getattr``, a rebuild function, a partial. Those are safe only inside
        compatshim's rules; ``functools.reduce`` would call them freely. The walk is charged
        per object visited, each time (a shared argument passed again is walked again)."""
        unsafe = self._unsafe
        if not unsafe:
            return
        seen: set[int] = set()
        stack = [value]
        what = f"arguments of {describe(to)}"
        while stack:
            node = stack.pop()
            if type(node) in _LEAVES or id(node) in seen:
                continue
            seen.add(id(node))
            if len(seen) % 4096 == 0:
                self.budget.charge(4096, what)
            name = unsafe.get(id(node))
            if name is not None:
                raise UnsafeCheckpointError(
                    f"{name} handed to {describe(to)} refused: it may only be called by "
                    "compatshim's own rules, never by a callable the caller allowed",
                    (name,),
                )
            if type(node) in _CONTAINERS or id(node) in self._created:
                stack.extend(_children(node))
        self.budget.charge(len(seen) % 4096, what)

    # ------------------------------------------------------------------ registration
    def register_builder(self, obj: Any, builder: Builder) -> None:
        key = id(obj)
        self._created[key] = obj
        if self._usual.setdefault(id(type(obj)), builder) != builder:  # == : bound methods
            self._builders[key] = builder

    def register_dict(self, obj: Any) -> None:
        self._dicts[id(obj)] = obj

    # ------------------------------------------------------------------ calls
    def call(self, func: Any, args: tuple[Any, ...]) -> Any:
        role = self._roles.get(id(func))
        if role is None or role.obj is not func:
            raise UnsafeCheckpointError(
                f"call of {describe(func)} refused: only allow-listed globals may be called",
                (f"call {describe(func)}",),
            )
        self.budget.charge(weight(args), role.qualname)
        kind = role.kind
        if kind == "rebuild" or kind == "constructor":  # the common case first
            return self._call_handler(role, func, args)
        if kind == "user":
            return self._call_user(func, args)
        if kind in ("constant", "method", "staticmethod"):
            raise UnsafeCheckpointError(f"{role.qualname} may not be called", (role.qualname,))
        if kind == "rule" and role.entry is not None and role.entry.args == _partial.RULE:
            return self._partial(role, args)
        if kind == "partial":
            return self.new_object(_partial.call(func, args), (), {}, func)
        if kind == "rule" and role.entry is not None and role.entry.args is not None:
            return self._rule(role.entry.args, args)
        if kind == "enum":
            return _objects.enum_member(func, args)
        if kind in ("instance", "dict-subclass"):
            if args:
                raise _objects.bad(role.qualname, args)
            return self.new_object(func, (), {})
        return self._call_handler(role, func, args)

    def _call_handler(self, role: Role, func: Any, args: tuple[Any, ...]) -> Any:
        handler = HANDLERS.get(role.key)
        if handler is None:
            raise UnsafeCheckpointError(f"{role.qualname} has no checked handler", (role.qualname,))
        made = handler(self, func, args)
        kind = type(made)
        if kind in SIZED and not any(made is arg for arg in args):
            # what was built, not only what was passed: a frozenset of a reused 20 000-item
            # list is 2 MB each time, 13x the list's pointers (sys.getsizeof of a builtin
            # container reads its allocation; it runs no code of the file's)
            self.budget.charge(sys.getsizeof(made), role.qualname)
        if kind is tuple or kind is frozenset:
            self.hashable(made, self.nesting(made))
        return made

    def _construct(self, func: Any, args: tuple[Any, ...], key: str) -> Any:
        self.charge_keys(_objects.keys_hashed(key, args))  # before the constructor hashes them
        if key.startswith("pathlib."):  # before it splits the text: a list slot a part
            self.budget.charge(_objects.PATH_PART_BYTES * _objects.path_parts(args), key)
        made = _objects.CONSTRUCTORS[key](func, args)
        if isinstance(made, (pathlib.PurePath, slice)):
            # == compares a path's text (a slot, unseen); a slice hashes its ints (3.12+),
            # uncached: each costs what it was made from wherever it is hashed or compared
            self.price(made, weight(args))
        elif isinstance(made, collections.deque):
            self.register_dict(made)  # owned: APPENDS may fill it
        elif isinstance(
            made, (collections.OrderedDict, collections.Counter, collections.defaultdict)
        ):
            self.register_dict(made)
            self.register_builder(made, _instance_builder(key))
        return made

    def _rule(self, rule: str, args: tuple[Any, ...]) -> Any:
        """A rule's row, judged once per (owner, name) a load names: the judgement (~24 us:
        version checks, two resolves) depends on nothing else, and a memo-shared call
        repeated it once per 5 bytes of the file."""
        named = len(args) == 2 and type(args[1]) is str and len(args[1]) <= _objects.GETATTR_NAME
        key = (rule, id(args[0]), args[1]) if named else None  # a short name: bounded to hash
        found = self._rules.get(key) if key is not None else None
        if found is not None and found[0] is args[0]:
            return found[1]
        made = self._resolve_entry(_objects.RULES[rule](args, self.entry_of))
        if key is not None:
            self._rules[key] = (args[0], made)  # holds the owner: its id stays its own
        return made

    def _partial(self, role: Role, args: tuple[Any, ...]) -> Any:
        """``functools.partial(object.__new__)``: a stand-in, never a value (``_partial.py``)."""
        self.budget.charge(_partial.STAND_IN_BYTES, role.qualname)
        made = _partial.start(args, self.role_of)
        self._add_role(Role(role.qualname, "partial", role.key, made, role.entry, False))
        self.register_builder(
            made, lambda o, s: _partial.build(o, s, self.role_of, self.budget.charge)
        )
        return made

    def _tensor_rebuild(self, func: Any) -> _tensors.TensorRebuild | None:
        role = self.role_of(func)
        return _tensors.REBUILDS.get(role.key) if role is not None else None

    def _allowed_subclass(self, cls: Any) -> Builder | None:
        """BUILD for a class an allow entry admitted (its own ``__setstate__`` runs, with the
        state checked as for its other calls), None for any other."""
        role = self.role_of(cls)
        return self._build_user if role is not None and role.kind == "user" else None

    def _call_user(self, func: Any, args: tuple[Any, ...]) -> Any:
        self.hand_to_user(args, func)
        made = func(*args)
        # an instance of the class called, or an array of an allowed array class the file names
        # (numpy's _mareconstruct returns a new MaskedArray; a function's return may be shared,
        # so no other kind): BUILD then runs that class's own __setstate__
        if type(made) is func or (
            _numpy.is_array(made) and self._allowed_subclass(type(made)) is not None
        ):
            self._register_user_instance(made)
        return made

    def _register_user_instance(self, made: Any) -> None:
        if isinstance(made, enum.Enum):
            return  # members are shared: never receive state
        if isinstance(made, dict):
            self.register_dict(made)
        self.register_builder(made, self._build_user)

    def _build_user(self, inst: Any, state: Any) -> None:
        self.hand_to_user(state, type(inst))  # its own __setstate__ may call what it is given
        _user_build(inst, state)

    def _reconstructor(self, args: tuple[Any, ...]) -> Any:
        if len(args) != 3:
            raise _objects.bad("copyreg._reconstructor", args)
        cls, base, state = args
        role = self.role_of(cls)
        if role is None or role.kind not in ("instance", "dict-subclass", "user"):
            raise UnsafeCheckpointError(
                f"copyreg._reconstructor of {describe(cls)} refused", (describe(cls),)
            )
        if base is object and state is None:
            return self.new_object(cls, (), {})
        if base is dict and type(state) is dict and role.kind != "instance":
            made = self.new_object(cls, (), {})
            dict.update(made, state)
            return made
        raise _objects.bad("copyreg._reconstructor", args)

    def _storage_from_bytes(self, args: tuple[Any, ...]) -> Any:
        if len(args) != 1 or type(args[0]) is not bytes or self.load_nested is None:
            raise _objects.bad("torch.storage._load_from_bytes", args)
        done = self._from_bytes.get(id(args[0]))
        if done is not None and done[0] is args[0]:  # memo-shared: a whole load (~160 us)
            return done[1]  # again per 5 bytes of the file; torch.save never repeats one
        self.budget.charge(2 * len(args[0]), "torch.storage._load_from_bytes")
        import torch

        storage = self.load_nested(args[0])
        if not isinstance(storage, (torch.storage.TypedStorage, torch.UntypedStorage)):
            raise CheckpointError("a pickled storage holds something else than a storage")
        self._from_bytes[id(args[0])] = (args[0], storage)
        return self.tensors.add_storage(storage)

    def new_object(
        self, cls: Any, args: tuple[Any, ...], kwargs: dict[str, Any], partial: Any = None
    ) -> Any:
        """NEWOBJ; ``partial``: made by ``_partial``'s rule (checked plain state)."""
        self.budget.charge(weight(args) + len(kwargs), "NEWOBJ")
        role = self.role_of(cls)
        kind = role.kind if role is not None else None
        if kind == "user" and isinstance(cls, type):
            self.hand_to_user((args, kwargs), cls)
            made = cls.__new__(cls, *args, **kwargs)
            if type(made) is cls:
                self._register_user_instance(made)
            return made
        if role is not None and role.key in _omegaconf.CLASSES and not args and not kwargs:
            return self._new_omegaconf(cls, role.key)
        if role is None or kind not in ("instance", "dict-subclass") or args or kwargs:
            raise UnsafeCheckpointError(
                f"NEWOBJ of {describe(cls)} refused: only allow-listed plain classes, "
                "without arguments",
                (f"NEWOBJ {describe(cls)}",),
            )
        if kind == "dict-subclass":
            made = dict.__new__(cls)
            self.register_dict(made)
        else:
            if cls.__new__ is not object.__new__:
                raise UnsafeCheckpointError(
                    f"{role.qualname} has its own __new__: refused", (role.qualname,)
                )
            made = object.__new__(cls)
        if partial is not None:
            self.register_builder(made, _partial.instance_builder(partial, self.budget.charge))
            return made
        self.register_builder(made, _instance_builder(role.qualname))
        return made

    def _new_omegaconf(self, cls: Any, key: str) -> Any:
        if self._omegaconf is None:
            self._omegaconf = _omegaconf.Builder(
                self.role_of, self.allow.resolvers, self.budget.charge
            )
        made = self._omegaconf.new(cls, key)
        self.register_builder(made, self._omegaconf.build)
        return made

    # ------------------------------------------------------------------ state
    def build(self, inst: Any, state: Any) -> None:
        self.budget.charge(weight(state), "BUILD")
        builder = self._builders.get(id(inst)) or self._usual.get(id(type(inst)))
        if self._created.get(id(inst)) is not inst or builder is None:
            raise UnsafeCheckpointError(
                f"BUILD on {describe(inst)} refused: state is set only on objects this file "
                "created, of allowed types",
                (f"BUILD {describe(inst)}",),
            )
        if self.measured(inst):  # its hash was counted at the cost its state had then
            raise UnsafeCheckpointError(
                f"BUILD on {describe(inst)} refused: it was already hashed or put in a tuple "
                "(its hash reads its state; pickle gives an object its state before any use)",
                (f"BUILD {describe(inst)}",),
            )
        builder(inst, state)

    def set_items(self, target: Any, pairs: list[Any]) -> None:
        if type(target) is dict:
            setter: Callable[[Any, Any, Any], None] = dict.__setitem__
        elif self._dicts.get(id(target)) is target:
            if isinstance(target, collections.OrderedDict):
                setter = collections.OrderedDict.__setitem__
            else:
                setter = dict.__setitem__
        else:
            raise UnsafeCheckpointError(
                f"SETITEM into {describe(target)} refused: only dicts this file created",
                (f"SETITEM {describe(target)}",),
            )
        for index in range(0, len(pairs), 2):
            setter(target, pairs[index], pairs[index + 1])

    def append_items(self, target: Any, items: list[Any]) -> None:
        owned: Any = self._dicts.get(id(target))
        if type(target) is collections.deque and owned is target:
            owned.extend(items)
            return
        if type(target) is not list:
            raise UnsafeCheckpointError(
                f"APPEND to {describe(target)} refused: only lists this file created",
                (f"APPEND {describe(target)}",),
            )
        target.extend(items)

    def add_items(self, target: Any, items: list[Any]) -> None:
        if type(target) is not set:
            raise UnsafeCheckpointError(
                f"ADDITEMS to {describe(target)} refused: only sets this file created",
                (f"ADDITEMS {describe(target)}",),
            )
        target.update(items)

    def persistent_load(self, pid: Any) -> Any:
        if type(pid) is not tuple or not pid:
            raise CheckpointError(f"persistent id is {short(pid)}, expected a tuple")
        typename = pid[0].decode("ascii", "replace") if type(pid[0]) is bytes else pid[0]
        if typename != "storage":
            extra = (
                " (a legacy nn.Module container record; torch would compare its source "
                "code and may write a .patch file)"
                if typename == "module"
                else ""
            )
            raise UnsafeCheckpointError(
                f"persistent id of type {short(typename)} refused{extra}",
                (f"persistent id {short(typename)}",),
            )
        if self.storages is None or len(pid) < 2:
            raise UnsafeCheckpointError(
                "a storage reference in a plain pickle refused (no storage records)",
                ("persistent id 'storage'",),
            )
        storage = self.storages(storage_type(self.entry_of(pid[1])), pid[2:])
        return self.tensors.add_storage(storage)


Handler = Callable[[SafeMachine, Any, tuple[Any, ...]], Any]
_NUMPY = "numpy._core.multiarray."  # Entry.key folds numpy's two core spellings into this one


#: The one checked handler of each ``constructor`` / ``rebuild`` entry, by :attr:`Entry.key`.
def _tensor(rebuild: _tensors.TensorRebuild) -> Handler:
    return lambda m, f, a: rebuild(m.tensors, a)


def _random(make: Callable[..., Any]) -> Handler:
    return lambda m, f, a: make(a, m.register_builder, m._random_quota)


def _constructor(key: str) -> Handler:
    return lambda m, f, a: m._construct(f, a, key)


HANDLERS: dict[str, Handler] = {
    **{key: _tensor(rebuild) for key, rebuild in _tensors.REBUILDS.items()},
    **{key: _random(make) for key, make in _numpy.RANDOM.items()},
    **{key: _constructor(key) for key in _objects.CONSTRUCTORS},
    "torch._tensor._rebuild_from_type_v2": lambda m, f, a: _tensors.rebuild_from_type_v2(
        m.tensors, a, m._tensor_rebuild
    ),
    _NUMPY + "_reconstruct": lambda m, f, a: _numpy.reconstruct(
        f, a, m.register_builder, m.object_arrays, m._allowed_subclass
    ),
    _NUMPY + "scalar": lambda m, f, a: _numpy.scalar(f, a),
    "numpy._core.numeric._frombuffer": lambda m, f, a: _numpy.frombuffer(f, a),
    "numpy.dtype": lambda m, f, a: _numpy.make_dtype(f, a, m.register_builder, m.object_arrays),
    "torch.Size": lambda m, f, a: _tensors.make_size(f, a),
    "torch.device": lambda m, f, a: _tensors.make_device(f, a),
    "copyreg._reconstructor": lambda m, f, a: m._reconstructor(a),
    "torch.storage._load_from_bytes": lambda m, f, a: m._storage_from_bytes(a),
    "torch.serialization._get_layout": lambda m, f, a: _dcp.layout(a),
    "torch._utils._rebuild_sparse_tensor": lambda m, f, a: _tensors.rebuild_sparse(
        m.tensors, a, m.budget.charge
    ),
}


@functools.cache
def _instance_builder(what: str) -> Builder:
    """BUILD for plain instances named ``what`` (one function per name, not per object);
    DCP's ``TensorProperties`` has its own (tuple state, ``_dcp.BUILDERS``)."""
    special = _dcp.BUILDERS.get(what)
    if special is not None:
        return special
    return lambda inst, state: _objects.set_instance_dict(inst, state, what)


def _user_build(inst: Any, state: Any) -> None:
    """BUILD on an instance of a class the caller allowed: its own __setstate__ if it has one."""
    setstate = getattr(type(inst), "__setstate__", None)
    if setstate is not None and setstate is not getattr(object, "__setstate__", None):
        inst.__setstate__(state)
        return
    _objects.set_instance_dict(inst, state, describe(type(inst)))


def refused(qualname: str, why: str) -> UnsafeCheckpointError:
    return UnsafeCheckpointError(f"global {cut(qualname)} refused: {cut(why, 400)}", (qualname,))


def check_result(
    value: Any,
    what: str,
    forbidden: dict[int, str] | None = None,
    created: dict[int, Any] | None = None,
    bare: dict[int, Any] | None = None,
    limit: int = MAX_NESTING,
) -> None:
    """Refuse a result nested deeper than ``limit`` along any path, or holding a forbidden value.

    Depth is the longest path (post-order, each object measured once), so references that
    skip ahead through the memo cannot hide a deep chain; a cycle is not a path. Iterative.
    ``bare``: objects known to hold nothing to walk (tensors this load made without Python
    attributes), counted as one level without being entered.
    """
    forbidden = forbidden or {}
    created = created or {}
    bare = bare or {}
    height: dict[int, int] = {}
    on_path: set[int] = set()
    frames: list[list[Any]] = []  # [object, iterator over its children, tallest child]
    if type(value) not in _LEAVES and id(value) in forbidden:  # the result itself, too
        raise UnsafeCheckpointError(
            f"{what}: is {forbidden[id(value)]}; it may only be called while loading (a caller "
            "that later calls it would run code)",
            (forbidden[id(value)],),
        )
    node: Any = value  # the next object to enter (_DONE: none); one place enters, no closure
    while True:
        if node is not _DONE:
            if len(frames) >= limit:
                raise CheckpointError(f"{what}: values nested deeper than {limit} levels")
            children = _children(node)
            if children is _NONE:  # one level, no frame and no row in height: entered again
                if frames and frames[-1][2] < 1:  # at each use, at the cost of one call
                    frames[-1][2] = 1
            else:
                on_path.add(id(node))
                frames.append([node, iter(children), 0])
            node = _DONE
        if not frames:
            return
        frame = frames[-1]
        for child in frame[1]:
            kind = type(child)
            if kind in _LEAVES:
                continue
            key = id(child)
            if key in forbidden:
                raise UnsafeCheckpointError(
                    f"{what}: holds {forbidden[key]} as a value; it may only be called while "
                    "loading (a caller that later calls it would run code)",
                    (forbidden[key],),
                )
            if key in bare and key not in created:
                if frame[2] < 1:
                    frame[2] = 1
                continue
            if not (kind in _CONTAINERS or key in created or _is_plain_instance(child)):
                continue
            known = height.get(key)
            if known is None:
                if key in on_path:
                    continue  # a cycle: repr, deepcopy and pickle handle those
                node = child
                break
            if known > frame[2]:
                frame[2] = known
        else:
            frames.pop()
            done, _, tallest = frame
            on_path.discard(id(done))
            height[id(done)] = tallest + 1
            if tallest + 1 > limit:
                raise CheckpointError(f"{what}: values nested deeper than {limit} levels")
            if frames and tallest + 1 > frames[-1][2]:
                frames[-1][2] = tallest + 1


_DONE = object()
_NONE: tuple[Any, ...] = ()  # what _children gives for an object with nothing inside
_HAVE_GC = 1 << 14  # Py_TPFLAGS_HAVE_GC: gc.get_referents sees what an instance holds


def _children(node: Any) -> Iterable[Any]:
    if isinstance(node, dict):
        extra = getattr(node, "__dict__", None)
        items: Iterable[Any] = itertools.chain(node.keys(), node.values())
        return itertools.chain(items, extra.values()) if extra else items
    if type(node) in _CONTAINERS or isinstance(node, collections.deque):
        return node  # type: ignore[no-any-return]
    if _is_object_array(node):  # numpy.load(allow_pickle=True), hardened (Request.object_arrays)
        return node.flat  # type: ignore[no-any-return]
    kind = type(node)
    if kind.__flags__ & _HAVE_GC:  # no attribute: reading __dict__ would make one (64 bytes,
        held = gc.get_referents(node)  # kept); compared by identity: no __eq__ of theirs runs
        if not held or (len(held) == 1 and held[0] is kind):
            return _NONE
    extra = getattr(node, "__dict__", None)
    return extra.values() if extra else _NONE


_CONTAINERS = frozenset(
    {
        list,
        tuple,
        dict,
        set,
        frozenset,
        collections.deque,
        collections.OrderedDict,
        collections.defaultdict,
        collections.Counter,
    }
)
_LEAVES = frozenset({int, float, str, bytes, bool, type(None), complex})


def _is_object_array(value: Any) -> bool:
    kind = type(value)
    return kind.__name__ == "ndarray" and kind.__module__ == "numpy" and value.dtype.kind == "O"


def _is_plain_instance(value: Any) -> bool:
    return type(value).__module__ in _PLAIN_MODULES


_PLAIN_MODULES = frozenset(
    {
        "argparse",
        "torch",  # tensors and Parameters may carry Python attributes
        "torch.nn.parameter",
        "lightning.fabric.utilities.data",
        "lightning.pytorch.utilities.parsing",
        "lightning_fabric.utilities.data",
        "pytorch_lightning.utilities.parsing",
        "deepspeed.runtime.fp16.loss_scaler",
        "deepspeed.utils.tensor_fragment",
        "mmengine.logging.history_buffer",
    }
)
