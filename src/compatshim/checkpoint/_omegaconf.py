"""omegaconf containers (2.1-2.4) built from checked state, with an explicit interpolation policy.

Lightning projects configured with Hydra save ``DictConfig`` hyper-parameters.
omegaconf's own ``__setstate__`` trusts its dict, and a loaded string such as
``"${oc.env:AWS_SECRET}"`` or ``"${eval:...}"`` runs when the application reads
it (Lightning's ``load_from_checkpoint`` reads every top-level value during the
load). So the loader never calls omegaconf's ``__setstate__``:

Construction
    ``NEWOBJ`` of an allow-listed omegaconf class makes an empty instance
    (``object.__new__``). Its ``BUILD`` state is checked and copied into a
    fresh ``__dict__``, once: metadata fields have their exact types
    (``optional`` and ``flags_root`` bool, ``flags`` str -> bool, ``key`` a
    plain key), every type in metadata (``ref_type``, ``object_type``,
    ``key_type``, ``element_type``, an ``EnumNode``'s ``enum_type``) is
    ``typing.Any``, a builtin value type, a bare ``typing.Dict/List``, an Enum,
    or a class the call's ``allow=`` admitted (the file can only name it
    through the allowlist); node values have the types their node class holds;
    container content holds only nodes this load made. ``resolver_cache`` is
    dropped (a file must not pre-fill resolver results) and ``_flags_cache``
    reset. omegaconf's own ``__setstate__`` fix-ups (``None`` key/element
    types, ``Dict``/``List`` ref types re-parameterised) are repeated here,
    so files written by omegaconf 2.0 load too.
After the whole pickle ran
    every omegaconf object the file made must have been built; a node held in
    a container's content is held by that one container and its ``_parent`` is
    that container (None when no container holds it); parent chains end within
    :data:`MAX_DEPTH` levels (no cycles); every string value, container
    content and dict key passes the interpolation policy; and what resolving the
    kept node references would build is bounded and charged to the load's budget
    (``_interp_size.py``: ``a_i = "${a_(i-1)}${a_(i-1)}"`` resolves to 2**i copies).

Interpolation policy (:func:`check_text`)
    Node references (``${a.b}``, ``${..x}``, ``${a[0]}``, ``${a.${b}}``) are
    kept: they only read other checked values of the same config. Resolvers in
    :data:`SAFE_RESOLVERS` are kept: ``oc.select`` (selects a node by key,
    with a default) and ``oc.dict.keys`` (a list of a dict's keys, which are
    checked like values). Every other ``${name:...}`` is refused by default,
    naming the key and the resolver: ``oc.env``/``env`` read the environment,
    ``oc.create``/``oc.decode``/``oc.dict.values``/``oc.deprecated`` re-parse
    text or build interpolations from runtime strings (``"$" + "{oc.env:X}"``
    becomes an ``oc.env`` call), ``oc.coerce`` (2.4) imports a module by name,
    and user resolvers (``eval``) run anything. ``allow=["omegaconf-resolver:NAME"]``
    keeps a named resolver for one ``load`` call; the same entry given process-wide
    (``compatshim.checkpoint.allow``, ``COMPATSHIM_ALLOW``, ``COMPATSHIM_ALLOW_FILE``,
    the ``compatshim.allow`` entry points: ``process_allow.py``) keeps it for every
    load in the process, ``torch.load`` included; those sources are read only when a
    config calls a resolver outside :data:`SAFE_RESOLVERS`. A resolver name computed
    by an interpolation (``${${x}:...}``) is refused whatever is allowed; NAME must
    be a plain resolver name (``eval``, ``oc.env``). Text that becomes interpolation syntax
    after one resolution is live too: an escaped ``\\${`` (omegaconf hands it back as
    ``${``, which a saved-and-reloaded hparams.yaml resolves), and, where the load holds
    a bare ``$``, a ``{`` that a reference can join to it (``${d}{oc.env:X}``, d = "$").
    Where the load holds both a piece that may end in ``$`` and one that may start with
    ``{`` (a value's end or start, a quoted argument, after an interpolation), a value that
    joins an interpolation to a following ``${`` or ``{`` (:func:`joins`) is refused:
    resolution can join them into any call, its name split over several values
    (``${a}${b}${c}``: ``$``, ``{o``, ``c.env:X}``).
    A path, bytes or enum value or key is checked as the text it shows (``str()`` of a path,
    ``repr`` of bytes, an enum member's name, ``str()`` and ``repr``): ``d = Path("$")`` is a
    bare ``$`` as ``d = "$"`` is, and ``b"${eval:1}"`` inside ``"x${d}"`` is a call.
    Shared strings are scanned once.
    The scan reads each ``${`` once, without regular expressions or recursion:
    work is linear in the string's length.
"""

