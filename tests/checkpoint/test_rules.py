"""Argument rules: ``builtins.getattr`` only as ``getattr(<listed class>, <its listed method>)``.

Hand-made pickles try every other use of ``getattr`` the format allows (a
name not listed, a dunder, a default, a module, a staticmethod, a property, a
function assigned from elsewhere, a class given by ``allow=``, calling the
result) and must be refused with nothing run: the test class records every
descriptor access, metaclass ``__getattr__`` and call. A test-only class is
added to the table for the run; mmengine's real ``HistoryBuffer`` rows are
tested in tests/zoo/test_mmengine.py.
"""

from __future__ import annotations

import io
import os
import struct
from collections.abc import Iterator
from typing import Any

import pytest

from compatshim.checkpoint import UnsafeCheckpointError, allowlist, inspect, load
from compatshim.checkpoint.allowlist import ARG_RULES, Entry, entries, lookup

CALLS: list[str] = []


class _Recording(type):
    def __getattr__(cls, name: str) -> Any:
        CALLS.append(f"metaclass __getattr__ {name}")
        return lambda *a: CALLS.append("ran")


def _elsewhere(self: Any) -> None:
    CALLS.append("elsewhere")


class Owner(metaclass=_Recording):
    """Stands for a listed framework class such as mmengine's HistoryBuffer."""

    def stat(self) -> int:
        CALLS.append("stat")
        return 1

    def other(self) -> int:
        CALLS.append("other")
        return 2

    @staticmethod
    def static() -> None:
        CALLS.append("static")

    @classmethod
    def klass(cls) -> None:
        CALLS.append("klass")

    @property
    def prop(self) -> Any:
        CALLS.append("property")
        return os.system

    assigned = _elsewhere
    builtin = print


MODULE = Owner.__module__
LISTED = ("stat", "static", "klass", "prop", "assigned", "builtin", "missing", "__init__")


