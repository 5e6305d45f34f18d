"""The ``new-of-listed-class`` rule: ``functools.partial(object.__new__, cls, **kwargs)()``.

Pickle protocols 2 and 3 write an object whose class defines ``__getnewargs_ex__``
(GluonTS's ``@validated`` classes: ``StudentTOutput`` in every GluonTS 0.16
Lightning checkpoint) this way, where protocol 4 writes NEWOBJ_EX::

    partial = functools.partial(getattr(object, "__new__"))    # REDUCE
    partial.__setstate__((object.__new__, (cls,), kwargs, None))  # BUILD
    obj = partial()                                             # REDUCE, no arguments
    obj.__dict__.update(state)                                  # BUILD

``object.__new__`` makes an empty instance and ignores ``kwargs`` (they are
the arguments ``__init__`` took; ``__init__`` is not called). So the whole
shape is NEWOBJ of ``cls`` and is loaded as exactly that: no
``functools.partial`` is ever made. A :class:`Pending` stands for it while the
pickle runs; it is not callable, receives state once (checked here), may be
called once, with no arguments, after that, and is never a value of the
result (``check_result`` refuses it, as every rule global). What it makes is
an empty instance of an ``instance`` row's class (``SafeMachine.new_object``:
no class with its own ``__new__``), whose state may hold only plain names
and ``__init_args__``, and only plain data (:func:`plain_data`): nothing
callable can shadow a method of the class.

Why this is no gadget: the file chooses nothing that runs. The function is
fixed (``object.__new__``, by identity), the class must already be on the
table for plain instances, positional arguments beyond the class are refused
(``object.__new__`` would take them only for a class that ignores them), and
``kwargs`` are data that nothing reads. Checking the data walks each value
once per use, charged to the load's budget.
"""

from __future__ import annotations

import collections
from typing import Any, Callable

from .._text import short
from . import _omegaconf
from ._limits import cost
from .errors import CheckpointError, UnsafeCheckpointError

RULE = "new-of-listed-class"
OBJECT_NEW = "builtins.object.__new__"
INIT_ARGS = "__init_args__"  # GluonTS @validated: the constructor arguments, read by __repr__
_LEAVES = frozenset({type(None), bool, int, float, str, bytes})
_MAPPINGS = (dict, collections.OrderedDict)

RoleOf = Callable[[Any], Any]  # SafeMachine.role_of
Charge = Callable[[int, str], None]  # _limits.Budget.charge


class Pending:
    """Stands for ``functools.partial(object.__new__)`` while one load runs."""

    __slots__ = ("built", "called", "cls", "func", "keywords")

    def __init__(self, func: Any) -> None:
        self.func = func
        self.cls: Any = None
        self.keywords: frozenset[str] = frozenset()
        self.built = False
        self.called = False


def refused(why: str) -> UnsafeCheckpointError:
    return UnsafeCheckpointError(
        f"functools.partial refused: {why} (only partial(object.__new__, <class allow-listed "
        "for instances>, **plain data), called at once with no arguments, is read)",
        ("functools.partial",),
    )


#: what each partial costs the load's budget: its role, table entries and stand-in (~1 KB);
#: one memo-shared call made one per 11 bytes of a file (185x its size in memory)
STAND_IN_BYTES = 1024


def start(args: tuple[Any, ...], role_of: RoleOf) -> Pending:
    """REDUCE ``functools.partial(f)``: ``f`` must be the ``builtins.object.__new__`` row's."""
    if len(args) != 1 or not _is_object_new(args[0], role_of):
        raise refused("its function is not object.__new__")
    return Pending(args[0])