from __future__ import annotations

import enum
import importlib
import pathlib
import typing
from collections import defaultdict
from typing import Any, Callable, Container

from .. import _settings
from .._text import named, short
from ._interp_size import charge_expansion
from ._limits import ITEM_BYTES
from .errors import CheckpointError, UnsafeCheckpointError

MAX_DEPTH = 100  # omegaconf recurses per level (to_container, merge): keep well below 1000
SAFE_RESOLVERS = frozenset({"oc.select", "oc.dict.keys"})
RESOLVER_PREFIX = _settings.RESOLVER_PREFIX  # "omegaconf-resolver:NAME" in allow= and allow()

_DICT = "omegaconf.dictconfig.DictConfig"
_LIST = "omegaconf.listconfig.ListConfig"
_META = "omegaconf.base.Metadata"
_CMETA = "omegaconf.base.ContainerMetadata"
_PATHS = (pathlib.PurePath,)
_KEYS = (str, int, float, bool, bytes)
# node class -> the value types it holds besides None and str (missing "???", interpolations)
NODES: dict[str, tuple[type, ...]] = {
    "omegaconf.nodes.AnyNode": (int, float, bool, bytes, enum.Enum, *_PATHS),
    "omegaconf.nodes.StringNode": (),
    "omegaconf.nodes.IntegerNode": (int,),
    "omegaconf.nodes.FloatNode": (float, int),
    "omegaconf.nodes.BooleanNode": (bool,),
    "omegaconf.nodes.EnumNode": (enum.Enum,),
    "omegaconf.nodes.BytesNode": (bytes,),
    "omegaconf.nodes.PathNode": _PATHS,
}
CLASSES = frozenset({_DICT, _LIST, _META, _CMETA, *NODES})
_META_FIELDS = frozenset(
    {"ref_type", "object_type", "optional", "key", "flags", "flags_root", "resolver_cache"}
)
_CMETA_FIELDS = _META_FIELDS | {"key_type", "element_type"}
_PLAIN_TYPES: tuple[Any, ...] = (
    typing.Any,
    int,
    float,
    bool,
    str,
    bytes,
    dict,
    list,
    tuple,
    pathlib.Path,
    typing.Dict,  # what omegaconf's __getstate__ writes
    typing.List,
)

RoleOf = Callable[[Any], Any]  # SafeMachine.role_of: a Role (kind, qualname) or None


def unsafe(message: str, what: str) -> UnsafeCheckpointError:
    return UnsafeCheckpointError(message, (what,))