@pytest.fixture(autouse=True)
def table(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Owner and rows for its names, as a framework's would be; nothing recorded yet."""
    rows = [Entry(MODULE, "Owner", None, "", "instance", "test class")]
    rows += [Entry(MODULE, f"Owner.{n}", None, "", "method", "test") for n in LISTED]
    for row in rows:
        monkeypatch.setitem(allowlist._INDEX, row.qualname, row)
    CALLS.clear()
    yield
    assert CALLS == [], "something from the file ran"


# ---------------------------------------------------------------- pickle assembly (protocol 2)
def g(module: str, name: str) -> bytes:
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def s(text: str) -> bytes:
    data = text.encode()
    return b"X" + struct.pack("<I", len(data)) + data


def call(func: bytes, *args: bytes) -> bytes:
    """REDUCE ``func`` on a tuple of ``args``."""
    return func + b"(" + b"".join(args) + b"tR"


def getattr_(*args: bytes) -> bytes:
    return call(g("builtins", "getattr"), *args)


def stack_global(module: str, name: str) -> bytes:
    """Protocol 4's spelling of ``module.Class.method``."""
    return b"\x80\x04" + s(module) + s(name) + b"\x93."


def run(body: bytes, **kwargs: Any) -> Any:
    return load(io.BytesIO(b"\x80\x02" + body + b"."), **kwargs)


def refused(body: bytes, match: str | None = None, **kwargs: Any) -> UnsafeCheckpointError:
    with pytest.raises(UnsafeCheckpointError, match=match) as caught:
        run(body, **kwargs)
    return caught.value


OWNER = g(MODULE, "Owner")


# ---------------------------------------------------------------- what is allowed
def test_getattr_of_a_listed_method_returns_the_function_itself() -> None:
    assert run(getattr_(OWNER, s("stat"))) is vars(Owner)["stat"]
    assert run(b"]" + getattr_(OWNER, s("stat")) + b"a") == [vars(Owner)["stat"]]


def test_protocol_4_names_the_same_row() -> None:
    assert load(io.BytesIO(stack_global(MODULE, "Owner.stat"))) is vars(Owner)["stat"]
    info = inspect(io.BytesIO(stack_global(MODULE, "Owner.stat")))
    assert info.loadable and info.globals[0].kind == "method"


# ---------------------------------------------------------------- what is refused
@pytest.mark.parametrize("name", ["other", "update", "_abc_impl", "mro", "x" * 300])
def test_name_without_a_method_row(name: str) -> None:
    refused(getattr_(OWNER, s(name)), "builtins.getattr")


@pytest.mark.parametrize(
    "name", ["__init__", "__class__", "__dict__", "__reduce_ex__", "__subclasses__", "__globals__"]
)
def test_dunder(name: str) -> None:
    refused(getattr_(OWNER, s(name)), "builtins.getattr")


@pytest.mark.parametrize("name", ["static", "klass", "prop", "assigned", "builtin", "missing"])
def test_listed_name_that_is_not_a_plain_function_of_the_class(name: str) -> None:
    """Rows exist for these names: the class attribute itself decides (no descriptor runs)."""
    refused(getattr_(OWNER, s(name)), "not a function defined on the class")
    with pytest.raises(UnsafeCheckpointError):
        load(io.BytesIO(stack_global(MODULE, f"Owner.{name}")))


def test_method_made_a_staticmethod_or_property_after_listing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    original = vars(Owner)["stat"]
    for replacement in (staticmethod(original), property(original), classmethod(original)):
        monkeypatch.setattr(Owner, "stat", replacement)
        refused(getattr_(OWNER, s("stat")), "not a function defined on the class")


def test_three_arguments_or_one_or_none() -> None:
    refused(getattr_(OWNER, s("stat"), b"N"), "exactly")
    refused(getattr_(OWNER, s("missing"), s("default")), "exactly")
    refused(getattr_(OWNER), "exactly")
    refused(getattr_(), "exactly")


@pytest.mark.parametrize("name", [b"C\x04stat", b"K\x01", b"N"])
def test_name_that_is_not_a_str(name: bytes) -> None:
    refused(getattr_(OWNER, name), "exactly")


@pytest.mark.parametrize(
    "owner",
    [
        g("builtins", "object"),  # a listed class, but a constant: no method rows apply
        g("builtins", "dict"),
        g("builtins", "getattr"),  # getattr(getattr, '__self__') is the builtins module
        g("collections", "OrderedDict"),
        g("argparse", "Namespace"),  # a listed class without method rows
        getattr_(OWNER, s("stat")),  # the result: getattr(f, '__globals__') -> module dict
    ],
)
@pytest.mark.parametrize("name", ["stat", "__self__", "__globals__", "system", "fromkeys"])
def test_owner_that_is_not_a_listed_class(owner: bytes, name: str) -> None:
    refused(getattr_(owner, s(name)))


@pytest.mark.parametrize(
    "module,name", [("os", "system"), ("builtins", "eval"), ("sys", "modules")]
)
def test_modules_never_reach_getattr(module: str, name: str) -> None:
    refused(getattr_(g(module, name), s("stat")), f"{module}.{name}")
    refused(g("builtins", "getattr") + g(module, name) + s(name) + b"\x86R", f"{module}.{name}")


def test_class_given_by_allow_does_not_open_getattr() -> None:
    """``allow=`` lets a class be built, not its attributes be read by the file."""
    refused(
        getattr_(g("argparse", "ArgumentParser"), s("parse_args")),
        allow=["argparse.ArgumentParser"],
    )
    refused(getattr_(g(MODULE, "Owner"), s("other")), allow=[Owner])


def test_the_returned_method_is_never_called_by_the_loader() -> None:
    refused(call(getattr_(OWNER, s("stat")), b"N"), "may not be called")
    body = stack_global(MODULE, "Owner.stat")[:-1] + b"N\x85R."  # STACK_GLOBAL then REDUCE
    with pytest.raises(UnsafeCheckpointError, match="may not be called"):
        load(io.BytesIO(body))
    refused(call(g("builtins", "getattr"), s("x")), "exactly")


def test_no_state_set_on_the_returned_function_or_the_class() -> None:
    before = dict(vars(vars(Owner)["stat"]))
    refused(getattr_(OWNER, s("stat")) + s("x") + b"K\x01s", "SETITEM")
    refused(getattr_(OWNER, s("stat")) + b"}" + s("x") + b"K\x01sb", "BUILD")
    refused(OWNER + b"}" + s("stat") + b"Nsb", "BUILD")
    assert dict(vars(vars(Owner)["stat"])) == before
    assert type(vars(Owner)["stat"]).__name__ == "function"


# ---------------------------------------------------------------- the table
def test_rule_rows_are_well_formed() -> None:
    for entry in entries():
        assert (entry.kind == "rule") == (entry.args is not None), entry
        assert entry.args is None or entry.args in ARG_RULES, entry
        if entry.kind == "method":
            owner = lookup(entry.module, entry.name.partition(".")[0])
            assert owner is not None and owner.kind in ("instance", "dict-subclass"), entry
            assert (owner.distribution, owner.versions) == (entry.distribution, entry.versions)
    getattr_row = lookup("builtins", "getattr")
    assert getattr_row is not None and getattr_row.args == "method-of-listed-class"


def test_only_classes_constants_and_method_rows_may_be_values() -> None:
    """Functions that build the result (constructors, rebuilds, rules) never come back as data."""
    from compatshim.checkpoint._safe import harmless_value

    for entry in entries():
        if entry.distribution not in ("torch", "numpy", None) or not entry.applies():
            continue
        try:
            obj = entry.resolve()
        except LookupError:
            continue
        if entry.kind in ("constructor", "rebuild", "rule") and not isinstance(obj, type):
            assert not harmless_value(entry, obj), entry.qualname
        if entry.kind != "rule" and (isinstance(obj, type) or not callable(obj)):
            assert harmless_value(entry, obj), entry.qualname
