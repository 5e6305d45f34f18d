"""Optimizer state saved under torch 2.4.1 resumes under the running torch (issue 25 item 3).

The fixtures were written by ``python -m tests.dcpresume.optim_job
tests/dcpresume/fixtures/torch2.4.1`` in the ``dcpresume-torch2.4`` env: AdamW
and Adam after two steps, as ``torch.save`` and as DCP folders (nested and
flattened optimizer state), and the parameters one uninterrupted step later.
Under torch 2.15 a plain ``load_state_dict`` needs nothing, and every DCP load
fails (``Missing key in checkpoint state_dict: ...decoupled_weight_decay``)
until ``compatshim.optim.load_dcp``.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed.checkpoint.state_dict")  # torch >= 2.2

import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint.state_dict import (  # noqa: E402
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)

from compatshim.optim import OptimizerStateError, adapt_state_dict, load_dcp  # noqa: E402
from tests.dcpresume.optim_job import OPTIMIZERS, SAVED, build, step  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures" / "torch2.4.1"
FORMS = {"dcp-nested": False, "dcp-flat": True}
# torch releases whose Adam/AdamW param groups hold a key 2.4.1's lack (2.7 added one)
NEWER_KEYS = "decoupled_weight_decay" in torch.optim.AdamW([torch.zeros(1)]).defaults


def _resume_and_step(name: str, model: Any, optimizer: Any) -> None:
    step(model, optimizer, SAVED)
    want = torch.load(FIXTURES / name / "next.pt", weights_only=True)
    got = model.state_dict()
    for key in want:  # the next step equals the uninterrupted run under the old torch
        torch.testing.assert_close(got[key], want[key], rtol=1e-6, atol=1e-7)


def _template(model: Any, optimizer: Any, flat: bool) -> tuple[dict[str, Any], Any]:
    options = StateDictOptions(flatten_optimizer_state_dict=flat)
    model_sd, optim_sd = get_state_dict(model, optimizer, options=options)
    return {"model": model_sd, "optim": optim_sd}, options


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_plain_load_state_dict_needs_nothing(name: str) -> None:
    model, optimizer = build(name)
    saved = torch.load(FIXTURES / name / "plain.pt", weights_only=True)
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optim"])
    _resume_and_step(name, model, optimizer)


@pytest.mark.skipif(not NEWER_KEYS, reason="this torch has 2.4.1's param-group keys")
@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_a_plain_dcp_load_of_the_old_state_fails(name: str, form: str) -> None:
    """The reported failure (pytorch 146157, torchtitan 886), nested and flattened alike."""
    model, optimizer = build(name)
    state, _ = _template(model, optimizer, FORMS[form])
    with pytest.raises(BaseException, match=r"Missing key in checkpoint.*decoupled_weight_decay"):
        dcp.load(state, checkpoint_id=FIXTURES / name / form)


@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_load_dcp_resumes_the_old_state(name: str, form: str) -> None:
    model, optimizer = build(name)
    state, options = _template(model, optimizer, FORMS[form])
    filled = load_dcp(state, {"optim": optimizer}, checkpoint_id=FIXTURES / name / form)
    if NEWER_KEYS:
        assert filled and all(p.endswith(".decoupled_weight_decay") for p in filled), filled
    else:
        assert filled == ()
    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optim"], options=options)
    group = optimizer.param_groups[0]
    assert group.get("decoupled_weight_decay", name == "adamw") is (name == "adamw")
    assert {float(s["step"]) for s in optimizer.state.values()} == {float(SAVED)}
    _resume_and_step(name, model, optimizer)


def test_a_key_no_release_added_still_fails_naming_it(tmp_path: Path) -> None:
    model, optimizer = build("adamw")
    state, _ = _template(model, optimizer, False)
    state["model"]["extra.weight"] = torch.zeros(1)
    with pytest.raises(BaseException, match=r"Missing key in checkpoint.*extra\.weight"):
        load_dcp(state, {"optim": optimizer}, checkpoint_id=FIXTURES / "adamw" / "dcp-nested")


def _sgd() -> Any:
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1, momentum=0.9)


def test_adapt_fills_added_keys_as_the_old_release_behaved_and_drops_unknown_ones() -> None:
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    saved = copy.deepcopy(optimizer.state_dict())
    group = saved["param_groups"][0]
    for key in ("capturable", "maximize", "decoupled_weight_decay"):
        group.pop(key, None)
    group["initial_lr"] = 0.1  # a scheduler's key: not the optimizer's to drop
    before = copy.deepcopy(saved)
    adapted = adapt_state_dict(saved, optimizer)
    assert saved == before, "the input is left unchanged"
    got = adapted["param_groups"][0]
    assert got["capturable"] is False and got["maximize"] is False
    assert got["initial_lr"] == 0.1
    if NEWER_KEYS:
        assert got["decoupled_weight_decay"] is True  # AdamW was always decoupled
    sgd = _sgd()
    newer = copy.deepcopy(sgd.state_dict())
    newer["param_groups"][0]["decoupled_weight_decay"] = False  # a key SGD does not know
    assert "decoupled_weight_decay" not in adapt_state_dict(newer, sgd)["param_groups"][0]


def test_adapt_handles_the_flattened_form() -> None:
    model, optimizer = build("adam")
    _, optim_sd = get_state_dict(model, optimizer,
                                 options=StateDictOptions(flatten_optimizer_state_dict=True))
    fqn = "0.weight"
    optim_sd.pop(f"param_groups.{fqn}.maximize")
    adapted = adapt_state_dict(optim_sd, optimizer)
    assert adapted[f"param_groups.{fqn}.maximize"] is False
    assert adapted.keys() == {**optim_sd, f"param_groups.{fqn}.maximize": 0}.keys()


def test_adapt_refuses_a_missing_key_no_release_added() -> None:
    sgd = _sgd()
    saved = copy.deepcopy(sgd.state_dict())
    del saved["param_groups"][0]["momentum"]
    with pytest.raises(OptimizerStateError, match=r"\['momentum'\].*running torch \d"):
        adapt_state_dict(saved, sgd)