class Builder:
    """The omegaconf objects of one load: made empty, built once from checked state."""

    def __init__(
        self, role_of: RoleOf, resolvers: Container[str], charge: Callable[[int, str], None]
    ) -> None:
        self.role_of = role_of
        self.resolvers = resolvers  # beside SAFE_RESOLVERS; asked only about other names
        self.charge = charge  # the load's budget: BUILD copies content, once per container
        self.made: dict[int, tuple[Any, str]] = {}  # id -> (object, qualname)
        self.built: set[int] = set()
        self.meta_owner: dict[int, int] = {}
        self.contents: set[int] = set()  # ids of the _content dicts/lists already copied
        self.checked: dict[int, tuple[str, str | None]] = {}  # id(text) -> (text, verdict)
        self.dollar = False  # the load holds a "$" that starts no "${" (see check_text)

    # ------------------------------------------------------------------ construction
    def new(self, cls: Any, qualname: str) -> Any:
        made = object.__new__(cls)
        self.made[id(made)] = (made, qualname)
        return made

    def kind(self, obj: Any) -> str | None:
        found = self.made.get(id(obj))
        return found[1] if found is not None and found[0] is obj else None

    def build(self, inst: Any, state: Any) -> None:
        qualname = self.made[id(inst)][1]
        if id(inst) in self.built:
            raise unsafe(f"a second BUILD on an {qualname} refused", f"BUILD {qualname}")
        if type(state) is not dict or not all(type(k) is str for k in state):
            raise CheckpointError(f"BUILD state for {qualname} is {short(state)}, expected a dict")
        if qualname in (_META, _CMETA):
            fresh = self._metadata(state, qualname)
        elif qualname in (_DICT, _LIST):
            fresh = self._container(inst, state, qualname)
        else:
            fresh = self._node(inst, state, qualname)
        object.__getattribute__(inst, "__dict__").update(fresh)
        self.built.add(id(inst))

    def _fields(self, state: dict[str, Any], allowed: frozenset[str], what: str) -> None:
        extra = [k for k in state if k not in allowed]
        if extra:
            raise unsafe(f"{what} state with unknown field {short(extra[0])} refused", what)

    def _type(self, value: Any, field: str, what: str) -> Any:
        """A type named in metadata: Any, builtin value types, bare Dict/List, Enums, allow=."""
        if value is None or any(value is t for t in _PLAIN_TYPES):
            return value
        role = self.role_of(value)
        if (
            isinstance(value, type)
            and role is not None
            and (issubclass(value, enum.Enum) or role.kind == "user")
        ):
            return value
        raise unsafe(
            f"{what}.{field} = {named(value)} refused: omegaconf metadata may name typing.Any, "
            "builtin value types, Enums and classes given in allow=",
            f"{what}.{field}",
        )

    def _metadata(self, state: dict[str, Any], qualname: str) -> dict[str, Any]:
        what = qualname.rpartition(".")[2]
        self._fields(state, _CMETA_FIELDS if qualname == _CMETA else _META_FIELDS, what)
        if not {"ref_type", "object_type", "optional", "key"} <= state.keys():
            raise CheckpointError(f"{what} state lacks a required field")
        fresh: dict[str, Any] = {}
        for field in ("ref_type", "object_type", "key_type", "element_type"):
            if field in state:
                fresh[field] = self._type(state[field], field, what)
        for field in ("optional", "flags_root"):
            value = state.get(field, False)
            if type(value) is not bool:
                raise CheckpointError(f"{what}.{field} is {short(value)}, expected a bool")
            fresh[field] = value
        flags = state.get("flags")
        if flags is None:
            flags = {}
        if not isinstance(flags, dict) or not all(
            type(k) is str and type(v) is bool for k, v in flags.items()
        ):
            raise CheckpointError(f"{what}.flags must map str to bool")
        fresh["flags"] = dict(flags)
        fresh["key"] = _key(state["key"], f"{what}.key")
        cache = state.get("resolver_cache")
        if cache is not None and not isinstance(cache, dict):
            raise CheckpointError(f"{what}.resolver_cache is {short(cache)}, expected a dict")
        fresh["resolver_cache"] = defaultdict(dict)  # never a file's pre-computed results
        if qualname == _CMETA:
            fresh.setdefault("key_type", None)
            fresh.setdefault("element_type", None)
        return fresh

    def _own_metadata(self, state: dict[str, Any], owner: Any, want: str, what: str) -> Any:
        meta = state.get("_metadata")
        if self.kind(meta) != want or id(meta) not in self.built:
            wanted = want.rpartition(".")[2]
            raise unsafe(f"{what}._metadata is not a {wanted} built by this load", what)
        if self.meta_owner.setdefault(id(meta), id(owner)) != id(owner):
            raise unsafe(f"{what}._metadata is shared with another node", what)
        return meta

    def _parent(self, state: dict[str, Any], what: str) -> Any:
        parent = state.get("_parent")
        if parent is not None and self.kind(parent) not in (_DICT, _LIST):
            raise unsafe(
                f"{what}._parent is {short(parent)}, not a container made by this load",
                f"{what}._parent",
            )
        return parent

    def _node(self, inst: Any, state: dict[str, Any], qualname: str) -> dict[str, Any]:
        what = qualname.rpartition(".")[2]
        enum_node = qualname == "omegaconf.nodes.EnumNode"
        allowed = {"_metadata", "_parent", "_val", "_flags_cache"}
        if enum_node:
            allowed |= {"enum_type", "fields"}
        self._fields(state, frozenset(allowed), what)
        fresh: dict[str, Any] = {
            "_metadata": self._own_metadata(state, inst, _META, what),
            "_parent": self._parent(state, what),
            "_flags_cache": None,
        }
        value = state.get("_val")
        if not self._value_ok(value, NODES[qualname]):
            raise unsafe(f"{what} value of type {type(value).__name__} refused", what)
        fresh["_val"] = value
        if enum_node:
            enum_type = self._type(state.get("enum_type"), "enum_type", what)
            if not (isinstance(enum_type, type) and issubclass(enum_type, enum.Enum)):
                raise unsafe(f"{what}.enum_type is not an Enum", what)
            if isinstance(value, enum.Enum) and type(value) is not enum_type:
                raise unsafe(f"{what} value is not a member of its enum_type", what)
            fresh["enum_type"] = enum_type
            fresh["fields"] = {name: m.value for name, m in enum_type.__members__.items()}
        return fresh

    def _value_ok(self, value: Any, holds: tuple[type, ...]) -> bool:
        """None, str, or one of ``holds``: exact builtin types, paths, members of loaded Enums."""
        kind = type(value)
        if value is None or kind is str or kind in holds:
            return True
        if isinstance(value, enum.Enum):
            return enum.Enum in holds and self.role_of(kind) is not None
        return isinstance(value, pathlib.PurePath) and pathlib.PurePath in holds

    def _container(self, inst: Any, state: dict[str, Any], qualname: str) -> dict[str, Any]:
        what = qualname.rpartition(".")[2]
        self._fields(state, frozenset({"_metadata", "_parent", "_content", "_flags_cache"}), what)
        meta = self._own_metadata(state, inst, _CMETA, what)
        if meta.key_type is None:  # omegaconf 2.0 pickles; as omegaconf's __setstate__
            meta.key_type = typing.Any
        if meta.element_type is None:
            meta.element_type = typing.Any
        if meta.ref_type is None:
            meta.ref_type = typing.Any
        _parameterise(meta)
        content = state.get("_content")
        if type(content) in (dict, list) and content:
            # one container's own content: a second BUILD naming it would be refused at the
            # end (its nodes held twice), after copying it again and again in between
            if id(content) in self.contents:
                raise unsafe(f"{what}._content shared with another container refused", what)
            self.contents.add(id(content))
            self.charge(ITEM_BYTES[dict] * len(content), f"{what}._content")
        fresh_content: Any
        if content is None or type(content) is str:
            fresh_content = content
        elif qualname == _DICT and type(content) is dict:
            fresh_content = {}
            for key, node in content.items():
                fresh_content[_key(key, f"{what} key")] = self._child(node, what)
        elif qualname == _LIST and type(content) is list:
            fresh_content = [self._child(node, what) for node in content]
        else:
            raise CheckpointError(f"{what}._content is {short(content)}")
        return {
            "_metadata": meta,
            "_parent": self._parent(state, what),
            "_content": fresh_content,
            "_flags_cache": None,
        }

    def _child(self, node: Any, what: str) -> Any:
        if self.kind(node) in (None, _META, _CMETA):
            raise unsafe(
                f"{what} content holds {short(node)}, not an omegaconf node made by this load",
                f"{what}._content",
            )
        return node

    # ------------------------------------------------------------------ after the pickle ran
    def finish(self) -> None:
        """Whole-load checks: all built, parent links, depth, interpolations."""
        holder: dict[int, Any] = {}
        for obj, qualname in self.made.values():
            if id(obj) not in self.built:
                raise CheckpointError(f"an {qualname.rpartition('.')[2]} was never given state")
            if qualname not in (_DICT, _LIST):
                continue
            content = obj.__dict__["_content"]
            children = content.values() if isinstance(content, dict) else content
            for child in children if isinstance(content, (dict, list)) else ():
                if holder.setdefault(id(child), obj) is not obj:
                    raise unsafe("an omegaconf node held by two containers refused", "_content")
        depth: dict[int, int] = {}
        for obj, qualname in self.made.values():
            if qualname in (_META, _CMETA):
                continue
            if obj.__dict__["_parent"] is not holder.get(id(obj)):  # as omegaconf keeps them
                raise unsafe(
                    f"{qualname.rpartition('.')[2]}._parent is not the container that holds it",
                    "_parent",
                )
            self._depth(obj, depth)
        texts: list[tuple[str, Any, bool]] = []  # (text, node, is a key)
        shown: dict[int, tuple[Any, tuple[str, ...]]] = {}  # id(value) -> its texts, once
        for obj, qualname in self.made.values():
            if qualname in (_META, _CMETA):
                continue
            state = obj.__dict__
            if qualname in (_DICT, _LIST):
                content = state["_content"]
                if type(content) is str:
                    texts.append((content, obj, False))
                elif type(content) is dict:
                    for key in content:
                        texts.extend((text, obj, True) for text in _texts_of(key, shown))
            else:
                texts.extend((text, obj, False) for text in _texts_of(state["_val"], shown))
        unique = {id(text): text for text, _, _ in texts}  # shared strings scanned once
        self.dollar = any(bare_dollar(text) for text in unique.values())
        glue = (
            self.dollar
            and any(map(ends_dollar, unique.values()))
            and any(map(starts_brace, unique.values()))
        )
        joined = {key for key, text in unique.items() if joins(text)} if glue else set()
        for text, node, key in texts:
            self._check(text, node, key)
            if id(text) in joined:  # each shared string scanned once, as _check does
                raise unsafe(
                    f"omegaconf value at {path_of(node)} joins an interpolation to what follows "
                    "it, and this load holds a piece that ends in '$' and one that starts with "
                    "'{': resolving can join them into new interpolation syntax (${oc.env:X}, "
                    "built from pieces), live once the resolved config is saved and read back "
                    "(hparams.yaml): refused, whatever is allowed",
                    RESOLVER_PREFIX,
                )
        nodes = [(obj, name) for obj, name in self.made.values() if name not in (_META, _CMETA)]
        charge_expansion(nodes, self.charge, path_of)  # node references that expand (case 11)

    def _depth(self, obj: Any, depth: dict[int, int]) -> None:
        chain = []
        current = obj
        while current is not None and id(current) not in depth:
            chain.append(current)
            if len(chain) > MAX_DEPTH:
                raise CheckpointError(
                    f"omegaconf containers nested deeper than {MAX_DEPTH} levels, or in a cycle"
                )
            current = current.__dict__["_parent"]
        base = -1 if current is None else depth[id(current)]
        for offset, item in enumerate(reversed(chain), start=1):
            depth[id(item)] = base + offset
            if base + offset > MAX_DEPTH:
                raise CheckpointError(f"omegaconf containers nested deeper than {MAX_DEPTH} levels")

    def _check(self, text: str, node: Any, key: bool = False) -> None:
        known = self.checked.get(id(text))  # a string shared by many nodes is scanned once
        if known is not None and known[0] is text:
            name = known[1]
        else:
            name = check_text(text, self.resolvers, self.dollar)
            self.checked[id(text)] = (text, name)
        if name is None:
            return
        where = path_of(node) + (f" (a key {short(text)})" if key else "")
        if name == "":
            raise unsafe(
                f"omegaconf value at {where} calls a resolver whose name is computed by an "
                "interpolation: refused, whatever is allowed (the name is known only when the "
                "config is read, so no allow entry can vouch for it)",
                RESOLVER_PREFIX,
            )
        entry = f"{RESOLVER_PREFIX}{name}"
        raise unsafe(
            f"omegaconf value at {where} calls resolver {name!r}: refused, it could run code or "
            f"read the environment when the config is read. If you trust it: allow=['{entry}'] "
            "for one compatshim.checkpoint.load call, or for every load in the process "
            f"(torch.load too) compatshim.checkpoint.allow('{entry}', reason=\"...\") in code, "
            f"{_settings.ALLOW}={entry} in its environment, or a line '{entry}  # reason' in "
            f"the file {_settings.ALLOW_FILE} names",
            entry,
        )


