"""An upper bound of what resolving a loaded config's interpolations builds (issue 26, case 11).

Node references are kept by the interpolation policy, but each resolution copies
its target: ``a_i = "${a_(i-1)}${a_(i-1)}"`` holds 30 short strings and resolves
to 2**30 characters (Lightning's ``load_from_checkpoint`` reads every top-level
value; ``to_container(resolve=True)`` reads them all). omegaconf caches nothing,
so its work is the size of the whole expansion. After the pickle ran, every
node gets a bound ``U`` (memoized, so this is linear in the references),
never below what omegaconf builds when it resolves the node. Bounds are per
config root: ``${a}`` names a node of its own root, and what a text names is
never cached across roots (issue 37, item 2: a decoy config read first made
another's chain that doubles look small):

* a string: its own length (:data:`PARSE` times it, times its bracket nesting, if it
  holds ``${``: each read parses it, in time quadratic in the nesting:
  ``${oc.select:k,[[[...]]]}`` 120 deep took 93 ms a read), plus per ``${`` it holds
  (nested and escaped ones too, as the policy treats them as live) :data:`REF_COST` and
  the bound of the node it names (with, inside longer text, a container's raw repr: that
  is what ``str()`` of a container prints); a resolver call adds :data:`REPR` times the
  text and the references after it (a default such as ``[${x}]`` renders ``x`` with
  repr: a backslash doubles at each level), and ``oc.select`` the bound of the node it
  selects (so max(target, default) is covered). ``oc.select`` returns its default as is,
  so it adds :data:`REPR` only where a list or dict literal (``[`` or ``{`` outside key
  text) follows its key: nested defaults ``${oc.select:a,${b}}`` grow by addition, not
  10x per level (issue 37, item 9);
* a container: the bounds of its children, their keys and :data:`ENTRY` per
  entry (``to_container(resolve=True)`` copies it at every reference);
* a number, bool, bytes, enum or path: a bound of its repr.

References are resolved statically with omegaconf's lookup rules: absolute
``${a.b}``, ``${a[0]}``, a list's negative index, a dict's int key named by
digits, relative ``${.x}``/``${..x}`` from the node's container, intermediate
nodes that are single references followed, and computed keys ``${a.${b}}``
whose inner reference names a plain string. A name that cannot be found adds
nothing (omegaconf raises when reading it). What cannot be resolved exactly
(a key computed from interpolated text or a resolver, an escaped key, syntax
outside the grammar, a miss in a dict with non-str non-int keys), reference
cycles (omegaconf raises reading them) and references to a container that
holds the node (2.4 raises, earlier releases recurse on it) are refused:
either no sound bound exists or the config cannot be read anyway. Resolvers
given in ``allow=`` are trusted: their result is bounded by their text only.

The sum of the bounds of each top-level value is charged to the load's
budget, and every string scanned is charged its length, so a string shared
by many containers cannot make this check slow either.
"""

from __future__ import annotations

import enum
import pathlib
import re
from typing import Any, Callable

from .._text import short
from .errors import CheckpointError, UnsafeCheckpointError

# omegaconf's reading is slow next to a copy (issue 37, item 2): each reference it follows
# parses the text with its ANTLR grammar and selects and wraps a node, some 800 Python calls
# (0.2-1 ms: a doubling chain of 16 levels kept Lightning's load_from_checkpoint for 77 s),
# and each read of a text holding "${" lexes all of it again (about 2 us a character).
# Charged at these weights, the 32 MiB floor of a load's budget buys at most ~16 000
# references or ~2 M parsed characters (seconds, not minutes), while a Hydra config with
# thousands of references stays far inside it.
REF_COST = 2048  # per reference followed
PARSE = 16  # per character of a text holding "${", at each read of it
ENTRY = 64  # a dict or list entry ``to_container`` makes (each reference to a container copies it)
REPR = 10  # repr of a str: at most 10 characters per character ("\U0001f600"), plus quotes
CAP = 1 << 62  # bounds saturate here: far above any budget, and the ints stay small
MAX_LEVELS = 150  # nested references and containers followed; omegaconf fails near 100
MAX_NESTED = 8  # "${" nested inside one reference's key
_DICT = "omegaconf.dictconfig.DictConfig"
_LIST = "omegaconf.listconfig.ListConfig"
_KEY_STOP = frozenset("\\{}():'\" \t]")  # ends a key or a resolver name (omegaconf's INTER_KEY)
_ARG_STOP = frozenset("\\{}()[]:'\"$, \t")  # ends oc.select's unquoted key
_WS = " \t"
_OPEN = re.compile(r"[\[{]")  # may open a list or dict literal in a resolver's arguments
Charge = Callable[[int, str], None]


