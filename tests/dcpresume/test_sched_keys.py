"""Scheduler state the release tests' schedulers do not hold, resumed across releases.

Found by an audit as a user would (2026-12-05), saving under torch 2.2.2 and resuming under
2.8.0, 2.13.0 and 2.15.0 with ``load_dcp``:

- ``MultiStepLR``'s ``milestones`` is a Counter of ints; DCP plans and loads its entries
  under ``str(key)``. Resumed under 2.3+ the Counter held ``{2: 1, '2': 1}``: the next
  ``dcp.save`` failed ("duplicated flatten key sched.milestones.2") and ``step(epoch)``
  could not sort them; read whole from a folder rewritten for 2.2 it held str keys only and
  the lr silently stopped decaying.
- ``ReduceLROnPlateau`` (``default_min_lr``) and ``CyclicLR(cycle_momentum=True)``
  (``use_beta1``) gained a key after 2.2.2: ``load_dcp`` refused their 2.2 state, saying no
  release had added it.
- ``ReduceLROnPlateau`` saved by 2.2 before its first step has no ``_last_lr`` (2.2's set it in
  ``step()``): refused the same way.
- ``OneCycleLR`` saved by 2.2 (the bound ``anneal_func``, no ``_anneal_func_type``) was
  refused by 2.5+ as "another class's state".
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed.checkpoint.state_dict")  # torch >= 2.2

import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.optim import lr_scheduler  # noqa: E402

from compatshim.checkpoint import plan_resume  # noqa: E402
from compatshim.optim import OptimizerStateError, adapt_state_dict, load_dcp  # noqa: E402
from tests.dcpresume.optim_job import dcp_kwargs  # noqa: E402
from tests.dcpresume.test_optim_releases import group  # noqa: E402,F401

pytestmark = pytest.mark.timeout(120)


def _sgd(momentum: float = 0.0) -> torch.optim.Optimizer:
    return torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=1.0, momentum=momentum)


def _multistep() -> tuple[torch.optim.Optimizer, lr_scheduler.MultiStepLR]:
    opt = _sgd()
    return opt, lr_scheduler.MultiStepLR(opt, [2, 4], gamma=0.1)


def _save(folder: Path, state: dict) -> None:
    dcp.save(state, **dcp_kwargs(folder, save=True))


@pytest.mark.usefixtures("group")
def test_a_multisteplr_keeps_its_int_milestones_and_saves_again(tmp_path: Path) -> None:
    opt, sched = _multistep()
    for _ in range(3):
        opt.step()
        sched.step()
    _save(tmp_path / "a", {"sched": sched.state_dict()})
    _, resumed = _multistep()
    state = {"sched": resumed.state_dict()}
    load_dcp(state, {"sched": resumed}, **dcp_kwargs(tmp_path / "a"))
    assert dict(state["sched"]["milestones"]) == {2: 1, 4: 1}
    resumed.load_state_dict(state["sched"])
    _save(tmp_path / "b", {"sched": resumed.state_dict()})  # "duplicated flatten key" before
    opt3, again = _multistep()
    opt3.param_groups[0]["lr"] = opt.param_groups[0]["lr"]  # the optimizer's state, as loaded
    state = {"sched": again.state_dict()}
    load_dcp(state, {"sched": again}, **dcp_kwargs(tmp_path / "b"))
    again.load_state_dict(state["sched"])
    assert dict(again.milestones) == {2: 1, 4: 1} and again.last_epoch == 3
    for _ in range(2):
        opt.step(), opt3.step()
        sched.step(), again.step()
    assert again.get_last_lr() == sched.get_last_lr()


def _older(running: dict, key: str) -> dict:
    saved = copy.deepcopy(running)
    del saved[key]
    return saved


@pytest.mark.usefixtures("group")
@pytest.mark.parametrize("key", ["default_min_lr", "use_beta1"])
def test_a_scheduler_key_added_after_2_2_is_filled(tmp_path: Path, key: str) -> None:
    opt = _sgd(momentum=0.9)
    if key == "default_min_lr":
        sched = lr_scheduler.ReduceLROnPlateau(opt, patience=0)
        sched.step(1.0)
    else:
        sched = lr_scheduler.CyclicLR(opt, 0.01, 0.1, step_size_up=2)
        opt.step()
        sched.step()
    running = sched.state_dict()
    if key not in running:
        pytest.skip(f"torch {torch.__version__} has no {key}")
    saved = _older(running, key)  # as torch 2.2.2 saved it
    # what a release without the key did: min_lrs kept as built (a new param group fails),
    # momentum cycled (2.2's CyclicLR refused an optimizer without it)
    want = {**running, key: None if key == "default_min_lr" else False}
    assert adapt_state_dict(saved, sched) == want
    _save(tmp_path, {"sched": saved})
    state = {"sched": copy.deepcopy(running)}
    assert plan_resume(tmp_path, copy.deepcopy(state), {"sched": sched}).ok
    assert load_dcp(state, {"sched": sched}, **dcp_kwargs(tmp_path)) == (f"sched.{key}",)
    assert state["sched"] == want


PLATEAU = Path(__file__).parent / "fixtures" / "plateau" / "torch2.2.2" / "dcp"  # sched_job


@pytest.mark.usefixtures("group")
def test_a_plateau_scheduler_saved_by_2_2_before_its_first_step_resumes() -> None:
    """Refused before by ``load_dcp`` as a key "no torch release is known to have added", and
    the dry run said the resume fails (MISSING ``sched._last_lr``)."""
    opt = _sgd()
    resumed = lr_scheduler.ReduceLROnPlateau(opt, patience=0)
    state = {"sched": resumed.state_dict()}
    if "_last_lr" not in state["sched"]:
        pytest.skip(f"torch {torch.__version__}'s ReduceLROnPlateau sets _last_lr in step()")
    plan = plan_resume(PLATEAU, copy.deepcopy(state), {"sched": resumed})
    assert plan.ok and ("sched._last_lr", [1.0]) in plan.filled, plan.text()
    filled = load_dcp(state, {"sched": resumed}, **dcp_kwargs(PLATEAU))
    assert "sched._last_lr" in filled and "sched.verbose" not in state["sched"]
    resumed.load_state_dict(state["sched"])
    uninterrupted = lr_scheduler.ReduceLROnPlateau(_sgd(), patience=0)
    assert resumed.get_last_lr() == uninterrupted.get_last_lr() == [1.0]
    for loss in (1.0, 2.0, 3.0):
        uninterrupted.step(loss), resumed.step(loss)
        assert resumed.get_last_lr() == uninterrupted.get_last_lr()
    assert opt.param_groups[0]["lr"] < 1.0


def test_a_plateau_state_without_last_lr_after_a_step_is_still_refused() -> None:
    sched = lr_scheduler.ReduceLROnPlateau(_sgd(), patience=0)
    sched.step(1.0)
    saved = copy.deepcopy(sched.state_dict())
    if "_last_lr" not in saved:
        pytest.skip(f"torch {torch.__version__} has no _last_lr")
    del saved["_last_lr"]  # 2.2 had it once stepped: no release saved this
    with pytest.raises(OptimizerStateError, match=r"lacks key\(s\) \['_last_lr'\]"):
        adapt_state_dict(saved, sched)


def test_a_onecyclelr_state_with_the_older_anneal_func_is_adapted() -> None:
    sched = lr_scheduler.OneCycleLR(_sgd(), max_lr=0.1, total_steps=10)
    running = sched.state_dict()
    if "_anneal_func_type" not in running:
        pytest.skip(f"torch {torch.__version__} keeps anneal_func itself")
    saved = _older(running, "_anneal_func_type")  # as torch 2.2.2 saved it
    saved["anneal_func"] = lr_scheduler.OneCycleLR._annealing_cos
    adapted = adapt_state_dict(saved, sched)
    assert adapted == running
    saved["anneal_func"] = lr_scheduler.OneCycleLR._annealing_linear
    with pytest.raises(OptimizerStateError, match=r"_annealing_linear.*'cos'"):
        adapt_state_dict(saved, sched)


@pytest.mark.usefixtures("group")
def test_a_saved_milestone_the_running_multisteplr_lacks_is_refused(tmp_path: Path) -> None:
    """Saved with milestones [2, 4, 6], resumed into [2, 4]: DCP plans from the template and
    dropped milestone 6 (the lr stopped decaying at epoch 6), and the dry run said it resumes."""
    opt = _sgd()
    sched = lr_scheduler.MultiStepLR(opt, [2, 4, 6], gamma=0.1)
    _save(tmp_path, {"sched": sched.state_dict()})
    _, resumed = _multistep()
    state = {"sched": resumed.state_dict()}
    plan = plan_resume(tmp_path, copy.deepcopy(state), {"sched": resumed})
    if "sched" in plan.loads:  # torch 2.2 saves and loads it whole: the milestones as saved
        assert plan.ok, plan.text()
        return
    assert not plan.ok and "sched.milestones holds saved key(s) ['6']" in plan.text()
    with pytest.raises(OptimizerStateError, match=r"milestones holds saved key\(s\) \['6'\]"):
        load_dcp(state, {"sched": resumed}, **dcp_kwargs(tmp_path))
