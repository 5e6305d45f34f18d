"""``find_unpicklable``'s arguments: checked up front, as pickle would take them.

A bad ``protocol``, ``root`` or ``limit`` used to come back as findings (every
object blamed, or a clean graph reported) or as an error from deep inside the walk.
"""

from __future__ import annotations

import pickle
import threading
from typing import Any

import pytest

from compatshim.pickling import find_unpicklable

CULPRIT = "obj['a'][1]"


def _graph() -> dict[str, Any]:
    return {"a": [1, threading.Lock()], "b": [1, 2]}


@pytest.mark.parametrize("protocol", [-1, -5, pickle.HIGHEST_PROTOCOL])
def test_a_negative_protocol_is_the_highest_as_for_pickle(protocol: int) -> None:
    (finding,) = find_unpicklable(_graph(), protocol=protocol)
    assert finding == find_unpicklable(_graph(), protocol=pickle.HIGHEST_PROTOCOL)[0]
    assert (finding.path, finding.type_name) == (CULPRIT, "_thread.lock")
    assert finding.fix is not None


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_every_protocol_pickle_knows_gets_pickles_own_verdict(protocol: int) -> None:
    """From protocol 2 pickle refuses the lock; below, copyreg reduces it to its class, which
    pickle then cannot find by name (what a negative protocol used to report), on CPython
    3.11.7 and 3.12.1 here; 3.9.18, 3.13.0, 3.14 and 3.15 refuse the lock itself ("cannot
    pickle 'lock' object")."""
    with pytest.raises(Exception) as refused:
        pickle.dumps(_graph(), protocol)
    (finding,) = find_unpicklable(_graph(), protocol=protocol)
    assert finding.error == f"{type(refused.value).__name__}: {refused.value}"
    by_class = isinstance(refused.value, pickle.PicklingError)  # the class, reached as an arg
    assert finding.path == (CULPRIT + "<arg 0>" if by_class else CULPRIT)


def test_protocol_none_is_the_default_as_for_pickle() -> None:
    assert find_unpicklable(_graph(), protocol=None) == find_unpicklable(_graph())
    assert find_unpicklable([1, "x"], protocol=None) == []


def test_a_protocol_above_the_highest_is_a_value_error_not_a_finding() -> None:
    with pytest.raises(ValueError, match=r"^protocol: expected at most"):
        find_unpicklable([1, "x"], protocol=pickle.HIGHEST_PROTOCOL + 1)


@pytest.mark.parametrize("protocol", ["2", 2.0, True])
def test_a_protocol_that_is_no_int_is_a_type_error_not_a_finding(protocol: Any) -> None:
    with pytest.raises(TypeError, match=r"^protocol: expected an int or None"):
        find_unpicklable(_graph(), protocol=protocol)


@pytest.mark.parametrize("root", [None, 5, b"obj"])
def test_a_root_that_is_no_str_is_a_type_error(root: Any) -> None:
    with pytest.raises(TypeError, match=r"^root: expected .* \(a str\)"):
        find_unpicklable(_graph(), root=root)


@pytest.mark.parametrize("limit", ["1", 1.5, True])
def test_a_limit_that_is_no_int_is_a_type_error(limit: Any) -> None:
    with pytest.raises(TypeError, match=r"^limit: expected a positive int or None"):
        find_unpicklable(_graph(), limit=limit)


@pytest.mark.parametrize("limit", [0, -1])
def test_a_limit_below_one_is_a_value_error_not_a_clean_graph(limit: int) -> None:
    with pytest.raises(ValueError, match=r"^limit: expected a positive int or None"):
        find_unpicklable(_graph(), limit=limit)


def test_arguments_are_checked_for_a_clean_graph_too() -> None:
    with pytest.raises(ValueError, match=r"^limit"):
        find_unpicklable([1, "x"], limit=0)
    with pytest.raises(TypeError, match=r"^root"):
        find_unpicklable([1, "x"], root=None)