def nesting(text: str) -> int:
    """An upper bound of the nesting of ``[``, ``{`` and ``(`` omegaconf's parser meets in
    ``text``, at least 1, in one pass: every opener counts, a closer only outside quotes,
    and never below zero (closers before the value cannot cancel its depth)."""
    depth = deepest = 0
    quote = ""
    escaped = False
    for char in text:
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif char in "'\"" and quote in ("", char):
            quote = "" if quote else char
        elif char in "[{(":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]})" and not quote and depth:
            depth -= 1
    return max(1, deepest)


class _Unbounded(Exception):
    """A reference this module cannot resolve exactly: the config is refused."""


def charge_expansion(
    nodes: list[tuple[Any, str]], charge: Charge, where: Callable[[Any], str]
) -> None:
    """Charge ``charge`` with the bound of every top-level value of each config in ``nodes``.

    ``nodes``: (object, qualname) of every omegaconf node and container of the load,
    already checked (built, parent links, depth); ``where`` names a node's path.
    """
    sizes = _Sizes(nodes, charge, where)
    for obj, _ in nodes:
        if obj.__dict__["_parent"] is None:
            sizes.charge_root(obj)


class _Sizes:
    def __init__(self, nodes: list[tuple[Any, str]], charge: Charge, where: Callable[[Any], str]):
        self.kind = {id(obj): qualname for obj, qualname in nodes}
        self.charge = charge
        self.where = where
        self.raw: dict[int, int] = {}  # id(node) -> bound of its unresolved repr
        self.bound: dict[int, int] = {}  # id(node) -> U
        self.texts: dict[tuple[int, int], int] = {}  # (id(text), id(base)) -> bound
        self.stack: set[int] = set()  # nodes whose bound is being computed
        self.following: set[int] = set()  # intermediate keys being followed
        self.followed: dict[int, Any] = {}  # id(intermediate node) -> the container it is
        self._parsed: dict[str, _Ref] = {}  # "${a.b}" -> its parse
        self._absolute: dict[str, Any] = {}  # "${a.b}" -> the node it names in this root
        self.levels = 0

    # ------------------------------------------------------------------ charging
    def charge_root(self, root: Any) -> None:
        """Charge each top-level value (what reading it builds), naming the first too big."""
        # "${a.b}" names a node of this root: a cache by text shared with another root
        # would let a decoy config's small ``a`` stand for this one's (issue 37, item 2)
        self._absolute.clear()
        for child in self._children(root) or [root]:  # a lone node, a container of text
            try:
                units = self.of(child, child)
            except _Unbounded as exc:
                where = self.where(exc.args[1])
                raise UnsafeCheckpointError(
                    f"omegaconf value at {where}: {exc.args[0]}, so the size it resolves to "
                    "cannot be bounded: refused",
                    (f"omegaconf interpolation {where}",),
                ) from None
            try:
                self.charge(units, "omegaconf node references")
            except CheckpointError as exc:
                where = self.where(child)
                raise UnsafeCheckpointError(
                    f"omegaconf value at {where} resolves to at most {units} characters and "
                    "reference steps (node references that expand: each read copies its "
                    f"target): {exc}",
                    (f"omegaconf interpolation {where}",),
                ) from None

    # ------------------------------------------------------------------ bounds
    def of(self, node: Any, asker: Any) -> int:
        """U(node): what resolving ``node`` may build (see the module docstring)."""
        known = self.bound.get(id(node))
        if known is not None:
            return known
        if id(node) in self.stack:
            raise _Unbounded(
                "its references form a cycle (omegaconf raises when reading it)", asker
            )
        self.levels += 1
        if self.levels > MAX_LEVELS:
            raise _Unbounded(
                f"references and containers nest deeper than {MAX_LEVELS} levels", asker
            )
        self.stack.add(id(node))
        try:
            state = node.__dict__
            base = node if state["_parent"] is None else state["_parent"]
            value = state["_content"] if "_content" in state else state["_val"]
            if isinstance(value, dict):
                total = sum(_repr_bound(key) + ENTRY for key in value)
                for child in value.values():
                    total = min(CAP, total + self.of(child, child))
            elif isinstance(value, list):
                total = ENTRY * len(value)
                for child in value:
                    total = min(CAP, total + self.of(child, child))
            elif type(value) is str:
                total = self._text(value, base, node)
            else:
                total = _repr_bound(value)
                if "enum_type" in state:  # an EnumNode converts a resolved name to a member
                    total += self._raw(node)
        finally:
            self.stack.discard(id(node))
            self.levels -= 1
        self.bound[id(node)] = total
        return total

    def _raw(self, node: Any) -> int:
        """A bound of ``repr`` of the unresolved value: what ``str(container)`` prints."""
        known = self.raw.get(id(node))
        if known is not None:
            return known
        state = node.__dict__
        if self.kind[id(node)] in (_DICT, _LIST):
            content = state["_content"]
            if isinstance(content, dict):
                total = 2 + sum(
                    _repr_bound(key) + self._raw(child) + 4 for key, child in content.items()
                )
            elif isinstance(content, list):
                total = 2 + sum(self._raw(child) + 2 for child in content)
            else:
                total = _repr_bound(content)
        else:
            total = _repr_bound(state["_val"])
            enum_type = state.get("enum_type")
            if isinstance(enum_type, type):  # an EnumNode converts a resolved name
                total += len(enum_type.__name__) + max(map(len, state.get("fields", {"": 0})))
        self.raw[id(node)] = total = min(CAP, total)
        return total

    def _text(self, text: str, base: Any, node: Any) -> int:
        """Resolved length of ``text`` held by ``node`` whose container is ``base``."""
        if "${" not in text:
            return len(text)
        memo = (id(text), id(base))
        known = self.texts.get(memo)
        if known is not None:
            return known
        self.charge(len(text), "scanning omegaconf interpolations")  # the work of the scan
        try:
            total = self._scan(text, base, node)
        except _Unbounded as exc:
            raise _Unbounded(
                exc.args[0], exc.args[1] if exc.args[1] is not None else node
            ) from None
        self.texts[memo] = total
        return total

    def _ref_at(self, text: str, position: int) -> tuple[_Ref, str]:
        """The reference at ``position``, and its text when it is short and nests nothing
        (a config names the same keys again and again: parsed and found once)."""
        close = text.find("}", position, position + 200)
        piece = text[position : close + 1] if close > 0 else ""
        if not piece or "${" in piece[2:]:
            return _parse(text, position, 0), ""
        ref = self._parsed.get(piece)
        if ref is None:
            ref = _parse(piece, 0, 0)
            if ref.resolver is not None:  # its arguments may go on past this "}"
                return _parse(text, position, 0), ""
            self._parsed[piece] = ref
        return ref, piece

    def _scan(self, text: str, base: Any, node: Any) -> int:
        found: list[tuple[int, int, bool]] = []  # (position, bound, renders with repr)
        keys: list[tuple[int, int]] = []  # (start, end) of key text: "[" there opens no list
        selects: list[tuple[int, int]] = []  # (index in found, where its default begins)
        position = text.find("${")
        while position >= 0:
            ref, piece = self._ref_at(text, position)
            if ref.resolver is None:
                target = self._absolute.get(piece, self) if piece else self
                if target is self:  # not known yet
                    target = self._lookup(ref, base, node)
                    if piece and not ref.dots:
                        self._absolute[piece] = target
                alone = position == 0 and ref.end == len(text)
                size = REF_COST
                if target is not None:
                    size = min(CAP, size + self._target(target, node, alone))
                found.append((position, size, False))
                keys.append((position, position + ref.end if piece else ref.end))
            else:
                found.append((position, REF_COST + self._resolver(ref, base, node), True))
                if ref.resolver == "oc.select" and ref.args:
                    selects.append((len(found) - 1, ref.args))
                    keys.append((position, ref.args))
            position = text.find("${", position + 2)
        if selects:  # oc.select returns its default as is: repr only from a literal in it
            last = _last_literal(text, keys)
            for index, args in selects:
                if last < args:
                    found[index] = (found[index][0], found[index][1], False)
        total = PARSE * len(text) * nesting(text)  # the parse is quadratic in the nesting
        after = 0  # bounds of the references after the current one
        for position, size, call in reversed(found):
            if call:  # its arguments render with repr: text and values after it, x REPR
                total = min(CAP, total + REPR * (len(text) - position + after) + 2)
            after = min(CAP, after + size)
            total = min(CAP, total + size)
        return total

    def _target(self, target: Any, node: Any, alone: bool) -> int:
        """What a reference to ``target`` adds; ``alone``: the text is that one reference
        (its value is the target itself, else ``str()`` of it: a container prints raw)."""
        ancestor = node.__dict__["_parent"]
        while ancestor is not None:
            if ancestor is target:  # 2.4 refuses; earlier releases recurse on it
                raise _Unbounded("a reference names a container that holds it", node)
            ancestor = ancestor.__dict__["_parent"]
        size = self.of(target, node)
        if not alone and self.kind[id(target)] in (_DICT, _LIST):
            size = min(CAP, size + self._raw(target))
        return size

    def _resolver(self, ref: _Ref, base: Any, node: Any) -> int:
        """What ``oc.select``/``oc.dict.keys`` select; other allowed resolvers: their text."""
        if ref.resolver == "oc.select" and ref.key is not None:
            target = self._lookup(ref, base, node)
            return 0 if target is None else self._target(target, node, False)
        if ref.resolver == "oc.dict.keys":  # keys of one of the config's dicts
            return self._raw(_top(node))
        return 0

    # ------------------------------------------------------------------ lookup
    def _lookup(self, ref: _Ref, base: Any, node: Any) -> Any:
        """The node ``ref`` names, as omegaconf's ``_resolve_key_and_root`` and
        ``_select_impl`` find it, or None where omegaconf finds none (it raises)."""
        parts = [self._part(part, base, node) for part in ref.parts]
        root = base if ref.dots else _top(base)
        for _ in range(max(0, ref.dots - 1)):
            root = root.__dict__["_parent"]
            if root is None:
                return None
        for index, part in enumerate(parts):
            found = self._select(root, part, node)
            if found is None or index == len(parts) - 1:
                return found
            root = self._dereference(found, node)
            if root is None:
                return None
        return root

    def _part(self, part: str | _Ref, base: Any, node: Any) -> str:
        """A key part; a nested reference must name a plain string (a computed key)."""
        if isinstance(part, str):
            return part
        if part.resolver is not None:
            raise _Unbounded("a key is computed by a resolver", node)
        target = self._lookup(part, base, node)
        value = None if target is None else target.__dict__.get("_val")
        if type(value) is not str or any(c in value for c in "$\\.[]"):
            raise _Unbounded(
                "a key is computed from a value that is not a plain string "
                f"({short(value)}); only ${{a.${{b}}}} with b a plain key is followed",
                node,
            )
        return value

    def _select(self, container: Any, part: str, node: Any) -> Any:
        """omegaconf's ``_select_one``: a dict key (or the int it spells), a list index."""
        if self.kind.get(id(container)) not in (_DICT, _LIST):
            return None
        content = container.__dict__["_content"]
        if isinstance(content, dict):
            if part in content:
                return content[part]
            number = _int(part)
            if number is not None and number in content and type(number) is int:
                return content[number]
            if any(type(key) not in (str, int) for key in content):
                raise _Unbounded(
                    f"a key {short(part)} is looked up in a dict with typed keys", node
                )
            return None
        if isinstance(content, list):
            number = _int(part)
            if number is None:
                return None
            if number < 0:
                number += len(content)
            return content[number] if 0 <= number < len(content) else None
        return None  # None, "???" or an interpolation: no children

    def _dereference(self, found: Any, node: Any) -> Any:
        """An intermediate key's node, followed while it is one plain node reference."""
        if id(found) in self.followed:
            return self.followed[id(found)]
        result = self._follow(found, node)
        self.followed[id(found)] = result
        return result

    def _follow(self, found: Any, node: Any) -> Any:
        state = found.__dict__
        value = state["_content"] if "_content" in state else state["_val"]
        if type(value) is not str or "${" not in value:
            return found if self.kind[id(found)] in (_DICT, _LIST) else None
        if not value.startswith("${"):
            return None  # text before a reference: a string, which holds no key
        ref = _parse(value, 0, 0)
        if ref.resolver is not None:
            raise _Unbounded("a key passes through a node computed by a resolver", node)
        if ref.end != len(value):
            return None  # more than one reference: a string
        if id(found) in self.following:
            raise _Unbounded("its references form a cycle (omegaconf raises reading it)", node)
        self.levels += 1
        if self.levels > MAX_LEVELS:
            raise _Unbounded(f"references nest deeper than {MAX_LEVELS} levels", node)
        self.following.add(id(found))
        try:
            base = found if state["_parent"] is None else state["_parent"]
            target = self._lookup(ref, base, node)
            return None if target is None else self._dereference(target, node)
        finally:
            self.following.discard(id(found))
            self.levels -= 1

    @staticmethod
    def _children(node: Any) -> list[Any]:
        content = node.__dict__.get("_content")
        if isinstance(content, dict):
            return list(content.values())
        return list(content) if isinstance(content, list) else []