def _texts_of(value: Any, shown: dict[int, tuple[Any, tuple[str, ...]]]) -> tuple[str, ...]:
    """The text a value or key can show where omegaconf or YAML makes a string of it: a
    ``str`` itself; ``str()`` of a path (``"${d}{eval:1}"`` with ``d = Path("$")`` resolves
    to ``"${eval:1}"``, live once saved as YAML and read back); ``repr`` of bytes (what
    ``str()`` and a container's ``str()`` print); an enum member's name (what ``to_yaml``
    writes), ``str()`` (a ``StrEnum``'s value) and ``repr``. Numbers, bools and None show
    no ``$``. Worked out once per object (a path shared by many nodes is not redone)."""
    if type(value) is str:
        return (value,)
    if not isinstance(value, (bytes, pathlib.PurePath, enum.Enum)):
        return ()
    known = shown.get(id(value))
    if known is not None and known[0] is value:
        return known[1]
    if isinstance(value, enum.Enum):
        texts: tuple[str, ...] = (value.name, str(value), repr(value))
    else:
        texts = (str(value),)
    shown[id(value)] = (value, texts)
    return texts


def _parameterise(meta: Any) -> None:
    """omegaconf's own ``__setstate__`` step, with its own helpers on the checked types.

    Each release decides differently which container annotations it re-parameterises
    (2.3+ turn an omegaconf 2.0 ``dict`` into ``Dict[Any, Any]``, 2.1 keeps it).
    """
    _utils: Any = importlib.import_module("omegaconf._utils")  # imported: the file named it
    ref_type = meta.ref_type
    if not _utils.is_container_annotation(ref_type):
        return
    if _utils.is_generic_dict(ref_type):
        meta.ref_type = typing.Dict[meta.key_type, meta.element_type]  # type: ignore[name-defined]
    elif _utils.is_generic_list(ref_type):
        meta.ref_type = typing.List[meta.element_type]  # type: ignore[name-defined]


