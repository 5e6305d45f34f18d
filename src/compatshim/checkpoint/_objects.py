"""Constructors for the allow-listed standard-library globals, each with checked arguments.

Every function takes the resolved global and the REDUCE arguments, checks
their types and sizes, and builds a fresh object. None of them calls a method
of an object the file made, and none allocates more than the arguments hold.
"""

from __future__ import annotations

import collections
import datetime
import enum
import os
import pathlib
from typing import Any, Callable

from .._text import short
from .allowlist import Entry, class_function, lookup
from .errors import CheckpointError, UnsafeCheckpointError

Constructor = Callable[[Any, tuple[Any, ...]], Any]
_PLAIN = (int, float, str, bytes, bool, type(None), complex)
_FACTORIES = {list, dict, set, int, float, str, tuple, bool, bytes, collections.OrderedDict}


def bad(what: str, args: tuple[Any, ...]) -> CheckpointError:
    shown = ", ".join(short(a) for a in args[:4]) + (", ..." if len(args) > 4 else "")
    return CheckpointError(f"{what} with unexpected arguments ({shown})")


def _ints_or_none(args: tuple[Any, ...]) -> bool:
    return all(a is None or type(a) is int for a in args)


def _iterable(args: tuple[Any, ...], what: str) -> Any:
    if not args:
        return ()
    if len(args) == 1 and type(args[0]) in (list, tuple, set, frozenset):
        return args[0]
    raise bad(what, args)


def keys_hashed(key: str, args: tuple[Any, ...]) -> Any:
    """The values the constructor ``key`` hashes when given ``args`` (charged first by the
    machine: a shared tuple costs its expanded size at every use)."""
    if len(args) != 1:
        return ()
    items = args[0]
    kind = type(items)
    if key in ("builtins.set", "builtins.frozenset") and kind in (list, tuple, set, frozenset):
        return items
    if key == "collections.OrderedDict" and kind in (list, tuple):
        return [p[0] for p in items if type(p) in (list, tuple) and len(p) == 2]
    if key == "collections.Counter" and kind is dict:
        return items
    return ()


def make_set(_: Any, args: tuple[Any, ...]) -> Any:
    return set(_iterable(args, "set"))


def make_frozenset(_: Any, args: tuple[Any, ...]) -> Any:
    return frozenset(_iterable(args, "frozenset"))


def make_slice(_: Any, args: tuple[Any, ...]) -> Any:
    if not 1 <= len(args) <= 3 or not _ints_or_none(args):
        raise bad("slice", args)
    return slice(*args)


def make_complex(_: Any, args: tuple[Any, ...]) -> Any:
    if len(args) > 2 or not all(type(a) in (int, float) for a in args):
        raise bad("complex", args)
    return complex(*args)


def make_bytearray(_: Any, args: tuple[Any, ...]) -> Any:
    if not args:
        return bytearray()
    if len(args) == 1 and type(args[0]) is bytes:
        return bytearray(args[0])
    if len(args) == 2 and type(args[0]) is str and args[1] in ("latin-1", "latin1"):
        try:
            return bytearray(args[0].encode("latin-1"))
        except UnicodeEncodeError:
            raise bad("bytearray", args) from None
    raise UnsafeCheckpointError(
        "bytearray called with anything but bytes refused (bytearray(n) allocates n bytes)",
        ("builtins.bytearray",),
    )


def make_bytes(_: Any, args: tuple[Any, ...]) -> Any:
    """``bytes()``: how pickle protocols 0-2 write ``b''`` (any other bytes go through
    ``_codecs.encode``); ``bytes(n)`` would allocate n bytes, ``bytes(iterable)`` iterate."""
    if args:
        raise UnsafeCheckpointError(
            "bytes called with arguments refused: pickle writes only bytes() (for b'')",
            ("builtins.bytes",),
        )
    return b""


def codecs_encode(_: Any, args: tuple[Any, ...]) -> Any:
    if len(args) == 2 and type(args[0]) is str and args[1] in ("latin1", "latin-1"):
        try:
            return args[0].encode("latin-1")
        except UnicodeEncodeError:
            raise bad("_codecs.encode", args) from None
    raise UnsafeCheckpointError(
        "_codecs.encode refused for anything but (str, 'latin1'), the bytes literal of protocol 2",
        ("_codecs.encode",),
    )


def make_ordered_dict(_: Any, args: tuple[Any, ...]) -> Any:
    made: collections.OrderedDict[Any, Any] = collections.OrderedDict()
    for pair in _iterable(args, "OrderedDict") if args else ():
        if type(pair) not in (list, tuple) or len(pair) != 2:
            raise bad("OrderedDict", args)
        made[pair[0]] = pair[1]
    return made