# --------------------------------------------------------------------------- syntax


class _Ref:
    """One ``${...}``: a node reference (``dots``, ``parts``) or a resolver call."""

    __slots__ = ("args", "dots", "end", "key", "parts", "resolver")

    def __init__(self) -> None:
        self.dots = 0
        self.parts: list[str | _Ref] = []
        self.resolver: str | None = None
        self.key: str | None = None  # oc.select's first argument, when it is a key
        self.end = 0  # index after the closing "}" (node references only)
        self.args = 0  # index after oc.select's key: where its default begins


def _parse(text: str, position: int, nested: int) -> _Ref:
    """The ``${`` at ``position``, read as omegaconf's grammar reads it (_Unbounded otherwise)."""
    if nested > MAX_NESTED:
        raise _Unbounded(f"interpolations nest deeper than {MAX_NESTED} levels in one key", None)
    ref = _Ref()
    index = _skip_ws(text, position + 2)
    while text.startswith(".", index):
        ref.dots += 1
        index += 1
    head, index = _key_text(text, index, ref, nested)
    index = _skip_ws(text, index)
    if text.startswith(":", index):
        if ref.dots or not all(isinstance(part, str) for part in ref.parts):
            raise _Unbounded("a resolver name is computed", None)
        ref.resolver = head
        ref.parts = []
        if head == "oc.select":
            _select_key(text, index + 1, ref, nested)
        return ref
    if not text.startswith("}", index) or not ref.parts:
        raise _Unbounded(
            f"{short(text[position : position + 40])} is outside omegaconf's grammar", None
        )
    ref.end = index + 1
    return ref