def _key(value: Any, what: str) -> Any:
    if value is None or type(value) in _KEYS:
        return value
    if isinstance(value, enum.Enum):
        return value
    raise CheckpointError(f"{what} is {short(value)}, not a plain key")


def path_of(node: Any) -> str:
    """``a.b[0]`` from metadata keys up the (already depth-checked) parent chain."""
    parts: list[str] = []
    current = node
    while current is not None and len(parts) <= MAX_DEPTH:
        key = current.__dict__["_metadata"].__dict__["key"]
        if key is not None:
            parts.append(f"[{key}]" if type(key) is int else f".{short(key).strip(chr(39))}")
        current = current.__dict__["_parent"]
    text = "".join(reversed(parts)).lstrip(".")
    return text or "<root>"


# --------------------------------------------------------------------------- interpolations

_HEAD_STOP = frozenset("\\{}():'\" \t")
_WS = " \t"


def check_text(text: str, allowed: Container[str], dollar: bool = False) -> str | None:
    """The first resolver in ``text`` outside :data:`SAFE_RESOLVERS` and ``allowed`` ("" for a
    computed name, never allowed), or None.

    Examines every ``${`` on its own, so an error in following the nesting can never
    hide a resolver call. Escaped ones (``\\${``) too: omegaconf returns them as
    ``${...}`` text, which is live again once the resolved config is saved (Lightning
    writes hparams.yaml) and read back. ``dollar``: the load holds a ``$`` that starts
    no ``${`` (``d = "$"``), so ``${d}{oc.env:X}`` resolves to ``${oc.env:X}``: a ``{``
    at the start, or after ``}`` or ``$``, is examined as if it were ``${``.
    """
    if dollar and text.startswith("{"):
        name = _live_name(_resolver_at("$" + text, 0), allowed)
        if name is not None:
            return name
    position = text.find("${")
    while position >= 0:
        name = _live_name(_resolver_at(text, position), allowed)
        if name is not None:
            return name
        position = text.find("${", position + 2)
    if dollar:
        position = text.find("{", 1)
        while position >= 0:
            if text[position - 1] == "}":  # after "$": examined above as "${"
                name = _live_name(_resolver_at(text, position - 1), allowed)
                if name is not None:
                    return name
            position = text.find("{", position + 1)
    return None


