"""``find_unpicklable`` on hostile objects: it reports what it cannot inspect, never raises.

A diagnostic tool must not be the thing that crashes. Every exception a user
object raises while the graph is walked (hashing, attribute access, reduction,
iteration, text for the message) becomes a finding for that object, at its
exact path, and the walk carries on to the rest of the graph. The first tests
are the cases found by an adversarial run (issue 10, item 4); the systematic
ones make one dunder raise at a time, in every position an object can sit.
"""

from __future__ import annotations

import collections
import functools
import pickle
import threading
from typing import Any, Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compatshim.pickling import Finding, find_unpicklable

from .random_graphs import Node, build, check_agrees_with_pickle, graph_specs


class Boom(Exception):
    """What every hostile dunder raises (not a TypeError/AttributeError pickle expects)."""


def _boom(*args: Any, **kwargs: Any) -> Any:
    raise Boom("hostile")


def _by_path(findings: list[Finding]) -> dict[str, Finding]:
    return {finding.path: finding for finding in findings}


def _assert_well_formed(findings: Any) -> None:
    assert isinstance(findings, list)
    for finding in findings:
        assert isinstance(finding, Finding)
        assert all(type(v) is str for v in (finding.path, finding.type_name, finding.error))
        str(finding)  # the message itself never raises


# -- the cases from issue 10 ----------------------------------------------------------


class HashRaisingMeta(type):
    def __hash__(cls) -> int:
        raise RuntimeError("metaclass hash refuses")


class HashRaisingClass(metaclass=HashRaisingMeta):
    pass


class NameRaisingCallable:
    def __call__(self, *args: Any) -> Any:
        return None

    @property
    def __name__(self) -> str:  # type: ignore[override]
        raise RuntimeError("no name for you")


class ReducesToNameRaisingCallable:
    def __reduce__(self) -> Any:
        return (NameRaisingCallable(), ())


class ClassPropertyRaises:
    @property  # type: ignore[misc]
    def __class__(self) -> type:  # type: ignore[override]
        raise RuntimeError("no class for you")


class ReducesToNonCallable:
    def __reduce__(self) -> Any:
        return (42, ())


class ReducesToListArgs:
    def __reduce__(self) -> Any:
        return (Node, [1])


@pytest.mark.parametrize(
    ("culprit", "says"),
    [
        (HashRaisingClass(), "metaclass hash refuses"),
        (ReducesToNameRaisingCallable(), "no name for you"),
        (ClassPropertyRaises(), "no class for you"),
        (ReducesToNonCallable(), "must be callable"),
        (ReducesToListArgs(), "must be a tuple"),
    ],
    ids=["metaclass-hash", "reduce-callable-name", "class-property", "non-callable", "list-args"],
)
def test_reported_case_is_a_finding_at_its_path(culprit: Any, says: str) -> None:
    lock = threading.Lock()
    root = Node(outer=Node(bad=culprit), later=[lock])
    findings = find_unpicklable(root, root="cfg")
    _assert_well_formed(findings)
    by_path = _by_path(findings)
    assert sorted(by_path) == ["cfg.later[0]", "cfg.outer.bad"]
    assert says in by_path["cfg.outer.bad"].error
    assert by_path["cfg.outer.bad"].type_name.endswith(type(culprit).__qualname__)


def test_class_whose_metaclass_hash_raises_is_pickled_by_name() -> None:
    graph = {"cls": HashRaisingClass, "lock": threading.Lock()}
    assert [f.path for f in find_unpicklable(graph)] == ["obj['lock']"]


def test_inspection_failures_say_so() -> None:
    (finding,) = find_unpicklable(Node(x=ReducesToNameRaisingCallable()))
    assert finding.error == "could not inspect: RuntimeError: no name for you"


