"""The ``new-of-listed-class`` rule: ``functools.partial(object.__new__, cls, **kw)()`` only.

Pickle protocols 2-3 write an object whose class defines ``__getnewargs_ex__``
(GluonTS's ``@validated``) as that partial; tests/zoo/test_gluonts.py loads a
real GluonTS 0.16.2 checkpoint. Here a test-only class stands for the listed
one, and every other use of ``functools.partial`` a file can spell is refused
with nothing run.
"""

from __future__ import annotations

import argparse
import collections
import functools
import io
import os
import pickle
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from compatshim.checkpoint import UnsafeCheckpointError, allowlist, inspect, load  # noqa: E402
from compatshim.checkpoint.allowlist import Entry  # noqa: E402


class Validated:
    """As GluonTS's ``@validated`` classes pickle: ``__getnewargs_ex__`` and ``__init_args__``."""

    def __init__(self, beta: float = 0.0, sizes: Any = (1, 2)) -> None:
        self.__init_args__ = collections.OrderedDict(beta=beta, sizes=sizes)
        self.beta = beta
        self.sizes = sizes

    def __getnewargs_ex__(self) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return (), dict(self.__init_args__)

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and vars(other) == vars(self)


class Unlisted(Validated):
    pass


MODULE = Validated.__module__


