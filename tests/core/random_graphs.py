"""Random object graphs for ``find_unpicklable``'s property tests, and the property itself.

A spec is lists, dicts and ``Node`` objects around leaves; a leaf
``("MAKE", key)`` is built by the test's own ``make(key)`` (a broken or
hostile object), anything else stays as it is.
"""

from __future__ import annotations

import pickle
from typing import Any, Callable

import pytest
from hypothesis import strategies as st

from compatshim.pickling import Finding, find_unpicklable


class Node:
    """A plain user object."""

    def __init__(self, **attrs: Any) -> None:
        self.__dict__.update(attrs)


_KEYS = st.text(alphabet="xyz", max_size=2)  # keys that read back as Python expressions


def graph_specs(made: st.SearchStrategy[Any], max_leaves: int = 20) -> st.SearchStrategy[Any]:
    """Specs whose special leaves are ``("MAKE", key)`` for each ``key`` drawn from ``made``."""
    leaves = st.one_of(st.integers(), _KEYS, st.none(), made.map(lambda key: ("MAKE", key)))
    return st.recursive(
        leaves,
        lambda children: st.one_of(
            st.lists(children, max_size=4),
            st.dictionaries(_KEYS, children, max_size=4),
            st.dictionaries(st.sampled_from(["a", "b", "c"]), children, max_size=3).map(
                lambda attrs: Node(**attrs)
            ),
        ),
        max_leaves=max_leaves,
    )


def build(spec: Any, make: Callable[[Any], Any]) -> Any:
    if isinstance(spec, tuple) and len(spec) == 2 and spec[0] == "MAKE":
        return make(spec[1])
    if isinstance(spec, list):
        return [build(v, make) for v in spec]
    if isinstance(spec, dict):
        return {k: build(v, make) for k, v in spec.items()}
    if isinstance(spec, Node):
        return Node(**{k: build(v, make) for k, v in vars(spec).items()})
    return spec


def check_agrees_with_pickle(graph: Any) -> list[Finding]:
    """No finding exactly when pickle succeeds; each path leads to an object pickle refuses.

    A container (list, dict, ``Node``) is never the culprit itself, so the root
    is blamed only when the root is what pickle refuses.
    """
    try:
        pickle.dumps(graph)
        picklable = True
    except Exception:
        picklable = False
    findings = find_unpicklable(graph)
    assert (findings == []) is picklable
    for finding in findings:
        head, _, _ = finding.path.partition("<")  # stop at a reduce-internal segment
        culprit = eval(head, {"obj": graph})  # paths are Python expressions here
        if type(culprit) in (list, dict, Node):
            assert head != finding.path, finding  # blamed only for something inside it
        with pytest.raises(Exception):  # noqa: B017 - whatever pickle raises
            pickle.dumps(culprit)
    return findings