def test_non_callable_and_non_tuple_args_read_like_pickle() -> None:
    findings = find_unpicklable([ReducesToNonCallable(), ReducesToListArgs()])
    assert [f.path for f in findings] == ["obj[0]", "obj[1]"]
    for finding, culprit in zip(findings, (ReducesToNonCallable(), ReducesToListArgs())):
        with pytest.raises(pickle.PicklingError) as info:
            pickle.dumps(culprit)
        assert finding.error == f"PicklingError: {info.value}"


class Reduces:
    """Reduces to ``rv`` as it is, whatever pickle will make of it."""

    class Inner:  # a nested class: pickle names its type differently from 3.14 on
        pass

    def __init__(self, rv: Any) -> None:
        self.rv = rv

    def __reduce_ex__(self, protocol: Any) -> Any:
        return self.rv


def _named(name: str) -> Callable[..., Any]:
    """A callable pickle treats as ``__newobj__``/``__newobj_ex__`` (it goes by the name)."""

    def build(*args: Any) -> Any:
        raise AssertionError("never called")

    build.__name__ = build.__qualname__ = name
    return build


@pytest.mark.parametrize(
    "rv",
    [
        5,
        (Reduces.Inner(), ()),
        (print, [1]),
        (print, (), None, Reduces.Inner()),
        (print, (), None, None, 5),
        (print, (), None, None, None, Reduces.Inner()),
        (_named("__newobj__"), ()),
        (_named("__newobj__"), (5,)),
        (_named("__newobj__"), (Reduces.Inner,)),
        (_named("__newobj_ex__"), (Reduces, ())),
        (_named("__newobj_ex__"), (Reduces.Inner(), (), {})),
    ],
    ids=[
        "not-a-tuple",
        "callable",
        "args",
        "fourth",
        "fifth",
        "sixth",
        "newobj-empty",
        "newobj-class",
        "newobj-wrong-class",
        "newobj-ex-length",
        "newobj-ex-class",
    ],
)
def test_every_refused_reduction_reads_as_this_interpreters_pickle(rv: Any) -> None:
    """The text is compared with the running interpreter's own pickle error (3.14 reworded
    them all: ", not int", "item" for "element", __newobj__ as argument errors)."""
    culprit = Reduces(rv)
    with pytest.raises(pickle.PicklingError) as info:
        pickle.dumps(culprit)
    (finding,) = find_unpicklable(culprit)
    assert finding.path == "obj"
    assert finding.error == f"PicklingError: {info.value}"


class UnprintableError(Exception):
    def __str__(self) -> str:
        raise RuntimeError("cannot print me")


class RaisesUnprintable:
    def __reduce__(self) -> Any:
        raise UnprintableError()


def test_an_exception_that_cannot_be_printed_still_gives_a_finding() -> None:
    (finding,) = find_unpicklable({"x": RaisesUnprintable()})
    assert finding.path == "obj['x']"
    assert finding.error.startswith("UnprintableError")


def test_a_huge_int_key_does_not_break_the_path() -> None:
    huge = 10**5000  # repr() refuses: more than sys.get_int_max_str_digits()
    (finding,) = find_unpicklable({huge: threading.Lock()})
    assert finding.path == "obj[<key #0>]"


class ReducesToANewOneForever:
    """Each reduction makes a new object of its kind: pickle meets a RecursionError."""

    def __reduce__(self) -> Any:
        return (ReducesToANewOneForever, (ReducesToANewOneForever(),))


def test_a_reduce_that_makes_new_objects_forever_is_cut_not_walked_forever() -> None:
    (finding,) = find_unpicklable({"x": ReducesToANewOneForever()})  # hung before
    assert finding.path == "obj['x']" + "<arg 0>" * (200_000 - 1)  # 200,000 objects down
    assert finding.error.startswith("RecursionError: more than 200,000 objects deep")


# -- one dunder raises at a time ------------------------------------------------------