@pytest.fixture(autouse=True)
def table(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    row = Entry(MODULE, "Validated", None, "", "instance", "test class")
    monkeypatch.setitem(allowlist._INDEX, row.qualname, row)
    yield


def saved(obj: Any, protocol: int = 2) -> io.BytesIO:
    buffer = io.BytesIO()
    torch.save(obj, buffer, pickle_protocol=protocol)
    buffer.seek(0)
    return buffer


def refused(data: Any, match: str | None = None) -> UnsafeCheckpointError:
    source = data if isinstance(data, io.BytesIO) else io.BytesIO(b"\x80\x02" + data + b".")
    with pytest.raises(UnsafeCheckpointError, match=match) as caught:
        load(source)
    return caught.value


# ---------------------------------------------------------------- pickle assembly (protocol 2)
def g(module: str, name: str) -> bytes:
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def s(text: str) -> bytes:
    data = text.encode()
    return b"X" + struct.pack("<I", len(data)) + data


def tup(*items: bytes) -> bytes:
    return b"(" + b"".join(items) + b"t"


def setitems(**items: bytes) -> bytes:
    return b"}(" + b"".join(s(k) + v for k, v in items.items()) + b"u"


NEW = g("builtins", "getattr") + tup(g("builtins", "object"), s("__new__")) + b"R"
CLS = g(MODULE, "Validated")
F = b"G" + struct.pack(">d", 0.5)


def partial(func: bytes = NEW, put: bool = True) -> bytes:
    """``functools.partial(func)``; memo 0 holds ``func`` when ``put``."""
    return g("functools", "partial") + func + (b"q\x00" if put else b"") + b"\x85R"


def state(
    args: bytes, keywords: bytes = b"N", extra: bytes = b"N", func: bytes = b"h\x00"
) -> bytes:
    return tup(func, args, keywords, extra) + b"b"


def shape(args: bytes = tup(CLS), keywords: bytes = b"N", call: bytes = b")R") -> bytes:
    return partial() + state(args, keywords) + call


# ---------------------------------------------------------------- what is read
@pytest.mark.parametrize("protocol", [2, 3])
def test_the_pickle_of_getnewargs_ex_loads_as_the_object(protocol: int) -> None:
    made = Validated(0.5, [1, 2, {"k": (3, None)}])
    assert b"functools\npartial" in pickle.dumps(made, protocol=protocol)
    loaded = load(saved({"head": made, "again": made}, protocol))
    assert loaded["head"] == made and loaded["again"] is loaded["head"]
    assert type(loaded["head"].__init_args__) is collections.OrderedDict


def test_hand_made_shape_loads_and_nothing_is_a_partial() -> None:
    made = load(io.BytesIO(b"\x80\x02" + shape(keywords=setitems(beta=F)) + b"."))
    assert type(made) is Validated and vars(made) == {}
    assert inspect(saved(Validated())).loadable


def test_inspect_reports_the_rule() -> None:
    info = inspect(saved(Validated()))
    names = {g.name: g for g in info.globals}
    assert names["functools.partial"].kind == "rule" and info.loadable
    assert names["builtins.object.__new__"].covered


# ---------------------------------------------------------------- what is refused
def test_partial_of_os_system(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    data = saved({"p": functools.partial(os.system, f"touch {marker}")})
    assert refused(data).refused[0] in ("posix.system", "os.system", "nt.system")
    assert not inspect(saved({"p": functools.partial(os.system, "true")})).loadable
    assert not marker.exists()


@pytest.mark.parametrize(
    "func",
    [
        g("collections", "OrderedDict"),  # a listed constructor
        g("builtins", "object"),  # a listed class, not its __new__
        g("torch._utils", "_rebuild_tensor_v2"),
        g("builtins", "getattr"),
        g("functools", "partial"),
        g("builtins", "getattr") + tup(CLS, s("__new__")) + b"R",  # no row: refused by getattr
    ],
)
def test_partial_of_anything_but_object_new(func: bytes) -> None:
    refused(partial(func) + state(tup(CLS)) + b")R", "partial|getattr")


def test_partial_of_object_new_on_a_class_off_the_table() -> None:
    refused(saved(Unlisted()), "Unlisted")
    refused(shape(tup(g(MODULE, "Unlisted"))), "Unlisted")


@pytest.mark.parametrize(
    "cls",
    [
        g("collections", "OrderedDict"),  # a constructor row
        g("builtins", "dict"),  # a constant class
        g("argparse", "ArgumentParser"),  # off the table
    ],
)
def test_partial_of_object_new_on_a_class_not_listed_for_instances(cls: bytes) -> None:
    refused(shape(tup(cls)))


def test_a_class_given_by_allow_does_not_open_the_rule() -> None:
    data = b"\x80\x02" + shape(tup(g(MODULE, "Unlisted"))) + b"."
    with pytest.raises(UnsafeCheckpointError, match="allow-listed for plain instances"):
        load(io.BytesIO(data), allow=[Unlisted])


def test_a_partial_returned_as_data() -> None:
    refused(partial() + state(tup(CLS)), "is functools.partial")
    refused(b"(" + partial() + state(tup(CLS)) + b"l", "functools.partial as a value")
    refused(saved({"p": functools.partial(object.__new__, argparse.Namespace)}), "as a value")
    refused(g("functools", "partial"), "is functools.partial")  # the class itself
    refused(NEW, "is builtins.object.__new__")
    refused(b"(" + g("builtins", "getattr") + b"l", "builtins.getattr as a value")
    refused(g("builtins", "getattr"), "is builtins.getattr")  # the loaded object itself


@pytest.mark.parametrize(
    "args",
    [
        tup(CLS, s("rm -rf /")),  # positional arguments after the class
        tup(CLS, CLS),
        tup(),
        tup(g("os", "system")),
        s("x"),
    ],
)
def test_partial_with_other_positional_arguments(args: bytes) -> None:
    refused(shape(args))


@pytest.mark.parametrize(
    "keywords",
    [
        setitems(f=g("collections", "OrderedDict")),  # a class as data
        setitems(f=g("torch", "float32")),  # a non-plain constant
        setitems(f=NEW),  # a callable
        b"}(K\x01K\x02u",  # not names
        s("x"),
    ],
)
def test_partial_with_keywords_that_are_not_plain_data(keywords: bytes) -> None:
    refused(shape(keywords=keywords))


def test_partial_with_attributes_or_another_function_in_its_state() -> None:
    refused(partial() + state(tup(CLS), extra=setitems(x=F)) + b")R", "attributes")
    refused(partial() + state(tup(CLS), func=g("builtins", "object")) + b")R", "another function")
    refused(partial() + b"(h\x00" + tup(CLS) + b"Nt" + b"b)R", "state")  # 3 items


def test_partial_called_twice_before_its_state_or_with_arguments() -> None:
    refused(partial() + b"q\x01" + state(tup(CLS)) + b")R0h\x01)R", "called once")
    refused(partial() + b")R", "called once")
    refused(partial() + state(tup(CLS)) + tup(CLS) + b"R", "with arguments")
    refused(partial() + b"q\x01" + state(tup(CLS)) + b"0h\x01" + state(tup(CLS)), "once")


@pytest.mark.parametrize(
    "attrs",
    [
        {"distribution": g("collections", "OrderedDict")},  # shadows a method with a class
        {"__class__": F},
        {"__init_args__": setitems(other=F)},  # other names than the partial's keywords
        {"__init_args__": s("x")},
    ],
)
def test_state_of_what_the_partial_made(attrs: dict[str, bytes]) -> None:
    refused(shape(keywords=setitems(beta=F)) + setitems(**attrs) + b"b")


def test_plain_state_and_init_args_are_kept() -> None:
    body = shape(keywords=setitems(beta=F))
    body += setitems(__init_args__=setitems(beta=F), beta=F) + b"b"
    made = load(io.BytesIO(b"\x80\x02" + body + b"."))
    assert vars(made) == {"__init_args__": {"beta": 0.5}, "beta": 0.5}


def test_checking_shared_keyword_data_is_charged_to_the_budget() -> None:
    """One big list shared by the keywords of many partials is walked once per partial: the
    walk is charged, so the load stops within a small multiple of the file size."""
    big = list(range(50_000))
    many = [Validated(0.0, big) for _ in range(3_000)]
    data = saved(many)
    with pytest.raises(Exception, match="work budget"):
        load(data)