def _key_text(text: str, index: int, ref: _Ref, nested: int) -> tuple[str, int]:
    """Key parts ``a.b[0].${c}``: plain text split at ``.`` and ``[...]``, or nested references."""
    begin = index
    current = ""
    pending = False  # a "." opened a part
    closed = False  # a "[...]" or "${...}" part just ended: only "." or "[" may follow
    while index < len(text):
        if text.startswith("${", index):
            inner = _parse(text, index, nested + 1)
            if current or closed or inner.end == 0:
                raise _Unbounded("a key mixes text and an interpolation", None)
            ref.parts.append(inner)
            index, pending, closed = inner.end, False, True
            continue
        char = text[index]
        if char == "\\":
            raise _Unbounded("a key holds an escape", None)
        if char in _KEY_STOP:
            break
        if char == ".":
            if current:
                ref.parts.append(current)
            elif (pending or not ref.parts) and not closed:
                raise _Unbounded("a key has an empty part", None)
            current, pending, closed = "", True, False
            index += 1
        elif char == "[":
            if current:
                ref.parts.append(current)
            if text.startswith("${", index + 1):  # a[${b}]
                inner = _parse(text, index + 1, nested + 1)
                if inner.end == 0 or not text.startswith("]", inner.end):
                    raise _Unbounded("a bracketed key is not a plain key", None)
                ref.parts.append(inner)
                index = inner.end + 1
            else:
                close = index + 1
                while (
                    close < len(text) and text[close] not in _KEY_STOP and text[close] not in ".["
                ):
                    close += 1
                if not text.startswith("]", close) or close == index + 1:
                    raise _Unbounded("a bracketed key is not a plain key", None)
                ref.parts.append(text[index + 1 : close])
                index = close + 1
            current, pending, closed = "", False, True
        else:
            if closed:
                raise _Unbounded("a key has text right after a ] or an interpolation", None)
            end = index + 1
            while end < len(text) and text[end] not in _KEY_STOP and text[end] not in ".[$":
                end += 1
            current += text[index:end]
            index = end
    if current:
        ref.parts.append(current)
    elif pending:
        raise _Unbounded("a key ends with an empty part", None)
    return text[begin:index], index


