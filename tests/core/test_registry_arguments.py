"""``install``/``uninstall`` arguments: a wrong type is a TypeError naming the argument.

Each bad call raises before anything is armed or undone, so these run in-process.
"""

from __future__ import annotations

from typing import Any, Callable

import pytest

import compatshim

CALLS: dict[str, Callable[[Any], Any]] = {
    "include": lambda value: compatshim.install(value),
    "exclude": lambda value: compatshim.install(exclude=value),
    "names": lambda value: compatshim.uninstall(value),
}


@pytest.mark.parametrize("argument", sorted(CALLS))
@pytest.mark.parametrize("value", [5, 1.5, object(), b"removed-names"])
def test_a_value_that_is_no_name_nor_names_is_a_type_error_naming_the_argument(
    argument: str, value: Any
) -> None:
    with pytest.raises(TypeError, match=rf"^{argument}: expected a patch name"):
        CALLS[argument](value)
    assert compatshim._registry.armed() == []


@pytest.mark.parametrize("argument", sorted(CALLS))
def test_a_name_that_is_no_string_is_named_with_its_argument(argument: str) -> None:
    with pytest.raises(TypeError, match=rf"^{argument}: patch names must be strings, got 5$"):
        CALLS[argument](["removed-names", 5])


@pytest.mark.parametrize("argument", sorted(CALLS))
def test_a_bare_string_is_one_name_never_its_letters(argument: str) -> None:
    with pytest.raises(ValueError, match=r"unknown patch name\(s\) \['no-such-patch'\]"):
        CALLS[argument]("no-such-patch")