def _live_name(name: str | None, allowed: Container[str]) -> str | None:
    if name is not None and (name == "" or (name not in SAFE_RESOLVERS and name not in allowed)):
        return name
    return None


def bare_dollar(text: str) -> bool:
    """Whether ``text`` holds a ``$`` that starts no ``${`` (one resolution can join it to a
    following ``{``)."""
    return text.count("$") != text.count("${")


# a piece (a value, a quoted or unquoted argument) may end after "$" and start before "{"
# where omegaconf strips blanks around an argument and reads "\{" as "{"
_PIECE_END = frozenset("'\"}$\\ \t")
_PIECE_START = frozenset("'\"},\\ \t")
_BETWEEN = "\\'\""  # what may stand between two pieces that resolution joins (not blanks:
# omegaconf strips those only at an argument's ends, and there "}" follows)


def ends_dollar(text: str) -> bool:
    """Whether a piece of ``text`` may end in ``$``: the text's end, or a ``$`` before a quote,
    a ``}`` or another ``$`` (``"x$${d}"``), where resolution joins what follows."""
    if text.endswith("$"):
        return True
    position = text.find("$")
    while position >= 0:
        if text[position + 1] in _PIECE_END:
            return True
        position = text.find("$", position + 1)
    return False


def joins(text: str) -> bool:
    """Whether resolving ``text`` joins a piece to a following interpolation or ``{``: a
    ``}`` or a ``$`` followed (past quotes and backslashes) by ``${`` or ``{``. Text
    that interpolates only between other characters (``${root}/${name}.ckpt``) joins none."""
    for mark in ("}", "$"):
        position = text.find(mark)
        while position >= 0:
            after = position + 1
            while after < len(text) and text[after] in _BETWEEN:
                after += 1
            if text.startswith(("${", "{") if mark == "}" else "${", after):
                return True
            position = text.find(mark, position + 1)
    return False


