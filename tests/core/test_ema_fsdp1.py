"""FSDP1 (``use_orig_params=True``) on 2 gloo ranks with a full-copy EMA (issue 39 item 5).

Each rank of an FSDP1 model holds a flat slice of every parameter, so a full-size EMA
cannot be paired with it. Before this change the error said "pass the ZeRO optimizer"
(wrong: there is none); it now says to wrap the EMA in FSDP1 as the model is, and
that setup is checked to work: each rank averages its slices, and the gathered EMA
equals an fp64 reference of the full parameters.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from tests.harness.dist import run_ranks  # noqa: E402

DECAY = 0.5


def _net() -> Any:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Tanh(), torch.nn.Linear(4, 3))


def _fsdp1_runs_on_cpu() -> bool:
    """FSDP1's lazy init (summon_full_params, forward) builds CUDA streams on torch 2.1
    ("Stream() takes no arguments" without CUDA); 2.2 and later run it on CPU."""
    from packaging.version import Version

    return torch.cuda.is_available() or Version(torch.__version__.split("+")[0]) >= Version("2.2")


def fsdp1_full_and_wrapped_ema(rank: int, world_size: int) -> dict[str, Any]:
    """The full-copy EMA's error, then an EMA wrapped in FSDP1 like the model, stepped 3 times
    (params shifted in place: FSDP1's CPU forward needs torch 2.4+) against an fp64 reference."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    import compatshim.ema as cema
    from compatshim.ema.names import canonical

    out: dict[str, Any] = {}
    cpu = torch.device("cpu")
    model = FSDP(_net(), use_orig_params=True, device_id=cpu)
    out["local_shapes"] = [tuple(p.shape) for p in model.parameters()]
    try:
        cema.update_ema(_net(), model, decay=DECAY)
        out["full_error"] = None
    except cema.EmaMismatchError as exc:
        out["full_error"] = str(exc)
    if not _fsdp1_runs_on_cpu():
        out["wrapped_error"] = None
        return out
    ema = FSDP(copy.deepcopy(_net()), use_orig_params=True, device_id=cpu)
    with FSDP.summon_full_params(model):
        ref = {canonical(n): p.detach().double().clone() for n, p in model.named_parameters()}
    gen = torch.Generator().manual_seed(1)
    for _ in range(3):
        with FSDP.summon_full_params(model, writeback=True), torch.no_grad():
            for n, p in model.named_parameters():
                p.add_(torch.randn(p.shape, generator=gen))
                ref[canonical(n)].mul_(DECAY).add_(p.detach().double(), alpha=1 - DECAY)
        cema.update_ema(ema, model, decay=DECAY)
    with FSDP.summon_full_params(ema):
        out["wrapped_error"] = max(
            float((p.detach().double() - ref[canonical(n)]).abs().max())
            for n, p in ema.named_parameters()
        )
    return out


@pytest.mark.timeout(240)
def test_fsdp1_full_ema_says_wrap_the_ema_and_wrapped_ema_works() -> None:
    results = run_ranks(fsdp1_full_and_wrapped_ema, 2, timeout=180)
    shapes = {tuple(r["local_shapes"]) for r in results}
    assert len(shapes) == 2, shapes  # the ranks hold different slices: a real sharding
    errors = [r["full_error"] for r in results if r["full_error"] is not None]
    assert errors, "a full-copy EMA of an FSDP1 model paired on every rank"
    for message in errors:
        assert "wrap the EMA in FSDP1 as the model is" in message
        assert "ZeRO" not in message
    if not _fsdp1_runs_on_cpu():
        pytest.skip(
            f"the wrapped EMA's check: FSDP1 needs CUDA streams on torch {torch.__version__}"
        )
    for r in results:
        assert r["wrapped_error"] < 1e-6