# instance-level dunders; attribute-like ones become raising properties
_METHOD_DUNDERS = [
    "__reduce_ex__",
    "__reduce__",
    "__getstate__",
    "__getnewargs__",
    "__getnewargs_ex__",
    "__getattribute__",
    "__getattr__",
    "__eq__",
    "__ne__",
    "__len__",
    "__iter__",
    "__contains__",
    "__getitem__",
    "__repr__",
    "__str__",
    "__format__",
    "__bool__",
    "__sizeof__",
    "__dir__",
    "__copy__",
    "__deepcopy__",
    "__length_hint__",
    "__index__",
    "__setstate__",
    "__init_subclass__",
]
# (``__qualname__`` and ``__slots__`` cannot be properties: class creation refuses them)
_PROPERTY_DUNDERS = ["__class__", "__dict__", "__module__", "__doc__", "__weakref__"]


class Plain:
    def __init__(self) -> None:
        self.payload = [1, 2]


class Slotted:
    __slots__ = ("payload",)

    def __init__(self) -> None:
        self.payload = [1, 2]


class ListLike(list):  # type: ignore[type-arg]
    pass


class DictLike(dict):  # type: ignore[type-arg]
    pass


class TupleLike(tuple):  # type: ignore[type-arg]
    pass


_BASES: dict[str, Callable[[type], Any]] = {
    "plain": lambda cls: cls(),
    "slotted": lambda cls: cls(),
    "list": lambda cls: cls([1, {"a": 2}]),
    "dict": lambda cls: cls(a=[1]),
    "tuple": lambda cls: cls((1, [2])),
}
_BASE_TYPES: dict[str, type] = {
    "plain": Plain,
    "slotted": Slotted,
    "list": ListLike,
    "dict": DictLike,
    "tuple": TupleLike,
}


def _hostile_instance(base: str, dunder: str) -> Any:
    namespace: dict[str, Any] = {
        dunder: property(_boom) if dunder in _PROPERTY_DUNDERS else _boom,
        "__hash__": object.__hash__,  # hashing is its own case (below), keep it usable here
    }
    if base == "slotted":
        namespace["__slots__"] = ()
    cls = type(f"Hostile{dunder.strip('_').title()}", (_BASE_TYPES[base],), namespace)
    return _BASES[base](cls)


class HashRaises:
    def __hash__(self) -> int:
        raise Boom("hostile")


class _HostileMeta(type):
    pass


def _hostile_class(dunder: str) -> type:
    """A class whose metaclass ``dunder`` raises (class-level hostility)."""
    attribute = property(_boom) if dunder in ("__module__", "__name__", "__mro__") else _boom
    meta = type(f"Meta{dunder.strip('_').title()}", (_HostileMeta,), {dunder: attribute})
    return meta(f"Hostile{dunder.strip('_').title()}", (), {"x": 1})


_META_DUNDERS = [
    "__hash__",
    "__eq__",
    "__repr__",
    "__str__",
    "__getattribute__",
    "__instancecheck__",
    "__subclasscheck__",
    "__module__",
    "__name__",
    "__reduce_ex__",
    "__reduce__",
    "__call__",
    "__len__",
    "__iter__",
]


class Box:
    """Pickled through ``__reduce__`` with the held object as its one argument."""

    def __init__(self, item: Any) -> None:
        self.item = item

    def __reduce__(self) -> Any:
        return (Box, (self.item,))


class SlotHolder:
    __slots__ = ("held",)

    def __init__(self, held: Any) -> None:
        self.held = held


# where an object can sit, and the path it then has
_POSITIONS: dict[str, tuple[Callable[[Any], Any], str]] = {
    "attribute": (lambda h: Node(inner=Node(h=h)), "obj.inner.h"),
    "list-item": (lambda h: [0, [h]], "obj[1][0]"),
    "tuple-item": (lambda h: (0, (h,)), "obj[1][0]"),
    "dict-value": (lambda h: {"k": {"v": h}}, "obj['k']['v']"),
    "dict-key": (lambda h: {"k": {h: 1}}, "obj['k']<key #0>"),
    "ordered-value": (lambda h: collections.OrderedDict(v=h), "obj['v']"),
    "default-factory": (lambda h: collections.defaultdict(h), "obj.default_factory"),
    "reduce-arg": (lambda h: Box(h), "obj<arg 0>"),
    "reduce-items": (lambda h: collections.deque([h]), "obj[0]"),
    "slot": (lambda h: SlotHolder(h), "obj.held"),
    "partial-state": (lambda h: functools.partial(print, h), "obj<state>[1][0]"),
}