def build(pending: Any, state: Any, role_of: RoleOf, charge: Charge) -> None:
    """BUILD on the partial: ``(object.__new__, (cls,), kwargs or None, None or {})``."""
    if type(pending) is not Pending or pending.built:
        raise refused("its state is set once")
    if type(state) is not tuple or len(state) != 4:
        raise refused(f"state {short(state)} is not (function, args, keywords, dict)")
    func, args, keywords, extra = state
    if func is not pending.func:
        raise refused("its state names another function")
    if type(args) is not tuple or len(args) != 1:
        raise refused("it binds other positional arguments than the class")
    cls = args[0]
    role = role_of(cls)
    if (
        role is None
        or role.kind != "instance"
        or role.key in _omegaconf.CLASSES
        or not isinstance(cls, type)
    ):
        raise refused(f"{short(cls)} is not a class allow-listed for plain instances")
    if keywords is None:
        keywords = {}
    if type(keywords) is not dict or not all(type(k) is str for k in keywords):
        raise refused("its keywords are not a dict of names")
    if not plain_data(keywords, charge):
        raise refused("its keyword arguments are not plain data")
    if not (extra is None or (type(extra) is dict and not extra)):
        raise refused("it carries attributes")
    pending.cls = cls
    pending.keywords = frozenset(keywords)
    pending.built = True


def call(pending: Pending, args: Any) -> Any:
    """REDUCE on the partial: the class to make an empty instance of (NEWOBJ)."""
    if pending.called or not pending.built:
        raise refused("it is called once, after its state is set")
    if type(args) is not tuple or args:
        raise refused("it is called with arguments")
    pending.called = True
    return pending.cls


def instance_builder(pending: Pending, charge: Charge) -> Callable[[Any, Any], None]:
    """BUILD on what the partial made: plain names (and ``__init_args__``), plain data."""
    qualname = f"{pending.cls.__module__}.{pending.cls.__qualname__}"
    keywords = pending.keywords

    def set_state(inst: Any, state: Any) -> None:
        if type(state) is not dict:
            raise CheckpointError(f"BUILD state for {qualname} is {short(state)}, expected a dict")
        for key, value in state.items():
            if type(key) is not str or (key.startswith("__") and key != INIT_ARGS):
                raise UnsafeCheckpointError(
                    f"BUILD on {qualname} refused: attribute name {short(key)} is not a plain name",
                    (f"BUILD {qualname}",),
                )
            if key == INIT_ARGS and (
                type(value) not in _MAPPINGS
                or not all(type(name) is str for name in value)
                or frozenset(value) != keywords
            ):
                raise UnsafeCheckpointError(
                    f"BUILD on {qualname} refused: {INIT_ARGS} does not name the arguments "
                    "the partial was given",
                    (f"BUILD {qualname}",),
                )
        if not plain_data(state, charge):
            raise UnsafeCheckpointError(
                f"BUILD on {qualname} refused: its state is not plain data (made through "
                "functools.partial, nothing callable may shadow a method)",
                (f"BUILD {qualname}",),
            )
        object.__getattribute__(inst, "__dict__").update(state)

    return set_state


def plain_data(value: Any, charge: Charge) -> bool:
    """None, bool, int, float, str, bytes, and lists, tuples, dicts (and OrderedDicts) of
    them with such keys; exact types only. Iterative; each container is charged its length
    once per walk (shared or cyclic ones are walked once)."""
    todo = [value]
    seen: set[int] = set()
    while todo:
        item = todo.pop()
        kind = type(item)
        if kind in _LEAVES:
            continue
        if id(item) in seen:
            continue
        if kind is list or kind is tuple:
            seen.add(id(item))
            charge(cost(kind, len(item)), "functools.partial data")
            todo.extend(item)
        elif kind is dict or kind is collections.OrderedDict:
            seen.add(id(item))
            charge(cost(dict, len(item)), "functools.partial data")
            for key in item:
                if type(key) not in _LEAVES:
                    return False
            todo.extend(item.values())
        else:
            return False
    return True


def _is_object_new(func: Any, role_of: RoleOf) -> bool:
    role = role_of(func)
    return role is not None and role.qualname == OBJECT_NEW and func is object.__new__