def _select_key(text: str, index: int, ref: _Ref, nested: int) -> None:
    """``oc.select``'s first argument as a key (the rest is bounded as text)."""
    index = _skip_ws(text, index)
    if text.startswith("${", index):
        inner = _parse(text, index, nested + 1)
        if inner.resolver is not None or inner.end == 0:
            raise _Unbounded("oc.select's key is computed by a resolver", None)
        ref.parts = [inner]
        ref.key = ""
        ref.args = inner.end
        return
    quote = text[index : index + 1]
    if quote in ("'", '"'):
        close = text.find(quote, index + 1)
        if close < 0 or "\\" in text[index:close]:
            raise _Unbounded("oc.select's quoted key is not plain", None)
        key = text[index + 1 : close]
        ref.args = close + 1
    else:
        end = index
        while end < len(text) and text[end] not in _ARG_STOP:
            end += 1
        if not (text.startswith((",", "}"), end) or text[end : end + 1] in _WS):
            raise _Unbounded("oc.select's key is not a plain key", None)
        key = text[index:end]
        ref.args = end
    if not key or any(c in _ARG_STOP for c in key):
        raise _Unbounded("oc.select's key is not a plain key", None)
    dots = len(key) - len(key.lstrip("."))
    inner = _Ref()
    inner.dots = dots
    _key_text(key, dots, inner, nested)
    ref.dots, ref.parts, ref.key = inner.dots, inner.parts, key


