"""``update_ema``'s buffer policy: an evaluated EMA of a BatchNorm model is what timm/torch give.

The default (``buffers="average"``) is compared with timm's ``ModelEmaV3`` (when
timm is installed: the zoo-mm envs) and torch's ``AveragedModel`` with
``get_ema_multi_avg_fn`` and ``use_buffers=True``; ``"copy"`` with
``ModelEmaV3(exclude_buffers=True)`` and ``AveragedModel(use_buffers=False)``;
``"skip"`` keeps the old parameters-only behaviour. The comparison is on the
EMA's eval-mode output, which reads the running statistics, after training in
train mode (the statistics move every step). Also: argument errors name the
argument, and the one warning ``update_ema`` issues points at the caller's line.
"""

from __future__ import annotations

import copy
import re
import sys
import warnings
from typing import Any, Callable

import pytest

torch = pytest.importorskip("torch")

import compatshim.ema as cema  # noqa: E402
from tests.harness.dist import run_ranks  # noqa: E402

from .ema_workers import zero_batchnorm_ema  # noqa: E402

DECAY = 0.8
STEPS = 12


class BNNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Linear(6, 5)
        self.bn = torch.nn.BatchNorm1d(5)
        self.head = torch.nn.Linear(5, 3)
        self.bn_head = torch.nn.BatchNorm1d(3, momentum=None)  # cumulative: reads the counter
        self.register_buffer("cache", torch.zeros(2), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn_head(self.head(torch.tanh(self.bn(self.body(x)))))


def _batches(steps: int = STEPS) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    return [torch.randn(16, 6, generator=gen) * 2 + 1 for _ in range(steps)]


def _train(model: torch.nn.Module, after_step: Callable[[], None], steps: int = STEPS) -> None:
    """SGD in train mode (BatchNorm statistics move every step), ``after_step`` after each."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
    model.train()
    for x in _batches(steps):
        model(x).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        after_step()


def _eval_out(module: torch.nn.Module) -> torch.Tensor:
    module.eval()
    with torch.no_grad():
        return module(torch.linspace(-2, 2, 48).reshape(8, 6))


def _averaged(model: torch.nn.Module, use_buffers: bool) -> Any:
    from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

    averaged = AveragedModel(
        model, multi_avg_fn=get_ema_multi_avg_fn(DECAY), use_buffers=use_buffers
    )
    averaged.update_parameters(model)  # its first update copies, as a fresh deepcopy is
    return averaged


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(torch.allclose(a.double(), b.double(), rtol=0, atol=1e-6))


def _fresh() -> tuple[BNNet, BNNet]:
    torch.manual_seed(0)
    model = BNNet()
    return model, copy.deepcopy(model)


def test_default_averages_buffers_as_averaged_model_use_buffers() -> None:
    model, ema = _fresh()
    averaged = _averaged(model, use_buffers=True)

    def step() -> None:
        cema.update_ema(ema, model, decay=DECAY)
        averaged.update_parameters(model)

    _train(model, step)
    assert not torch.equal(ema.bn.running_mean, torch.zeros(5))  # trained statistics
    for name in ("bn.running_mean", "bn.running_var", "bn_head.running_mean"):
        got, want = ema.get_buffer(name), averaged.module.get_buffer(name)
        assert _close(got, want), name
        assert not _close(got, model.get_buffer(name)), name  # averaged, not copied
    # integer counters are copied (AveragedModel averages them and truncates)
    assert int(ema.bn.num_batches_tracked) == STEPS == int(model.bn.num_batches_tracked)
    assert _close(_eval_out(ema), _eval_out(averaged.module))


def test_copy_copies_buffers_as_averaged_model_without_use_buffers() -> None:
    model, ema = _fresh()
    averaged = _averaged(model, use_buffers=False)

    def step() -> None:
        cema.update_ema(ema, model, decay=DECAY, buffers="copy")
        averaged.update_parameters(model)

    _train(model, step)
    for name, value in model.named_buffers():
        if name != "cache":
            assert torch.equal(ema.get_buffer(name), value), name
    assert _close(_eval_out(ema), _eval_out(averaged.module))


def test_skip_is_the_old_parameters_only_behaviour() -> None:
    model, ema = _fresh()
    _train(model, lambda: cema.update_ema(ema, model, decay=DECAY, buffers="skip"))
    fresh = BNNet()
    for name, value in fresh.named_buffers():
        assert torch.equal(ema.get_buffer(name), value), name
    assert not torch.equal(ema.body.weight, fresh.body.weight)


@pytest.mark.parametrize("policy", ["average", "copy"])
def test_matches_timm_model_ema_v3(policy: str) -> None:
    """Every state_dict entry and the eval output equal timm's ModelEmaV3 (the zoo-mm envs)."""
    timm_utils = pytest.importorskip("timm.utils")
    model, ema = _fresh()
    reference = timm_utils.ModelEmaV3(model, decay=DECAY, exclude_buffers=policy == "copy")

    def step() -> None:
        cema.update_ema(ema, model, decay=DECAY, buffers=policy)  # type: ignore[arg-type]
        reference.update(model)

    _train(model, step)
    theirs = reference.module.state_dict()
    for name, value in ema.state_dict().items():
        assert _close(value, theirs[name]), name
    assert _close(_eval_out(ema), _eval_out(reference.module))


def test_mixed_dtype_buffers_follow_the_fp32_ema() -> None:
    """A bf16 model with an fp32 EMA: buffers take the mul/add path, against fp64."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3)).to(torch.bfloat16)
    ema = copy.deepcopy(model).float()
    ref = {n: b.double().clone() for n, b in ema.named_buffers() if b.is_floating_point()}
    gen = torch.Generator().manual_seed(1)
    for _ in range(5):
        model(torch.randn(8, 4, generator=gen).to(torch.bfloat16))
        cema.update_ema(ema, model, decay=DECAY)
        for name, value in model.named_buffers():
            if name in ref:
                ref[name].mul_(DECAY).add_(value.double(), alpha=1 - DECAY)
    for name, want in ref.items():
        assert ema.get_buffer(name).dtype == torch.float32
        assert _close(ema.get_buffer(name), want), name
    assert int(ema[1].num_batches_tracked) == 5


def test_buffers_replaced_by_module_to_are_followed() -> None:
    """``.half().float()`` puts new buffer tensors in place without any hook: re-paired."""
    model, ema = _fresh()
    cema.update_ema(ema, model, decay=DECAY)
    model.half().float()  # params keep their objects, buffers are new tensors
    with torch.no_grad():
        model.bn.running_mean.fill_(4.0)
    before = ema.bn.running_mean.clone()
    cema.update_ema(ema, model, decay=DECAY)
    assert _close(ema.bn.running_mean, before * DECAY + 4.0 * (1 - DECAY))
    model.bn.running_var = torch.full((5,), 9.0)  # setattr: also a new tensor
    before = ema.bn.running_var.clone()
    cema.update_ema(ema, model, decay=DECAY)
    assert _close(ema.bn.running_var, before * DECAY + 9.0 * (1 - DECAY))


def test_buffer_slots_written_directly_are_followed_on_both_models() -> None:
    """``module._buffers[k] = t`` runs no hook (``torch.func.functional_call``, accelerate's
    ``set_module_tensor_to_device`` write slots so): only the per-call identity check of each
    paired slot sees it. Pins what a hook-based O(1) check would miss (``guard``'s docstring)."""
    model, ema = _fresh()
    cema.update_ema(ema, model, decay=DECAY)
    model.bn._buffers["running_mean"] = torch.full((5,), 4.0)
    model.bn._buffers["num_batches_tracked"] = torch.tensor(77)
    before = ema.bn.running_mean.clone()
    cema.update_ema(ema, model, decay=DECAY)
    assert _close(ema.bn.running_mean, before * DECAY + 4.0 * (1 - DECAY))
    assert int(ema.bn.num_batches_tracked) == 77
    ema.bn._buffers["running_var"] = torch.full((5,), 2.0)  # the EMA's own slot
    cema.update_ema(ema, model, decay=DECAY)
    assert _close(ema.bn.running_var, 2.0 * DECAY + model.bn.running_var * (1 - DECAY))


def test_ema_buffers_replaced_by_module_to_are_the_ones_stepped() -> None:
    """``ema.half().float()`` gives the EMA new buffer tensors: those are stepped, not the
    orphans the plan held."""
    model, ema = _fresh()
    cema.update_ema(ema, model, decay=DECAY)
    orphan = ema.bn.running_mean
    ema.half().float()
    assert ema.bn.running_mean is not orphan
    with torch.no_grad():
        model.bn.running_mean.fill_(3.0)
    before = ema.bn.running_mean.clone()
    cema.update_ema(ema, model, decay=DECAY)
    assert _close(ema.bn.running_mean, before * DECAY + 3.0 * (1 - DECAY))


def test_buffer_resized_by_a_direct_write_is_an_error_naming_it() -> None:
    model, ema = _fresh()
    cema.update_ema(ema, model, decay=DECAY)
    model.bn._buffers["running_mean"] = torch.zeros(7)
    before = ema.bn.running_mean.clone()
    with pytest.raises(cema.EmaMismatchError, match=r"buffer 'bn\.running_mean'.*\(7,\)"):
        cema.update_ema(ema, model, decay=DECAY)
    assert torch.equal(ema.bn.running_mean, before)  # nothing stepped


def test_steady_state_with_buffers_does_not_walk_the_model() -> None:
    model, ema = _fresh()
    cema.update_ema(ema, model, decay=DECAY)
    plan = cema._plans[ema]
    assert len(plan.copy_ema) == 2  # the two counters; float buffers joined the lerp

    def walk_forbidden(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("update_ema walked the model on a valid plan")

    for module in (model, ema):
        module.named_modules = walk_forbidden  # type: ignore[method-assign]
        module.named_parameters = walk_forbidden  # type: ignore[method-assign]
    cema.update_ema(ema, model, decay=DECAY)
    assert cema._plans[ema] is plan


def test_non_persistent_and_excluded_buffers_are_left_alone() -> None:
    model, ema = _fresh()
    model.cache = torch.ones(7)  # a cache resized by the model: not paired, no error
    _train(model, lambda: cema.update_ema(ema, model, decay=DECAY, exclude=("bn.running_*",)))
    assert torch.equal(ema.cache, torch.zeros(2))
    assert torch.equal(ema.bn.running_mean, torch.zeros(5))
    assert torch.equal(ema.bn.running_var, torch.ones(5))
    assert int(ema.bn.num_batches_tracked) == STEPS  # not matched by the pattern
    assert not torch.equal(ema.bn_head.running_mean, torch.zeros(3))


def test_buffer_mismatch_names_the_buffer_and_the_way_out() -> None:
    model = BNNet()
    ema = BNNet()
    ema.bn = torch.nn.BatchNorm1d(5, track_running_stats=False)  # no running stats
    with pytest.raises(cema.EmaMismatchError, match=r"no buffer 'bn\.running_mean'.*'skip'"):
        cema.update_ema(ema, model)
    cema.update_ema(ema, model, buffers="skip")
    ema = BNNet()
    ema.bn_head.running_mean = torch.zeros(4)
    with pytest.raises(cema.EmaMismatchError, match=r"buffer 'bn_head\.running_mean'.*\(4,\)"):
        cema.update_ema(ema, model)


def test_compiled_source_pairs_buffers_by_name() -> None:
    model, ema = _fresh()
    compiled = torch.compile(model)  # names gain "_orig_mod."; run eager below
    averaged = _averaged(model, use_buffers=True)

    def step() -> None:
        cema.update_ema(ema, compiled, decay=DECAY)
        averaged.update_parameters(model)

    _train(model, step, steps=4)
    assert _close(_eval_out(ema), _eval_out(averaged.module))


# --- argument errors (issue 38 item 5) ---------------------------------------------------------


Call = Callable[[Any, Any, Any], object]
U, SHARD, GATHER = cema.update_ema, cema.shard_ema, cema.gather_sharded_ema
# (call on (ema, model, optimizer), error type, the message's words, literally)
BAD_CALLS: dict[str, tuple[Call, type[Exception], str]] = {
    "ema None": (
        lambda e, m, o: U(None, m),
        TypeError,
        "ema_model must be a torch.nn.Module, got NoneType",
    ),
    "model None": (
        lambda e, m, o: U(e, None),
        TypeError,
        "model must be a torch.nn.Module, got NoneType",
    ),
    "ema dict": (
        lambda e, m, o: U({}, m),
        TypeError,
        "ema_model must be a torch.nn.Module, got dict",
    ),
    "same": (lambda e, m, o: U(m, m), ValueError, "ema_model is model itself"),
    "decay str": (
        lambda e, m, o: U(e, m, decay="x"),
        TypeError,
        "decay must be a real number in [0, 1], got str 'x'",
    ),
    "decay bool": (lambda e, m, o: U(e, m, decay=True), TypeError, "decay must be a real number"),
    "decay None": (lambda e, m, o: U(e, m, decay=None), TypeError, "decay must be a real number"),
    "decay nan": (
        lambda e, m, o: U(e, m, decay=float("nan")),
        ValueError,
        "decay must be in [0, 1]",
    ),
    "decay 1.5": (
        lambda e, m, o: U(e, m, decay=1.5),
        ValueError,
        "decay must be in [0, 1], got 1.5",
    ),
    "decay 2 tensor": (lambda e, m, o: U(e, m, decay=torch.ones(2)), TypeError, "decay must be"),
    "exclude str": (
        lambda e, m, o: U(e, m, exclude="pos_embed"),
        TypeError,
        "letter by letter); pass ('pos_embed',)",
    ),
    "exclude int item": (
        lambda e, m, o: U(e, m, exclude=[3]),
        TypeError,
        "each exclude entry must be a str (a name or fnmatch pattern), got int 3",
    ),
    "exclude int": (
        lambda e, m, o: U(e, m, exclude=5),
        TypeError,
        "exclude must be an iterable of names or patterns, got int",
    ),
    "sharded str": (
        lambda e, m, o: U(e, m, sharded="yes"),
        TypeError,
        "sharded must be a bool, got str",
    ),
    "buffers typo": (
        lambda e, m, o: U(e, m, buffers="avg"),
        ValueError,
        "buffers must be one of 'average', 'copy', 'skip', got 'avg'",
    ),
    "buffers None": (lambda e, m, o: U(e, m, buffers=None), TypeError, "buffers must be one of"),
    "decay in the optimizer's place": (  # was UnknownLayoutError on builtins.float
        lambda e, m, o: U(e, m, 0.999),
        TypeError,
        "optimizer must be the optimizer (or None), got 0.999; pass the decay by name: "
        "update_ema(ema, model, decay=0.999)",
    ),
    "shard ema None": (
        lambda e, m, o: SHARD(None, m, o),
        TypeError,
        "shard_ema: ema_model must be a torch.nn.Module",
    ),
    "shard no optimizer": (
        lambda e, m, o: SHARD(e, m, None),
        TypeError,
        "shard_ema: optimizer must be",
    ),
    "shard exclude str": (
        lambda e, m, o: SHARD(e, m, o, exclude="w"),
        TypeError,
        "shard_ema: exclude must be",
    ),
    "gather model int": (
        lambda e, m, o: GATHER(e, 3, o),
        TypeError,
        "gather_sharded_ema: model must be a torch.nn.Module, got int",
    ),
}


@pytest.mark.parametrize("case", BAD_CALLS)
def test_bad_arguments_raise_typed_errors_naming_them(case: str) -> None:
    call, kind, message = BAD_CALLS[case]
    model, ema = _fresh()
    with pytest.raises(kind, match=re.escape(message)):
        call(ema, model, torch.optim.SGD(model.parameters(), lr=0.1))


def test_bad_arguments_are_refused_with_a_plan_in_place() -> None:
    """A valid plan is no way around the checks (they run on the cold path only)."""
    model, ema = _fresh()
    cema.update_ema(ema, model, decay=DECAY)
    with pytest.raises(TypeError, match=r"model must be a torch\.nn\.Module"):
        cema.update_ema(ema, None)
    with pytest.raises(TypeError, match="sharded must be a bool"):
        cema.update_ema(ema, model, sharded="yes")
    with pytest.raises(ValueError, match="buffers must be one of"):
        cema.update_ema(ema, model, buffers="mean")
    with pytest.raises(TypeError, match="letter by letter"):
        cema.update_ema(ema, model, exclude="bn")


def test_numbers_torch_accepts_stay_accepted() -> None:
    np = pytest.importorskip("numpy")
    model, ema = _fresh()
    for decay in (1, 0, np.float32(0.5), np.float64(0.5), torch.tensor(0.5)):
        cema.update_ema(ema, model, decay=decay)  # type: ignore[arg-type]
    cema.update_ema(ema, model, None, 0.5, False, ["bn.*"])  # positional, a list


def test_unmatched_exclude_warns_at_the_callers_line() -> None:
    model, ema = _fresh()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = sys._getframe().f_lineno + 1
        cema.update_ema(ema, model, decay=DECAY, exclude=("pos_embd", "bn.*"))
    [warning] = [w for w in caught if issubclass(w.category, cema.EmaWarning)]
    assert "['pos_embd']" in str(warning.message)
    assert warning.filename == __file__
    assert warning.lineno == line
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cema.update_ema(ema, model, decay=DECAY, exclude=("bn.running_mean", "head.*"))


@pytest.mark.dist
def test_sharded_masters_with_batchnorm_over_two_gloo_ranks() -> None:
    """ZeRO-sharded fp32 masters (full-size and sharded EMA), BatchNorm buffers per rank."""
    results = run_ranks(zero_batchnorm_ema, 2, timeout=180)
    for result in results:
        assert result["sharded_shapes"]["0.weight"] == (10,)  # a 4x5 weight, halved
        assert result["sharded_shapes"]["0.bias"] == (2,)
        assert result["full_param_err"] < 1e-6 and result["sharded_param_err"] < 1e-6
        assert result["full_buffer_err"] < 1e-6 and result["sharded_buffer_err"] < 1e-6
        assert result["counter"] == [4, 4]
        assert result["gathered_buffers_equal"]
        for error in result["master_device_errors"]:  # a torch device error before, unnamed
            assert "'0.weight' is on meta but its fp32 master (the ZeRO optimizer's)" in error
    # no SyncBatchNorm: each rank's statistics are its own data's
    assert results[0]["running_mean"] != results[1]["running_mean"]
