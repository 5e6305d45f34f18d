"""The cached EMA plan: re-paired on every change that matters, never walked per step.

Each invalidation case (replace, resize, freeze, unfreeze, new optimizer, a
param added to a group) is checked against an fp64 reference of what the EMA
must hold after the next update, so a stale plan cannot pass silently.
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")

import compatshim.ema as cema  # noqa: E402

DECAY = 0.5


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Linear(3, 4)
        self.head = torch.nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.body(x)))


def _setup() -> tuple[torch.nn.Module, torch.nn.Module]:
    torch.manual_seed(0)
    model = Net()
    ema = copy.deepcopy(model)
    with torch.no_grad():
        for p in ema.parameters():
            p.add_(1.0)  # the EMA differs from the model, so every update shows
    return model, ema


def _expected(ema: torch.nn.Module, model: torch.nn.Module, skip: tuple[str, ...] = ()) -> dict:
    """What one update must give: lerp for trainable params, untouched for the rest."""
    sources = dict(model.named_parameters())
    out = {}
    for name, value in ema.named_parameters():
        src = sources[name]
        old = value.detach().double().clone()
        if src.requires_grad and name not in skip:
            out[name] = old * DECAY + src.detach().double() * (1 - DECAY)
        else:
            out[name] = old
    return out


def _check(ema: torch.nn.Module, expected: dict) -> None:
    for name, value in ema.named_parameters():
        assert torch.allclose(value.detach().double(), expected[name], atol=1e-6), name


def _step(ema: torch.nn.Module, model: torch.nn.Module, optimizer: object = None) -> None:
    expected = _expected(ema, model)
    cema.update_ema(ema, model, optimizer, decay=DECAY)
    _check(ema, expected)


def test_steady_state_reuses_the_plan_without_walking_the_model() -> None:
    model, ema = _setup()
    _step(ema, model)
    plan = cema._plans[ema]

    def walk_forbidden(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("update_ema walked the model on a valid plan")

    model.named_parameters = walk_forbidden  # type: ignore[method-assign]
    model.parameters = walk_forbidden  # type: ignore[method-assign]
    ema.named_parameters = walk_forbidden  # type: ignore[method-assign]
    cema.update_ema(ema, model, decay=DECAY)
    assert cema._plans[ema] is plan


@pytest.mark.parametrize("how", ["setattr", "register_parameter"])
def test_replaced_parameter_is_followed(how: str) -> None:
    model, ema = _setup()
    _step(ema, model)
    new = torch.nn.Parameter(torch.full((4, 3), 9.0))
    if how == "setattr":
        model.body.weight = new
    else:
        model.body.register_parameter("weight", new)
    _step(ema, model)  # the EMA moves towards 9.0, not towards the orphaned weight


def test_replaced_submodule_is_followed() -> None:
    model, ema = _setup()
    _step(ema, model)
    model.head = torch.nn.Linear(4, 2)
    _step(ema, model)


def test_data_swap_of_same_shape_is_followed() -> None:
    model, ema = _setup()
    _step(ema, model)
    model.body.weight.data = torch.full((4, 3), -3.0)
    _step(ema, model)


def test_resized_source_raises_naming_it() -> None:
    model, ema = _setup()
    _step(ema, model)
    before = {n: p.detach().clone() for n, p in ema.named_parameters()}
    model.body.weight.data = torch.zeros(6, 3)  # bigger
    with pytest.raises(cema.EmaMismatchError, match=r"body\.weight"):
        cema.update_ema(ema, model, decay=DECAY)
    assert torch.equal(ema.body.weight, before["body.weight"])  # never a wrong EMA


def test_resized_later_source_raises_naming_it_and_the_partial_step() -> None:
    model, ema = _setup()
    _step(ema, model)
    model.head.weight.data = torch.zeros(3, 4)
    with pytest.raises(cema.EmaMismatchError, match=r"head\.weight.*stepped only some pairs"):
        cema.update_ema(ema, model, decay=DECAY)


def test_an_ema_on_another_device_is_refused_naming_it_before_any_step() -> None:
    # meta stands in for an EMA kept on the CPU beside a CUDA model (timm's device="cpu"):
    # torch's foreach refused it with a RuntimeError naming no parameter
    model, ema = _setup()
    with pytest.raises(cema.EmaMismatchError, match=r"'body\.weight' is on meta but the model's"):
        cema.update_ema(copy.deepcopy(ema).to("meta"), model, decay=DECAY)
    before = {n: p.detach().clone() for n, p in ema.named_parameters()}
    with pytest.raises(cema.EmaMismatchError, match=r"'body\.weight' is on cpu but the model's"):
        cema.update_ema(ema, copy.deepcopy(model).to("meta"), decay=DECAY)
    assert all(torch.equal(p, before[n]) for n, p in ema.named_parameters())
    model, ema = torch.nn.BatchNorm1d(2), torch.nn.BatchNorm1d(2)
    ema.running_mean = torch.zeros(2, device="meta")
    with pytest.raises(cema.EmaMismatchError, match=r"buffer 'running_mean' is on meta"):
        cema.update_ema(ema, model, decay=DECAY)


def test_an_ema_made_under_inference_mode_is_refused_saying_so() -> None:
    # torch refuses in-place updates of inference tensors outside inference_mode: the retry
    # path called that "a parameter changed shape, dtype or device ... stepped only some pairs"
    model, _ = _setup()
    with torch.inference_mode():
        ema = Net()
    before = {n: p.clone() for n, p in ema.named_parameters()}
    with pytest.raises(cema.EmaMismatchError, match=r"'body\.weight' is an inference tensor"):
        cema.update_ema(ema, model, decay=DECAY)
    assert all(torch.equal(p, before[n]) for n, p in ema.named_parameters())
    with torch.inference_mode():
        cema.update_ema(ema, model, decay=DECAY)  # allowed in there: the plan is made there
    # the cached plan, outside: torch refuses after writing the first tensor, and says so
    with pytest.raises(cema.EmaMismatchError, match=r"inference tensor.*stepped only some pairs"):
        cema.update_ema(ema, model, decay=DECAY)
    model, ema = torch.nn.BatchNorm1d(2), torch.nn.BatchNorm1d(2)
    with torch.inference_mode():
        ema.num_batches_tracked = torch.tensor(0)
    with pytest.raises(cema.EmaMismatchError, match="buffer 'num_batches_tracked' is an infer"):
        cema.update_ema(ema, model, decay=DECAY)


def test_resized_source_of_a_mixed_dtype_pair_leaves_the_later_pairs_unstepped() -> None:
    # an fp32 EMA of a bf16 model: _foreach_mul_ scaled every EMA tensor, then _foreach_add_
    # stopped at the resized one; from there on the EMA held decay * its value, silently
    model, ema = _setup()
    model.to(torch.bfloat16)
    _step(ema, model)
    before = {n: p.detach().clone() for n, p in ema.named_parameters()}
    model.head.weight.data = torch.zeros(3, 4, dtype=torch.bfloat16)
    with pytest.raises(cema.EmaMismatchError, match=r"head\.weight.*stepped only some pairs"):
        cema.update_ema(ema, model, decay=DECAY)
    for name in ("head.weight", "head.bias"):  # the resized pair and the one after it
        assert torch.equal(ema.get_parameter(name), before[name]), name
    assert not torch.equal(ema.body.weight, before["body.weight"])  # stepped before it


def test_resized_on_both_sides_uses_the_new_layout() -> None:
    model, ema = _setup()
    _step(ema, model)
    model.body.weight.data = torch.ones(6, 3)
    ema.body.weight.data = torch.zeros(6, 3)
    _step(ema, model)


def test_whole_model_dtype_change_is_re_paired_and_stepped_once() -> None:
    model, ema = _setup()
    _step(ema, model)
    model.double()  # every pair now fp32 EMA <- fp64 source: re-paired as mixed
    _step(ema, model)
    assert cema._plans[ema].mixed_ema and not cema._plans[ema].same_ema
    _step(ema, model)


def test_partial_dtype_change_is_an_error_that_says_so() -> None:
    model, ema = _setup()
    _step(ema, model)
    model.head.weight.data = model.head.weight.data.double()  # a later pair only
    with pytest.raises(cema.EmaMismatchError, match="stepped only some pairs"):
        cema.update_ema(ema, model, decay=DECAY)
    _step(ema, model)  # the next call uses the new pairing


class Tied(torch.nn.Module):
    def __init__(self, tie: bool = True) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(5, 3)
        self.head = torch.nn.Linear(3, 5, bias=False)
        if tie:
            self.head.weight = self.embed.weight


def test_tied_weights_step_every_ema_tensor_once() -> None:
    torch.manual_seed(0)
    model = Tied()
    tied = copy.deepcopy(model)  # tied as the model is
    apart = Tied(tie=False)  # the same values, held apart (named_parameters lists one name)
    apart.load_state_dict(model.state_dict())
    with torch.no_grad():
        model.embed.weight.add_(1.0)
    want = tied.embed.weight.detach() * DECAY + model.embed.weight.detach() * (1 - DECAY)
    cema.update_ema(tied, model, decay=DECAY)
    cema.update_ema(apart, model, decay=DECAY)
    assert torch.allclose(tied.head.weight, want)  # stepped once, not twice
    assert torch.allclose(apart.embed.weight, want)
    assert torch.allclose(apart.head.weight, want)  # was left at its first value, silently
    with pytest.raises(cema.EmaMismatchError, match=r"'embed\.weight' and 'head\.weight' are one"):
        cema.update_ema(copy.deepcopy(model), Tied(tie=False), decay=DECAY)


def test_excluding_one_name_of_a_tied_tensor_warns_naming_the_other() -> None:
    # with every tied name paired (d8d979b), excluding head.weight alone changed nothing, silently
    model = Tied()
    with pytest.warns(cema.EmaWarning, match=r"'head\.weight', one tensor with 'embed\.weight'"):
        cema.update_ema(copy.deepcopy(model), model, decay=DECAY, exclude=("head.weight",))


class SharedBuffer(torch.nn.Module):
    """One persistent buffer registered by two modules (a running statistic both read)."""

    def __init__(self, share: bool = True) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Module(), torch.nn.Module()
        self.a.register_buffer("stat", torch.zeros(3))
        self.b.register_buffer("stat", self.a.stat if share else torch.zeros(3))


def test_a_shared_buffer_steps_every_ema_copy_once() -> None:
    # persistent_buffers paired a buffer shared by two modules once, under its first name: an
    # EMA holding it apart (built and load_state_dict-ed) left b.stat at its first value
    model = SharedBuffer()
    shared = copy.deepcopy(model)  # shares it as the model does
    apart = SharedBuffer(share=False)
    model.a.stat.add_(1.0)
    cema.update_ema(shared, model, decay=DECAY)
    cema.update_ema(apart, model, decay=DECAY)
    want = torch.full((3,), 1.0 - DECAY)
    assert torch.equal(shared.b.stat, want)  # stepped once, not twice
    assert torch.equal(apart.a.stat, want)
    assert torch.equal(apart.b.stat, want)
    with pytest.raises(cema.EmaMismatchError, match=r"buffers 'a\.stat' and 'b\.stat' are one"):
        cema.update_ema(copy.deepcopy(model), SharedBuffer(share=False), decay=DECAY)
    with pytest.warns(cema.EmaWarning, match=r"'b\.stat', one tensor with 'a\.stat'"):
        cema.update_ema(copy.deepcopy(model), model, decay=DECAY, exclude=("b.stat",))


@pytest.mark.parametrize("buffers", ["average", "copy"])
def test_a_float_buffer_into_an_integer_ema_buffer_is_an_error(buffers: str) -> None:
    # the copy truncated 0.75 to 0 silently
    model, ema = SharedBuffer(share=False), SharedBuffer(share=False)
    ema.a.stat = ema.a.stat.long()
    model.a.stat.fill_(0.75)
    with pytest.raises(
        cema.EmaMismatchError, match=r"'a\.stat' is torch\.int64 but the model's is torch\.float32"
    ):
        cema.update_ema(ema, model, decay=DECAY, buffers=buffers)
    model.a.stat = model.a.stat.long()  # integer into float stays exact, as before
    cema.update_ema(SharedBuffer(share=False), model, decay=DECAY, buffers=buffers)


def test_frozen_parameter_is_left_alone() -> None:
    model, ema = _setup()
    _step(ema, model)
    model.body.weight.requires_grad_(False)
    _step(ema, model)  # _expected keeps frozen params unchanged


def test_unfrozen_parameter_is_updated() -> None:
    model, ema = _setup()
    model.head.bias.requires_grad_(False)
    _step(ema, model)
    model.head.bias.requires_grad_(True)
    _step(ema, model)


def test_unfrozen_parameter_missing_from_the_ema_raises() -> None:
    model, _ = _setup()
    model.extra = torch.nn.Parameter(torch.zeros(2), requires_grad=False)
    ema = copy.deepcopy(model)
    del ema.extra
    _step(ema, model)
    model.extra.requires_grad_(True)
    with pytest.raises(cema.EmaMismatchError, match="extra"):
        cema.update_ema(ema, model, decay=DECAY)


def test_new_optimizer_object_rebuilds_the_plan() -> None:
    model, ema = _setup()
    first = torch.optim.SGD(model.parameters(), lr=0.1)
    _step(ema, model, first)
    plan = cema._plans[ema]
    _step(ema, model, first)
    assert cema._plans[ema] is plan
    second = torch.optim.AdamW(model.parameters())
    _step(ema, model, second)
    assert cema._plans[ema] is not plan


@pytest.mark.parametrize("how", ["add_param_group", "append"])
def test_param_added_to_the_optimizer_rebuilds_the_plan(how: str) -> None:
    model, ema = _setup()
    optimizer = torch.optim.SGD(model.body.parameters(), lr=0.1)
    _step(ema, model, optimizer)
    plan = cema._plans[ema]
    if how == "add_param_group":
        optimizer.add_param_group({"params": list(model.head.parameters())})
    else:
        optimizer.param_groups[0]["params"].append(model.head.weight)
    _step(ema, model, optimizer)
    assert cema._plans[ema] is not plan


def test_exclude_change_rebuilds_the_plan() -> None:
    model, ema = _setup()
    cema.update_ema(ema, model, decay=DECAY, exclude=["head.*"])
    before = ema.head.weight.detach().clone()
    expected = _expected(ema, model, skip=("head.weight", "head.bias"))
    cema.update_ema(ema, model, decay=DECAY, exclude=("head.*",))
    _check(ema, expected)
    assert torch.equal(ema.head.weight, before)
    _step(ema, model)


def test_update_is_not_recorded_by_autograd_and_restores_grad_mode() -> None:
    model, ema = _setup()
    assert torch.is_grad_enabled()
    _step(ema, model)
    assert torch.is_grad_enabled()
    assert all(p.grad_fn is None and p.is_leaf for p in ema.parameters())
    with torch.no_grad():
        _step(ema, model)
        assert not torch.is_grad_enabled()


@pytest.mark.gpu
def test_update_ema_is_capturable_in_a_cuda_graph() -> None:
    """After one call outside capture (it pairs), a captured call replays the same step."""
    model, ema = _setup()
    model.cuda()
    ema.cuda()
    cema.update_ema(ema, model, decay=DECAY)  # pairs (and warms up) outside the capture
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        cema.update_ema(ema, model, decay=DECAY)  # warm-up on a side stream, as torch advises
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        cema.update_ema(ema, model, decay=DECAY)
    for _ in range(3):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.25)  # the model trains between replays
        expected = _expected(ema, model)
        graph.replay()
        torch.cuda.synchronize()
        _check(ema, {n: v.cuda() for n, v in expected.items()})