def _last_literal(text: str, keys: list[tuple[int, int]]) -> int:
    """The index of the last ``[`` or ``{`` in ``text`` that may open a list or dict literal
    (not a ``${``, not inside key text ``keys``, in order of start), or -1. Linear."""
    spans: list[list[int]] = []  # keys merged: a nested reference lies inside its outer one
    for start, end in keys:
        if spans and start <= spans[-1][1]:
            spans[-1][1] = max(spans[-1][1], end)
        else:
            spans.append([start, end])
    last = -1
    span = 0
    for match in _OPEN.finditer(text):
        at = match.start()
        while span < len(spans) and spans[span][1] <= at:
            span += 1
        inside = span < len(spans) and spans[span][0] <= at
        if not inside and not (text[at] == "{" and text[at - 1 : at] == "$"):
            last = at
    return last


def _skip_ws(text: str, index: int) -> int:
    while index < len(text) and text[index] in _WS:
        index += 1
    return index


def _int(part: str) -> int | None:
    try:
        return int(part)  # as omegaconf's is_int
    except ValueError:
        return None


def _top(node: Any) -> Any:
    while node.__dict__["_parent"] is not None:
        node = node.__dict__["_parent"]
    return node


def _repr_bound(value: Any) -> int:
    """A bound of ``repr(value)``/``str(value)`` for the values omegaconf nodes hold."""
    kind = type(value)
    if value is None or kind is bool:
        return 5
    if kind is str:
        return REPR * len(value) + 2
    if kind is int:
        return int(value).bit_length() // 3 + 2  # decimal digits <= bits * 0.302, a sign
    if kind is float:
        return 24
    if kind is bytes:
        return 4 * len(value) + 3
    if isinstance(value, enum.Enum):
        return len(type(value).__qualname__) + len(value.name) + 80
    if isinstance(value, pathlib.PurePath):
        return REPR * len(str(value)) + 16
    return REPR * len(short(value)) + 2
