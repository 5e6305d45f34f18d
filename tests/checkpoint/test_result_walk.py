"""The result walk's shortcuts: tensors without Python attributes, objects without any.

``load`` does not enter the tensors it rebuilt without attributes (nothing is inside
them to walk); a tensor that was given attributes is walked like any object, and a
skipped tensor still counts as one level of nesting. An instance with no attributes is
not given a ``__dict__`` by the walk (64 bytes each, kept in the result) nor a row in its
table of heights; it still counts as one level.
"""

from __future__ import annotations

import argparse
import gc
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

import torch

from compatshim.checkpoint import CheckpointError, UnsafeCheckpointError, load
from compatshim.checkpoint._machine import MAX_NESTING
from compatshim.checkpoint._safe import check_result
from tests.checkpoint.corpus import P2, STOP, call, d, empty_od, g, n, t, torch_zip, u


def _tensor_with_state(folder: Path, state: bytes) -> Path:
    storage = t(u("storage"), g("torch", "FloatStorage"), u("0"), u("cpu"), n(1)) + b"Q"
    inner = t(storage, n(0), t(n(1)), t(n(1)), b"\x89", empty_od())
    args = (g("torch._utils", "_rebuild_tensor_v2"), g("torch", "Tensor"), inner, state)
    body = call(g("torch._tensor", "_rebuild_from_type_v2"), *args)
    return torch_zip(folder / "c.pt", P2 + d((u("t"), body)) + STOP, {"data/0": b"\0" * 4})


def test_attributes_of_a_tensor_are_still_walked_for_forbidden_values(tmp_path: Path) -> None:
    state = d((u("f"), g("torch._utils", "_rebuild_tensor_v2")))
    with pytest.raises(UnsafeCheckpointError, match="as a value"):
        load(_tensor_with_state(tmp_path, state))


def test_attributes_of_a_tensor_are_still_walked_for_depth(tmp_path: Path) -> None:
    depth = MAX_NESTING + 5
    deep = b"]" * depth + b"a" * (depth - 1)  # lists nested ``depth`` levels
    with pytest.raises(CheckpointError, match="nested deeper"):
        load(_tensor_with_state(tmp_path, d((u("deep"), deep))))


def test_tensor_attributes_load(tmp_path: Path) -> None:
    loaded = load(_tensor_with_state(tmp_path, d((u("note"), u("kept")))))
    assert loaded["t"].note == "kept"


def _nested(levels: int, leaf: Any) -> Any:
    value = leaf
    for _ in range(levels):
        value = [value]
    return value


@pytest.mark.parametrize("levels", [3, 4, 5])
def test_a_skipped_tensor_counts_one_level_as_a_walked_one_does(levels: int) -> None:
    tensor = torch.zeros(1)
    value = _nested(levels, tensor)
    verdicts = []
    for bare in (None, {id(tensor): tensor}):
        try:
            check_result(value, "x", bare=bare, limit=5)
            verdicts.append("ok")
        except CheckpointError:
            verdicts.append("deep")
    assert verdicts[0] == verdicts[1] == ("ok" if levels + 1 <= 5 else "deep")


def _namespaces(folder: Path, count: int, state: bytes = b"") -> Path:
    """A list of ``count`` argparse.Namespace made by NEWOBJ, each given ``state`` by BUILD."""
    one = g("argparse", "Namespace") + b")\x81" + (state + b"b" if state else b"")
    path = folder / "ns.pkl"
    path.write_bytes(P2 + b"](" + one * count + b"e" + STOP)
    return path


def test_instances_without_attributes_are_not_given_a_dict(tmp_path: Path) -> None:
    loaded = load(_namespaces(tmp_path, 3))
    assert [type(x) for x in loaded] == [argparse.Namespace] * 3
    # a __dict__ made by the walk would be among the referents: 64 bytes an object, kept
    assert all(gc.get_referents(x) == [argparse.Namespace] for x in loaded)


def test_an_instance_with_attributes_is_still_walked_for_forbidden_values(tmp_path: Path) -> None:
    state = d((u("f"), g("torch._utils", "_rebuild_tensor_v2")))
    with pytest.raises(UnsafeCheckpointError, match="as a value"):
        load(_namespaces(tmp_path, 2, state))
    assert vars(load(_namespaces(tmp_path, 2, d((u("lr"), n(3))))).pop()) == {"lr": 3}


@pytest.mark.parametrize("levels", [3, 4, 5])
def test_an_instance_without_attributes_counts_one_level(levels: int) -> None:
    empty, full = argparse.Namespace(), argparse.Namespace(x=1)
    for leaf in (empty, full):  # the same verdicts, entered or not
        made = {id(leaf): leaf}
        try:
            check_result(_nested(levels, leaf), "x", created=made, limit=5)
            verdict = "ok"
        except CheckpointError:
            verdict = "deep"
        assert verdict == ("ok" if levels + 1 <= 5 else "deep")


def test_one_empty_instance_shared_everywhere_is_walked_in_linear_time() -> None:
    empty = argparse.Namespace()
    check_result([[empty] * 1000] * 1000, "x", created={id(empty): empty})


class _Loud:
    def __eq__(self, other: object) -> bool:
        raise AssertionError("the walk compared an attribute's value with ==")

    __hash__ = object.__hash__


def test_an_attribute_is_never_compared_with_eq() -> None:
    holder = argparse.Namespace(one=_Loud())
    check_result([holder], "x", created={id(holder): holder})