def starts_brace(text: str) -> bool:
    """Whether a piece of ``text`` may start with a ``{`` that starts no ``${``: the text's
    start, or a ``{`` after a quote (``'{'``), an interpolation's ``}`` or a ``,``."""
    if text.startswith("{"):
        return True
    position = text.find("{", 1)
    while position >= 0:
        if text[position - 1] in _PIECE_START:
            return True
        position = text.find("{", position + 1)
    return False


def _resolver_at(text: str, position: int) -> str | None:
    """The resolver name the interpolation at ``position`` calls, "" if computed, None if none."""
    index, head = _head(text, position)
    computed = False
    while text.startswith("${", index):  # a key or name built from a nested interpolation
        nested, inner = _head(text, index)
        nested = _skip_ws(text, nested)
        if not inner or not text.startswith("}", nested):
            return ""  # not a plain node reference: refuse rather than follow it
        computed = True
        index, more = _head(text, nested + 1, opened=False)
        head += more
    index = _skip_ws(text, index)
    if not text.startswith(":", index):
        return None  # a node reference (or text omegaconf cannot parse: nothing is called)
    return "" if computed or not head else head


def _head(text: str, index: int, opened: bool = True) -> tuple[int, str]:
    """Skip ``${`` and blanks, then read key/name characters up to a stop or a nested ``${``."""
    if opened:
        index = _skip_ws(text, index + 2)
    begin = index
    end = len(text)
    while index < end:
        char = text[index]
        if char in _HEAD_STOP or (char == "$" and text.startswith("${", index)):
            break
        index += 1
    return index, text[begin:index]


def _skip_ws(text: str, index: int) -> int:
    while index < len(text) and text[index] in _WS:
        index += 1
    return index
