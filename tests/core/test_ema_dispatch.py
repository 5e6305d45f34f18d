"""The EMA step skips torch's autograd kernel only where that changes nothing observable.

Each case compares ``update_ema`` with torch's own ``_foreach_lerp_`` under
``no_grad`` (what the step did before the short path): version counters,
forward-AD tangents, and what Python code running inside the call (a
torch-function mode, a ``__torch_function__`` subclass) sees of the dispatch
state. ``dispatch`` says why these are the cases.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch.autograd import forward_ad as fwAD  # noqa: E402

import compatshim.ema as cema  # noqa: E402

DECAY = 0.75


def _pair(dtype: Any = torch.float32) -> tuple[torch.nn.Module, torch.nn.Module]:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2).to(dtype)
    ema = copy.deepcopy(model).float()
    with torch.no_grad():
        for p in ema.parameters():
            p.add_(1.0)
    return model, ema


def _autograd_excluded() -> bool:
    """True inside ``_AutoDispatchBelowAutograd`` (it adds the autograd keys to the TLS set)."""
    return "Autograd" in str(torch._C._dispatch_tls_local_exclude_set())


def test_steady_state_takes_the_short_path() -> None:
    model, ema = _pair()
    cema.update_ema(ema, model, decay=DECAY)
    below = cema._plans[ema].below
    assert below is not None and below.allowed()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["lerp", "mul-add"])
def test_every_version_counter_is_bumped_as_torch_bumps_it(dtype: Any) -> None:
    """Code that watches ``_version`` (saved-tensor checks, caches) sees each EMA write."""
    model, ema = _pair(dtype)
    reference = copy.deepcopy(ema)
    cema.update_ema(ema, model, decay=DECAY)  # pairs
    before = [p._version for p in ema.parameters()]
    ref_before = [p._version for p in reference.parameters()]
    cema.update_ema(ema, model, decay=DECAY)
    with torch.no_grad():
        refs, srcs = list(reference.parameters()), list(model.parameters())
        if dtype == torch.float32:
            torch._foreach_lerp_(refs, srcs, 1 - DECAY)
        else:
            torch._foreach_mul_(refs, DECAY)
            torch._foreach_add_(refs, srcs, alpha=1 - DECAY)
    bumps = [p._version - v for p, v in zip(ema.parameters(), before)]
    ref_bumps = [p._version - v for p, v in zip(reference.parameters(), ref_before)]
    assert bumps == ref_bumps and all(b >= 1 for b in bumps)
    assert cema._plans[ema].below is not None  # the short path was the one measured


def test_forward_ad_tangents_are_stepped_as_torch_steps_them() -> None:
    """Inside a dual level the autograd kernel steps tangents too: the normal path runs."""
    with fwAD.dual_level():
        results = []
        for use_compatshim in (True, False):
            ema = torch.nn.Module()
            model = torch.nn.Module()
            ema._parameters["w"] = fwAD.make_dual(torch.ones(3), torch.full((3,), 2.0))
            model.w = torch.nn.Parameter(torch.zeros(3))
            if use_compatshim:
                cema.update_ema(ema, model, decay=DECAY)
                assert cema._plans[ema].below is not None  # plain tensors: allowed() refuses
            else:
                with torch.no_grad():
                    torch._foreach_lerp_([ema.w], [model.w], 1 - DECAY)
            primal, tangent = fwAD.unpack_dual(ema.w)
            results.append((primal.clone(), tangent.clone()))
    (ours, our_tangent), (theirs, their_tangent) = results
    assert torch.equal(ours, theirs) and torch.equal(our_tangent, their_tangent)
    assert torch.equal(their_tangent, torch.full((3,), 2.0 * DECAY))  # torch stepped it


def test_the_short_path_is_refused_inside_a_dual_level_and_a_functorch_transform() -> None:
    model, ema = _pair()
    cema.update_ema(ema, model, decay=DECAY)
    below = cema._plans[ema].below
    assert below is not None and below.allowed()
    with fwAD.dual_level():
        assert not below.allowed()
    assert below.allowed()
    seen: list[bool] = []

    def loss(x: torch.Tensor) -> torch.Tensor:
        seen.append(below.allowed())
        return (x * x).sum()

    torch.func.grad(loss)(torch.ones(2))
    assert seen == [False]


class _Record(torch.overrides.TorchFunctionMode):
    """Records, per call, whether autograd was excluded when the handler ran."""

    def __init__(self) -> None:
        super().__init__()
        self.excluded: list[bool] = []

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.excluded.append(_autograd_excluded())
        return func(*args, **(kwargs or {}))


def test_a_torch_function_mode_sees_the_dispatch_state_torch_gives_it() -> None:
    model, ema = _pair()
    cema.update_ema(ema, model, decay=DECAY)
    expected = [
        torch.lerp(e.detach(), s.detach(), 1 - DECAY)
        for e, s in zip(ema.parameters(), model.parameters())
    ]
    with _Record() as mode:
        cema.update_ema(ema, model, decay=DECAY)
    assert mode.excluded and not any(mode.excluded)
    for value, want in zip(ema.parameters(), expected):
        assert torch.equal(value.detach(), want)


class _Traced(torch.nn.Parameter):
    """A Parameter subclass with Python code on the dispatcher's front."""

    excluded: list[bool] = []

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        cls.excluded.append(_autograd_excluded())
        return super().__torch_function__(func, types, args, kwargs or {})


def test_a_torch_function_subclass_keeps_the_normal_path() -> None:
    model, ema = _pair()
    ema.weight = _Traced(ema.weight.detach().clone())
    _Traced.excluded.clear()
    cema.update_ema(ema, model, decay=DECAY)
    assert cema._plans[ema].below is None
    assert _Traced.excluded and not any(_Traced.excluded)
