"""LR-scheduler and GradScaler state saved under one torch release resumes under the running one
(issue 39 item 1).

``fixtures/sched/torch<release>`` were written by ``python -m tests.dcpresume.sched_job
FOLDER`` under torch 2.2.2, 2.4.1, 2.8.0, 2.11.0 and 2.15.0: AdamW with a warmup+cosine
LambdaLR, a StepLR, a SequentialLR (LinearLR then CosineAnnealingLR), a ChainedScheduler
(ConstantLR and ExponentialLR) and a ChainedScheduler nesting that SequentialLR, three
steps in, as ``torch.save`` and as DCP folders (with a CPU GradScaler's state from 2.3 on),
and what the uninterrupted run does next. Measured with plain ``dcp.load`` (the tests
below assert it on the running torch):

- 2.4.1 -> 2.8.0/2.11.0/2.15.0 fails: ``Missing key in checkpoint state_dict:
  sched._is_initial`` (after the optimizer's ``decoupled_weight_decay``); 2.8.0/2.11.0
  -> 2.4.1 fails on ``sched.verbose``, which 2.8 dropped;
- 2.2.2 -> 2.4.1 fails (2.2 saved the scheduler's dict as one item; 2.4 asks for
  ``sched.step_size`` ...), and ``allow_partial_load=True`` there restarts the scheduler
  at epoch 0; 2.5+ fall back to 2.2's keys and load it;
- 2.2.2 -> 2.2.2 leaves the scheduler as it was (2.2's ``dcp.load`` drops a top-level
  non-tensor item);
- a release before 2.15 cannot read a 2.15 ``.metadata``, nor 2.2 a 2.3+ one (see
  ``test_optim_releases``).

``compatshim.optim.load_dcp`` with the scheduler and GradScaler among its objects resumes
every pair torch can read, the next step equal to the uninterrupted run's, and names each
key it filled; a pair torch cannot read resumes the same way once
``compatshim.checkpoint.downgrade_dcp`` has rewritten the folder for the running release.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed.checkpoint.state_dict")  # torch >= 2.2

import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict  # noqa: E402

from compatshim.checkpoint import downgrade_dcp, plan_resume  # noqa: E402
from compatshim.optim import OptimizerStateError, adapt_state_dict, load_dcp  # noqa: E402
from compatshim.optim.keys import OLD_BEHAVIOUR, SCHEDULER_KEYS  # noqa: E402
from tests.dcpresume.optim_job import dcp_kwargs  # noqa: E402
from tests.dcpresume.sched_job import (  # noqa: E402
    SAVED,
    SCHEDULERS,
    build,
    epochs,
    has_cpu_scaler,
    scaler,
    step,
)
from tests.dcpresume.test_optim_releases import (  # noqa: E402
    ENCODING,
    RUNNING,
    STRIDES,
    _refused_by_torch,
    _version,
    group,  # noqa: F401  (the one-rank gloo group torch 2.2's dcp.load needs)
)

pytestmark = pytest.mark.timeout(120)
FIXTURES = Path(__file__).parent / "fixtures" / "sched"
RELEASES = sorted((p.name.removeprefix("torch") for p in FIXTURES.glob("torch*")), key=_version)
CASES = [(release, name) for release in RELEASES for name in sorted(SCHEDULERS)]
OLD_DCP = RUNNING < (2, 3)  # torch 2.2's dcp.load drops a top-level non-tensor item
# saved by a release whose .metadata this torch cannot read (2.3+ on 2.2, 2.15 on 2.3-2.13)
UNREADABLE = [
    (release, name)
    for release, name in CASES
    if (not ENCODING and _version(release) >= (2, 3))
    or (not STRIDES and _version(release) > (2, 13))
] or [pytest.param("", "", marks=pytest.mark.skip(reason="this torch reads every fixture"))]


def _folder(release: str, name: str) -> Path:
    return FIXTURES / f"torch{release}" / name


def _saved(release: str, name: str) -> dict[str, Any]:
    return torch.load(_folder(release, name) / "plain.pt", weights_only=True)  # type: ignore[no-any-return]


def _template(model: Any, opt: Any, sched: Any, grad_scaler: Any) -> dict[str, Any]:
    model_sd, optim_sd = get_state_dict(model, opt)
    state = {"model": model_sd, "optim": optim_sd, "sched": sched.state_dict()}
    if grad_scaler is not None:
        state["scaler"] = grad_scaler.state_dict()
    return state


def _scaler_for(release: str, name: str) -> Any:
    """A fresh CPU GradScaler where the checkpoint holds one and this torch has one."""
    return (
        scaler(init_scale=1.0) if has_cpu_scaler() and "scaler" in _saved(release, name) else None
    )


def _scheduler_fills(saved: Any, running: Any, path: str) -> set[str]:
    """Paths of the scheduler keys the running release has and ``saved`` lacks, nested too."""
    found = {f"{path}.{k}" for k in set(running) - set(saved) if k in SCHEDULER_KEYS}
    for i, (one, live) in enumerate(
        zip(saved.get("_schedulers") or [], running.get("_schedulers") or [])
    ):
        found |= _scheduler_fills(one, live, f"{path}._schedulers.{i}")
    return found


def _expected_fills(release: str, name: str, opt: Any, sched: Any) -> set[str]:
    saved = _saved(release, name)
    first = saved["optim"]["param_groups"][0]
    added = {
        f"optim.param_groups.0.{k}" for k in set(opt.defaults) - set(first) if k in OLD_BEHAVIOUR
    }
    return added | _scheduler_fills(saved["sched"], sched.state_dict(), "sched")


def _resume_and_step(release: str, name: str, model: Any, opt: Any, sched: Any) -> None:
    """The resumed scheduler's epochs and learning rate, and the next step, equal the
    uninterrupted run's under the saving torch."""
    want = torch.load(_folder(release, name) / "next.pt", weights_only=True)
    assert epochs(sched) == want["epochs"]
    torch.testing.assert_close(sched.get_last_lr(), want["lr"])
    torch.testing.assert_close([g["lr"] for g in opt.param_groups], want["lr"])
    step(model, opt, sched, SAVED)
    got = model.state_dict()
    for key, value in want["params"].items():
        torch.testing.assert_close(got[key], value, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(sched.get_last_lr(), want["lr_next"])


def _set(model: Any, opt: Any, sched: Any, grad_scaler: Any, state: dict[str, Any]) -> None:
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    sched.load_state_dict(state["sched"])
    if grad_scaler is not None:
        grad_scaler.load_state_dict(state["scaler"])


def _plain_fails(release: str, name: str, opt: Any, sched: Any) -> bool:
    """Whether a plain ``dcp.load`` of this fixture fails on the running torch."""
    folder = _folder(release, name) / "dcp"
    if "sched" in dcp.FileSystemReader(folder).read_metadata().state_dict_metadata:
        # torch 2.2's layout, one item: 2.3/2.4 ask for its keys, 2.5+ fall back to it
        return RUNNING[:2] in ((2, 3), (2, 4))
    # key by key: any key the running template has and the checkpoint lacks fails
    return bool(_expected_fills(release, name, opt, sched))


@pytest.mark.usefixtures("group")
@pytest.mark.parametrize(("release", "name"), CASES)
def test_a_plain_dcp_load_fails_where_a_release_added_a_key(release: str, name: str) -> None:
    """The reported failure, and torch's partial-load workaround restarting the scheduler."""
    model, opt, sched = build(name)
    state = _template(model, opt, sched, _scaler_for(release, name))
    kwargs = dcp_kwargs(_folder(release, name) / "dcp")
    if _refused_by_torch(release, lambda: dcp.load(state, **kwargs), plain=True):
        return
    if _plain_fails(release, name, opt, sched):
        with pytest.raises(BaseException, match="Missing key in checkpoint"):
            dcp.load(state, **kwargs)
        if RUNNING[:2] == (2, 4) and _version(release) < (2, 3):
            state = _template(model, opt, sched, None)
            dcp.load(state, planner=dcp.DefaultLoadPlanner(allow_partial_load=True), **kwargs)
            sched.load_state_dict(state["sched"])
            assert epochs(sched)[0] == 0, "torch's workaround restarts the scheduler"
        return
    dcp.load(state, **kwargs)
    if OLD_DCP:
        assert state["sched"] == sched.state_dict(), "torch 2.2 left the scheduler as it was"
        return
    _set(model, opt, sched, None, state)
    _resume_and_step(release, name, model, opt, sched)


def _fresh(release: str, name: str) -> tuple[Any, ...]:
    """A fresh model, optimizer, scheduler and GradScaler (where the checkpoint holds one and
    this torch has one), and the objects ``load_dcp`` takes."""
    model, opt, sched = build(name)
    grad_scaler = _scaler_for(release, name)
    objects = {"optim": opt, "sched": sched}
    if grad_scaler is not None:
        objects["scaler"] = grad_scaler
    return model, opt, sched, grad_scaler, objects


def _load_dcp_and_step(release: str, name: str, folder: Path, fresh: tuple[Any, ...]) -> Any:
    """``load_dcp`` of ``folder`` into ``fresh``: it fills the keys the saving release lacked,
    the GradScaler continues, the next step is the uninterrupted run's. Returns the keys."""
    model, opt, sched, grad_scaler, objects = fresh
    state = _template(model, opt, sched, grad_scaler)
    filled = load_dcp(state, objects, **dcp_kwargs(folder))
    assert set(filled) == _expected_fills(release, name, opt, sched), filled
    assert len(filled) == len(set(filled))
    _set(model, opt, sched, grad_scaler, state)
    if grad_scaler is not None:  # the scale and its growth tracker continue
        assert grad_scaler.state_dict() == _saved(release, name)["scaler"]
    _resume_and_step(release, name, model, opt, sched)
    return filled


@pytest.mark.usefixtures("group")
@pytest.mark.parametrize(("release", "name"), CASES)
def test_load_dcp_resumes_schedulers_from_any_release(release: str, name: str) -> None:
    fresh = _fresh(release, name)
    state, objects = _template(*fresh[:4]), fresh[4]
    folder = _folder(release, name) / "dcp"
    if _refused_by_torch(release, lambda: load_dcp(state, objects, **dcp_kwargs(folder))):
        return
    _load_dcp_and_step(release, name, folder, fresh)


@pytest.mark.usefixtures("group")
@pytest.mark.parametrize(("release", "name"), UNREADABLE)
def test_a_newer_releases_folder_rewritten_for_this_torch_resumes(
    tmp_path: Path, release: str, name: str
) -> None:
    """The cluster runs an older torch than the one that saved: ``downgrade_dcp`` for the
    running release (item 3), then ``load_dcp`` (item 1); the next step equals the
    uninterrupted run's under the saving torch, and the dry run (item 4) named the keys."""
    folder = tmp_path / "old"
    report = downgrade_dcp(_folder(release, name) / "dcp", folder, torch=torch.__version__)
    assert report.changes, "a release this torch cannot read needs a change"
    fresh = _fresh(release, name)
    plan = plan_resume(folder, _template(*fresh[:4]), fresh[4])
    filled = _load_dcp_and_step(release, name, folder, fresh)
    assert plan.ok and {key for key, _ in plan.filled} == set(filled), plan.text()


@pytest.mark.usefixtures("group")
@pytest.mark.parametrize(("release", "name"), CASES)
def test_the_dry_run_names_the_keys_load_dcp_fills(release: str, name: str) -> None:
    """``plan_resume`` before anything loads agrees with ``load_dcp`` on every release's
    fixture: ok where it resumes, and the keys it will fill are the ones filled; unreadable
    where this torch cannot read the ``.metadata`` (issue 39 item 4)."""
    fresh = _fresh(release, name)
    objects = fresh[4]
    folder = _folder(release, name) / "dcp"
    plan = plan_resume(folder, _template(*fresh[:4]), objects)
    state = _template(*fresh[:4])
    if _refused_by_torch(release, lambda: load_dcp(state, objects, **dcp_kwargs(folder))):
        assert plan.unreadable and not plan.ok, plan.text()
        return
    assert plan.ok, plan.text()
    filled = load_dcp(state, objects, **dcp_kwargs(folder))
    assert {key for key, _ in plan.filled} == set(filled), plan.text()


@pytest.mark.usefixtures("group")
def test_the_dry_run_reads_an_item_saved_whole_once(monkeypatch: Any) -> None:
    """2.2's scheduler, saved as one item: the dry run checks it (hardened) and looks inside
    it for the keys load_dcp fills from one read, not one each (torch 2.2 plans it as one
    item itself: it loads as is, and is looked into all the same)."""
    from compatshim.checkpoint import _resume_plan

    reads: list[str] = []
    real = _resume_plan._read_item
    monkeypatch.setattr(
        _resume_plan, "_read_item", lambda saved, fqn: reads.append(fqn) or real(saved, fqn)
    )
    name = sorted(SCHEDULERS)[0]
    fresh = _fresh("2.2.2", name)
    plan = plan_resume(_folder("2.2.2", name) / "dcp", _template(*fresh[:4]), fresh[4])
    assert "sched" in (plan.loads if OLD_DCP else plan.whole), plan.text()
    assert reads.count("sched") == 1, reads


@pytest.mark.parametrize(("release", "name"), CASES)
def test_torch_save_needs_nothing_and_adapt_names_the_same_keys(release: str, name: str) -> None:
    """A plain ``load_state_dict`` of ``torch.save``d state resumes in every direction;
    ``adapt_state_dict`` gives the scheduler the keys the running release has."""
    saved = _saved(release, name)
    model, opt, sched = build(name)
    model.load_state_dict(saved["model"])
    opt.load_state_dict(saved["optim"])
    before = copy.deepcopy(saved["sched"])
    adapted = adapt_state_dict(saved["sched"], sched)
    assert saved["sched"] == before, "the input is left unchanged"
    assert adapted.keys() == sched.state_dict().keys()
    for key in SCHEDULER_KEYS.keys() & adapted.keys() - before.keys():
        assert adapted[key] is False
    sched.load_state_dict(adapted)
    _resume_and_step(release, name, model, opt, sched)


@pytest.mark.usefixtures("group")
@pytest.mark.parametrize("release", RELEASES)
def test_a_scheduler_key_no_release_added_still_fails_naming_it(release: str) -> None:
    """A user scheduler's own attribute the checkpoint lacks: DCP's error names it where the
    checkpoint is key by key; compatshim's where 2.2 saved the scheduler as one item."""
    model, opt, sched = build("lambda")
    sched.warmup_done = True  # a subclass's or a patched attribute: saved by state_dict()
    state = _template(model, opt, sched, None)
    folder = _folder(release, "lambda") / "dcp"
    kwargs = dcp_kwargs(folder)
    if _refused_by_torch(
        release, lambda: load_dcp(state, {"optim": opt, "sched": sched}, **kwargs)
    ):
        return
    template = copy.deepcopy(state["sched"])
    plan = plan_resume(folder, copy.deepcopy(state), {"optim": opt, "sched": sched})
    assert not plan.ok and "warmup_done" in plan.text(), plan.text()  # the dry run says so too
    with pytest.raises(BaseException, match=r"(Missing key in checkpoint|lacks key).*warmup_done"):
        load_dcp(state, {"optim": opt, "sched": sched}, **kwargs)
    assert state["sched"] == template, "the template is left as it was"


def test_adapt_refuses_a_scheduler_key_no_release_added() -> None:
    _, _, sched = build("nested")
    saved = copy.deepcopy(sched.state_dict())
    del saved["_schedulers"][0]["_schedulers"][1]["T_max"]
    with pytest.raises(
        OptimizerStateError, match=r"\['T_max'\] \(at _schedulers\.0\._schedulers\.1\)"
    ):
        adapt_state_dict(saved, sched)
    saved = copy.deepcopy(sched.state_dict())
    saved["_schedulers"].pop()
    with pytest.raises(OptimizerStateError, match=r"_schedulers holds 1 saved .* nests 2"):
        adapt_state_dict(saved, sched)


def test_adapt_fills_is_initial_false_and_drops_verbose_where_the_release_has_not() -> None:
    _, _, sched = build("sequential")
    running = sched.state_dict()
    older = copy.deepcopy(running)
    for state in (older, *older["_schedulers"]):
        state.pop("_is_initial", None)
        state["verbose"] = False
    adapted = adapt_state_dict(older, sched)
    assert adapted.keys() == running.keys()
    for got, want in zip(adapted["_schedulers"], running["_schedulers"]):
        assert got.keys() == want.keys()
        if "_is_initial" in want:  # torch 2.8+: a stepped scheduler is never in its initial step
            assert got["_is_initial"] is False
        if "verbose" in want:  # torch 2.7-: the default verbose ("deprecated") held False
            assert got["verbose"] is False