def make_counter(_: Any, args: tuple[Any, ...]) -> Any:
    if not args:
        return collections.Counter()
    if len(args) == 1 and type(args[0]) is dict:
        counter: collections.Counter[Any] = collections.Counter()
        for key, value in args[0].items():
            dict.__setitem__(counter, key, value)
        return counter
    raise bad("Counter", args)


def make_defaultdict(_: Any, args: tuple[Any, ...]) -> Any:
    factory = args[0] if args else None
    if len(args) > 1 or not (factory is None or any(factory is f for f in _FACTORIES)):
        raise UnsafeCheckpointError(
            "collections.defaultdict refused: its factory must be None or a builtin "
            f"container/number type, got {short(factory)}",
            ("collections.defaultdict",),
        )
    return collections.defaultdict(factory)


def make_deque(_: Any, args: tuple[Any, ...]) -> Any:
    items = _iterable(args[:1], "deque")
    maxlen = args[1] if len(args) > 1 else None
    if len(args) > 2 or not (maxlen is None or (type(maxlen) is int and maxlen >= 0)):
        raise bad("deque", args)
    return collections.deque(items, maxlen)


def _state_bytes(value: Any) -> Any:
    if type(value) is str:  # protocol 0/1 pickles store the packed state as latin-1 text
        return value.encode("latin-1")
    return value


def _timezone_or_none(value: Any) -> bool:
    return value is None or type(value) is datetime.timezone


def _packed(kind: Any, size: int, name: str) -> Constructor:
    def make(_: Any, args: tuple[Any, ...]) -> Any:
        if not args or len(args) > 2:
            raise bad(f"datetime.{name}", args)
        packed = _state_bytes(args[0])
        if type(packed) is not bytes or len(packed) != size:
            raise bad(f"datetime.{name}", args)
        if len(args) == 2 and not _timezone_or_none(args[1]):
            raise bad(f"datetime.{name}", args)
        return kind(packed, *args[1:])

    return make


def make_timedelta(_: Any, args: tuple[Any, ...]) -> Any:
    """(days, seconds, microseconds) as timedelta pickles them: each fits 64 bits."""
    if len(args) > 3 or not all(type(a) is int and a.bit_length() < 64 for a in args):
        raise bad("datetime.timedelta", args)
    return datetime.timedelta(*args)


def make_timezone(_: Any, args: tuple[Any, ...]) -> Any:
    if not 1 <= len(args) <= 2 or type(args[0]) is not datetime.timedelta:
        raise bad("datetime.timezone", args)
    if len(args) == 2 and type(args[1]) is not str:
        raise bad("datetime.timezone", args)
    return datetime.timezone(*args)


#: bytes a path's component may take: Python 3.9-3.11 split a path into a list of its parts
#: when it is made (a slot each, its interned text shared), a Windows path a case-folded copy
#: of each when hashed (~50 bytes a part): 'a/' shared 1000 x 1000 times is 1 M parts
PATH_PART_BYTES = 64


def path_parts(args: tuple[Any, ...]) -> int:
    """Components a path made of ``args`` may hold, at most (separators + 1 an argument)."""
    return sum(a.count("/") + a.count("\\") + 1 for a in args if type(a) is str)


def make_path(cls: Any, args: tuple[Any, ...]) -> Any:
    if not all(type(a) is str for a in args):
        raise bad("pathlib path", args)
    name = cls.__name__
    if name == "WindowsPath" and os.name != "nt":
        return pathlib.PureWindowsPath(*args)
    if name == "PosixPath" and os.name == "nt":
        return pathlib.PurePosixPath(*args)
    return cls(*args)


def enum_member(cls: Any, args: tuple[Any, ...]) -> Any:
    """The existing member of ``cls`` whose value is ``args[0]``; nothing is created."""
    if len(args) != 1 or not _plain_value(args[0]):
        raise bad(cls.__qualname__, args)
    value = args[0]
    try:
        member = cls._value2member_map_.get(value)
    except TypeError:
        member = None
    if member is None:
        member = next(
            (
                m
                for m in cls.__members__.values()
                if type(m._value_) is type(value) and m._value_ == value
            ),
            None,
        )
    if member is None:
        raise CheckpointError(f"{cls.__qualname__} has no member with value {short(value)}")
    return member


def enum_member_by_name(cls: Any, name: str) -> Any:
    member = cls.__members__.get(name)
    if not isinstance(member, enum.Enum):
        raise CheckpointError(f"{cls.__qualname__} has no member {name!r:.60}")
    return member