def _check_hostile(make: Callable[[], Any], position: str) -> None:
    """The walk neither raises nor loses its way: the lock is found, findings are precise.

    The hostile object is built here (not passed in) so that a failure report does
    not have to print it: pytest's own repr of arguments trips over hostile types.
    """
    build, hostile_path = _POSITIONS[position]
    try:
        graph = build(make())
    except (Boom, TypeError):
        pytest.skip("the hostile object cannot be put there")
    lock = threading.Lock()
    root = [graph, lock]
    findings = find_unpicklable(root)
    _assert_well_formed(findings)
    paths = [f.path for f in findings]
    assert "obj[1]" in paths  # the walk carried on past the hostile object
    expected = "obj[0]" + hostile_path[len("obj") :]
    for path in paths:
        assert path == "obj[1]" or path.startswith(expected), (path, expected)
    try:
        pickle.dumps(graph)
    except Exception:
        assert any(p.startswith(expected) for p in paths), (paths, expected)


@pytest.mark.parametrize("position", sorted(_POSITIONS))
@pytest.mark.parametrize("base", sorted(_BASES))
@pytest.mark.parametrize("dunder", _METHOD_DUNDERS + _PROPERTY_DUNDERS)
def test_one_raising_dunder_anywhere(dunder: str, base: str, position: str) -> None:
    try:
        _hostile_instance(base, dunder)
    except (Boom, TypeError):
        pytest.skip(f"{dunder} cannot be hostile on a {base} object")
    _check_hostile(lambda: _hostile_instance(base, dunder), position)


@pytest.mark.parametrize("position", sorted(_POSITIONS))
@pytest.mark.parametrize("dunder", _META_DUNDERS)
def test_one_raising_metaclass_dunder_anywhere(dunder: str, position: str) -> None:
    _check_hostile(lambda: _hostile_class(dunder), position)
    try:
        _hostile_class(dunder)()
    except Boom:
        return
    _check_hostile(lambda: _hostile_class(dunder)(), position)


@pytest.mark.parametrize("position", [p for p in sorted(_POSITIONS) if p != "dict-key"])
def test_unhashable_by_raising(position: str) -> None:
    _check_hostile(HashRaises, position)


# -- random graphs of hostile, broken and fine objects ---------------------------------

_HOSTILE_KINDS = [
    (base, dunder) for base in sorted(_BASES) for dunder in _METHOD_DUNDERS + _PROPERTY_DUNDERS
]


def _make(kind: Any) -> Any:
    if kind == "lock":
        return threading.Lock()
    try:
        return _hostile_instance(*kind)
    except (Boom, TypeError):  # that dunder cannot be hostile on that base
        return None


@settings(max_examples=200, deadline=None)
@given(graph_specs(st.sampled_from([*_HOSTILE_KINDS, "lock"]), max_leaves=16))
def test_random_hostile_graphs_never_raise_and_point_at_culprits(spec: Any) -> None:
    _assert_well_formed(check_agrees_with_pickle(build(spec, _make)))


def test_hostile_objects_inside_a_torch_module() -> None:
    torch = pytest.importorskip("torch")
    model = torch.nn.Linear(2, 2)
    model.__dict__["hostile"] = _hostile_instance("plain", "__class__")  # torch would ask it
    model.lock = threading.Lock()
    model.weight.note = _hostile_instance("list", "__iter__")  # on a Parameter's __dict__
    findings = find_unpicklable(model, root="model")
    _assert_well_formed(findings)
    assert [f.path for f in findings] == ["model.weight.note", "model.hostile", "model.lock"]
