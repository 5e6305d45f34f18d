"""``compatshim.find_unpicklable``: innermost culprits with exact paths, agreeing with pickle.

Real objects throughout: real locks, generators, files, torch modules, tensors
and a real gloo ProcessGroup (a one-rank group on an in-memory store).
"""

from __future__ import annotations

import collections
import dataclasses
import pickle
import threading
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

pytest.importorskip("torch")

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import compatshim
from compatshim.pickling import Finding, find_unpicklable

from .random_graphs import Node, build, check_agrees_with_pickle, graph_specs


class Slotted:
    __slots__ = ("payload", "tag")

    def __init__(self, payload: Any, tag: str) -> None:
        self.payload = payload
        self.tag = tag


class RefusesPickling:
    def __reduce__(self) -> Any:
        raise TypeError("RefusesPickling holds a socket")


def module_level_function() -> int:
    return 1


def _paths(obj: Any, **kwargs: Any) -> list[str]:
    return [finding.path for finding in find_unpicklable(obj, **kwargs)]


def _pickle_error(obj: Any) -> str:
    with pytest.raises(Exception) as info:
        pickle.dumps(obj)
    return f"{type(info.value).__name__}: {info.value}"


def test_clean_graph_has_no_finding() -> None:
    graph = Node(
        a=[1, 2.0, "x", b"y", None, (3, 4)],
        d={"k": {1, 2}, 5: frozenset({6})},
        f=module_level_function,
        cls=Node,
        od=collections.OrderedDict(z=1),
        dd=collections.defaultdict(list, {"a": [1]}),
        slotted=Slotted([1], "t"),
        tensor=torch.arange(4.0),
    )
    pickle.dumps(graph)
    assert find_unpicklable(graph) == []


def test_innermost_culprit_only_with_its_exact_path_and_pickles_own_error() -> None:
    culprit = {"a": 1}.keys()
    root = Node(outer=Node(inner=[{"views": (culprit,)}]))
    findings = find_unpicklable(root, root="dataset")
    assert findings == [
        Finding(
            path="dataset.outer.inner[0]['views'][0]",
            type_name="dict_keys",
            error=_pickle_error(culprit),
            fix=None,
        )
    ]
    assert str(findings[0]) == (
        "dataset.outer.inner[0]['views'][0] (dict_keys): "
        "TypeError: cannot pickle 'dict_keys' object"
    )


