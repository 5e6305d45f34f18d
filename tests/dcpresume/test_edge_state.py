"""What torch 2.3+ saves without a trace, and what torch 2.2's ``dcp.load`` drops, resumes.

Found by an audit as a user would (2026-12-04); the fixture (``edge_job``) was saved by torch
2.15 before the first step: an optimizer whose ``state`` is ``{}``, a disabled GradScaler's
``{}`` and a dict holding ``{}`` (2.3+ write no entry for an empty dict, so a folder
rewritten for 2.2 lacked them: ``KeyError: 'state'`` at ``load_state_dict``), a OneCycleLR
(2.5+ save ``_anneal_func_type`` where 2.2 keeps the bound ``anneal_func``: ``load_dcp``
refused it as another class's state), and a top-level ``epoch`` int (2.2's ``dcp.load``
reads it and puts the template's back: the dry run said it loads). On the running torch the
folder, rewritten where this torch cannot read it, resumes through ``load_dcp`` with every
value as saved, the next step equal to the uninterrupted run's, and the dry run says so.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed.checkpoint.state_dict")  # torch >= 2.2

from compatshim.checkpoint import downgrade_dcp, plan_resume  # noqa: E402
from compatshim.optim import load_dcp  # noqa: E402
from tests.dcpresume.edge_job import build, step  # noqa: E402
from tests.dcpresume.optim_job import dcp_kwargs  # noqa: E402
from tests.dcpresume.test_optim_releases import (  # noqa: E402
    RUNNING,
    STRIDES,
    group,  # noqa: F401  (the one-rank gloo group torch 2.2's dcp.load needs)
)

pytestmark = pytest.mark.timeout(120)
FIXTURE = Path(__file__).parent / "fixtures" / "edge" / "torch2.15.0"


@pytest.fixture()
def folder(tmp_path: Path) -> Path:
    """The fixture, rewritten for this torch where it cannot read a 2.15 ``.metadata``."""
    if STRIDES:
        return FIXTURE / "dcp"
    downgrade_dcp(FIXTURE / "dcp", tmp_path / "dcp", torch=".".join(map(str, RUNNING[:2])))
    return tmp_path / "dcp"


def _template() -> tuple[dict[str, Any], Any, Any, Any]:
    model, opt, sched = build(seed=1)
    state = {"model": model.state_dict(), "optim": opt.state_dict(), "sched": sched.state_dict(),
             "scaler": {}, "epoch": 0, "meta": {"a": 0, "e": {}}}  # fmt: skip
    return state, model, opt, sched


@pytest.mark.usefixtures("group")
def test_the_state_resumes_as_saved(folder: Path) -> None:
    state, model, opt, sched = _template()
    owners = {"optim": opt, "sched": sched}
    plan = plan_resume(folder, state, owners)
    assert plan.ok, plan.text()
    load_dcp(state, owners, **dcp_kwargs(folder))
    assert state["epoch"] == 7 and state["meta"] == {"a": 1, "e": {}} and state["scaler"] == {}
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optim"])  # KeyError 'state' where the empty dict was lost
    sched.load_state_dict(state["sched"])
    want = torch.load(FIXTURE / "next.pt", weights_only=True)
    assert sched.last_epoch == want["last_epoch"]
    torch.testing.assert_close(sched.get_last_lr(), want["lr"])
    step(model, opt, sched, 0)
    for key, value in want["params"].items():
        torch.testing.assert_close(model.state_dict()[key], value, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(sched.get_last_lr(), want["lr_next"])


def test_the_dry_run_of_a_plain_load_names_what_this_torch_drops(folder: Path) -> None:
    """Without ``optimizers`` the plan is plain ``dcp.load``'s: on torch 2.2 it reads the
    top-level ``epoch`` and puts the template's back."""
    state, *_ = _template()
    plan = plan_resume(folder, state)
    if RUNNING < (2, 3):
        assert "epoch" in plan.dropped and not plan.ok
        assert "DROPPED by this torch's dcp.load: epoch" in plan.text()
    else:
        assert plan.dropped == ()