def _plain_value(value: Any) -> bool:
    if type(value) in _PLAIN:
        return True
    return type(value) is tuple and len(value) < 32 and all(type(v) in _PLAIN for v in value)


CONSTRUCTORS: dict[str, Constructor] = {
    "builtins.set": make_set,
    "builtins.frozenset": make_frozenset,
    "builtins.slice": make_slice,
    "builtins.complex": make_complex,
    "builtins.bytearray": make_bytearray,
    "builtins.bytes": make_bytes,
    "_codecs.encode": codecs_encode,
    "collections.OrderedDict": make_ordered_dict,
    "collections.Counter": make_counter,
    "collections.defaultdict": make_defaultdict,
    "collections.deque": make_deque,
    "datetime.datetime": _packed(datetime.datetime, 10, "datetime"),
    "datetime.date": _packed(datetime.date, 4, "date"),
    "datetime.time": _packed(datetime.time, 6, "time"),
    "datetime.timedelta": make_timedelta,
    "datetime.timezone": make_timezone,
}
for _name in ("Path", "PosixPath", "WindowsPath", "PurePath", "PurePosixPath", "PureWindowsPath"):
    CONSTRUCTORS[f"pathlib.{_name}"] = make_path
    CONSTRUCTORS[f"pathlib._local.{_name}"] = make_path


def is_dunder(key: Any) -> bool:
    return type(key) is str and key.startswith("__") and key.endswith("__")


def set_instance_dict(inst: Any, state: Any, what: str) -> None:
    """BUILD for plain instances: str-keyed attributes into the instance ``__dict__``."""
    if type(state) is tuple and len(state) == 2 and state[1] is None:
        state = state[0]
    if state is None:
        return
    if type(state) is not dict:
        raise CheckpointError(f"BUILD state for {what} is {short(state)}, expected a dict")
    for key in state:
        if type(key) is not str or is_dunder(key):
            raise UnsafeCheckpointError(
                f"BUILD on {what} refused: attribute name {short(key)} is not a plain name",
                (f"BUILD {what}",),
            )
    object.__getattribute__(inst, "__dict__").update(state)


_METHOD_OWNERS = ("instance", "dict-subclass")  # classes a plain ``method`` row may belong to
GETATTR_NAME = 200  # the longest attribute name getattr(class, name) reads


def method_of_listed_class(args: tuple[Any, ...], entry_of: Callable[[Any], Entry | None]) -> Entry:
    """``getattr(cls, name)``, read and not called: the ``method`` (or ``constant``) row
    ``Class.name`` of the table.

    ``entry_of`` gives the allowlist entry an object was resolved from in
    this load (None: not from the table). The row's function is checked to be
    ``vars(cls)[name]`` (:func:`allowlist.class_function`: no descriptor or
    ``__getattr__`` runs); the loader then resolves the row as if named.
    """
    if len(args) != 2 or type(args[1]) is not str or len(args[1]) > GETATTR_NAME:
        raise _getattr_refused(args, "exactly (class, name), name a short str, is accepted")
    owner, name = args
    owner_entry = entry_of(owner)
    if owner_entry is None or not isinstance(owner, type) or owner_entry.kind == "rule":
        raise _getattr_refused(args, "only on a class from compatshim's allowlist")
    row = lookup(owner_entry.module, f"{owner_entry.name}.{name}")
    method = row is not None and row.kind in ("method", "staticmethod")
    if row is not None and row.kind == "method" and owner_entry.kind not in _METHOD_OWNERS:
        row = None
    if row is None or not (method or row.kind == "constant") or not row.applies():
        raise _getattr_refused(args, f"{owner_entry.qualname}.{short(name)} is not a listed method")
    try:
        found = row.resolve()
        static = row.kind == "staticmethod"
        if method and class_function(owner, name, static=static) is not found:
            raise LookupError("another function than the listed one")
        if not method and vars(owner).get(name) is not found:  # the class's own, as stored
            raise LookupError("another attribute than the listed one")
    except LookupError as exc:
        raise _getattr_refused(args, str(exc)) from None
    return row


def _getattr_refused(args: tuple[Any, ...], why: str) -> UnsafeCheckpointError:
    shown = ", ".join(short(a) for a in args[:3])
    return UnsafeCheckpointError(f"builtins.getattr({shown}) refused: {why}", ("builtins.getattr",))


Rule = Callable[[tuple[Any, ...], Callable[[Any], "Entry | None"]], Entry]
RULES: dict[str, Rule] = {"method-of-listed-class": method_of_listed_class}