def test_finding_is_a_small_frozen_value() -> None:
    finding = find_unpicklable(Node(g=(i for i in range(2))))[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        finding.path = "elsewhere"  # type: ignore[misc]
    assert finding == Finding("obj.g", "generator", finding.error)


def test_cycles_and_shared_objects_are_walked_once() -> None:
    lock = threading.Lock()
    root = Node(lock=lock)
    root.me = root
    loop: list[Any] = []
    loop.append(loop)
    loop.append(Node(back=root, again=lock))
    root.loop = loop
    assert _paths(root) == ["obj.lock"]


def test_every_kind_of_culprit_inside_nested_containers(tmp_path: Path) -> None:
    with open(tmp_path / "f.txt", "w") as handle:
        graph = {
            "hooks": [1, {"on_step": lambda: 0}],
            "state": ({"lock": threading.RLock()},),
            "stream": [[(x for x in range(3))]],
            "files": {"log": handle},
            "ok": [1, 2, 3],
            "sets": {frozenset({"a"})},
            "refuses": Node(x=RefusesPickling()),
            "factory": collections.defaultdict(lambda: 0),
            frozenset({1}): "a hashable non-atomic key is fine",
        }
        findings = {f.path: f for f in find_unpicklable(graph, root="cfg")}
    assert sorted(findings) == sorted(
        [
            "cfg['hooks'][1]['on_step']",
            "cfg['state'][0]['lock']",
            "cfg['stream'][0][0]",
            "cfg['files']['log']",
            "cfg['refuses'].x",
            "cfg['factory'].default_factory",
        ]
    )
    assert findings["cfg['hooks'][1]['on_step']"].type_name == "function"
    assert findings["cfg['state'][0]['lock']"].type_name == "_thread.RLock"
    assert findings["cfg['stream'][0][0]"].type_name == "generator"
    assert findings["cfg['files']['log']"].type_name == "_io.TextIOWrapper"
    assert "holds a socket" in findings["cfg['refuses'].x"].error


def test_unpicklable_dict_key_and_set_member_are_named() -> None:
    class Local:  # a class pickle cannot find by name
        pass

    key = Local()
    graph = {"table": {key: 1}, "members": {Local}}
    findings = find_unpicklable(graph)
    assert [f.path for f in findings] == ["obj['table']<key #0>", "obj['members']{#0}"]
    assert all("Local" in f.error for f in findings)


def test_slots_bound_methods_and_reduce_args_are_followed() -> None:
    holder = Node(lock=threading.Lock())
    holder.method = Node.__init__.__get__(holder)
    graph = Node(
        slotted=Slotted(payload=[{1: 2}.values()], tag="t"),
        callback=holder.method,
        ordered=collections.OrderedDict(bad={}.items()),
    )
    assert _paths(graph) == [
        "obj.slotted.payload[0]",
        "obj.callback.__self__.lock",
        "obj.ordered['bad']",
    ]


def test_torch_module_submodules_parameters_buffers_and_hooks() -> None:
    model = torch.nn.Sequential(
        collections.OrderedDict(
            encoder=torch.nn.Linear(3, 3),
            norm=torch.nn.BatchNorm1d(3),
        )
    )
    model.encoder.lock = threading.Lock()
    model.encoder.weight.describe = lambda: "weight"  # python attribute on a Parameter
    model.norm.running_mean.owner = (x for x in range(1))  # ... and on a buffer
    hook = model.norm.register_forward_hook(lambda *args: None)  # id from torch's global counter
    model.register_buffer("steps", torch.zeros(1))
    paths = _paths(model, root="model")
    assert paths == [
        "model.encoder.weight.describe",
        "model.encoder.lock",
        "model.norm.running_mean.owner",
        f"model.norm._forward_hooks[{hook.id}]",
    ]
    # ancestors are fine once the culprits go
    del model.encoder.lock, model.encoder.weight.describe, model.norm.running_mean.owner
    model.norm._forward_hooks.clear()
    assert find_unpicklable(model) == []
    pickle.dumps(model)


def test_module_lock_suggests_clone_module() -> None:
    model = torch.nn.Linear(2, 2)
    model.lock = threading.Lock()
    (finding,) = find_unpicklable(model, root="model")
    assert finding.path == "model.lock"
    assert finding.fix is not None and "clone_module" in finding.fix


@pytest.fixture
def world_group() -> Iterator[Any]:
    """A real one-rank gloo group (no other process needed)."""
    import torch.distributed as dist

    compatshim.uninstall(["torch-processgroup-copy"])
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


def test_process_group_is_named_with_the_patch_that_covers_it(world_group: Any) -> None:
    model = torch.nn.Linear(2, 2)
    model.group = world_group
    holder = {"ema": [model]}
    (finding,) = find_unpicklable(holder, root="trainer")
    assert finding.path == "trainer['ema'][0].group"
    assert finding.type_name.endswith("ProcessGroup")
    assert finding.error == _pickle_error(world_group)
    assert finding.fix is not None and "torch-processgroup-copy" in finding.fix
    assert "clone_module" in finding.fix


@pytest.mark.parametrize(
    "written", ["torch-processgroup-copy", "torch_processgroup_copy", " Torch-ProcessGroup-Copy"]
)
def test_a_patch_compatshim_disable_names_is_not_offered_as_install(
    world_group: Any, monkeypatch: pytest.MonkeyPatch, written: str
) -> None:
    """With COMPATSHIM_DISABLE=torch-processgroup-copy the fix said 'compatshim.install()',
    which leaves that patch off; so it did for a spelling slip the registry honours the same
    way (``torch_processgroup_copy``)."""
    monkeypatch.setenv("COMPATSHIM_DISABLE", written)
    (finding,) = find_unpicklable({"group": world_group})
    assert finding.fix is not None
    assert finding.fix.startswith(
        "patch torch-processgroup-copy (disabled by COMPATSHIM_DISABLE here: remove it there, "
    ), finding.fix


def test_a_hundred_thousand_deep_chain_does_not_hit_the_recursion_limit() -> None:
    root = Node()
    node = root
    for index in range(100_000):
        node.next = Node(index=index)
        node = node.next
    node.bad = {}.keys()
    (finding,) = find_unpicklable(root)
    assert finding.path == "obj" + ".next" * 100_000 + ".bad"


def test_a_chain_too_deep_for_pickle_is_reported_at_the_root() -> None:
    root = Node()
    node = root
    for _ in range(50_000):
        node.next = Node()
        node = node.next
    (finding,) = find_unpicklable(root, root="chain")
    assert finding.path == "chain"
    assert finding.error.startswith("RecursionError")


def test_limit_stops_early() -> None:
    graph = [threading.Lock() for _ in range(10)]
    assert len(find_unpicklable(graph, limit=3)) == 3
    assert len(find_unpicklable(graph)) == 10


# -- agreement with pickle on random graphs --------------------------------------------

_BAD: list[Callable[[], Any]] = [
    lambda: {}.keys(),
    threading.Lock,
    lambda: (x for x in ()),
    lambda: lambda: 0,
    RefusesPickling,
]


@settings(max_examples=150, deadline=None)
@given(graph_specs(st.sampled_from(range(len(_BAD)))))
def test_no_finding_exactly_when_pickle_succeeds(spec: Any) -> None:
    check_agrees_with_pickle(build(spec, lambda i: _BAD[i]()))
