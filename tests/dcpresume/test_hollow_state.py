"""A fresh optimizer's ``state_dict()`` (``state`` empty until its first step) as the template.

Found by an audit as a user would (2026-12-05): DCP plans nothing under an empty dict, so
``load_dcp`` returned ``()`` and the run resumed with new Adam moments, while the dry run
said "WOULD FAIL" (NOT LOADED). ``load_dcp`` now refuses it before anything is loaded, as the
dry run does; an empty dict the checkpoint holds nothing under still loads.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed.checkpoint.state_dict")  # torch >= 2.2

import torch.distributed.checkpoint as dcp  # noqa: E402

from compatshim.checkpoint import plan_resume  # noqa: E402
from compatshim.optim import OptimizerStateError, load_dcp  # noqa: E402
from tests.dcpresume.optim_job import dcp_kwargs  # noqa: E402
from tests.dcpresume.test_optim_releases import group  # noqa: E402,F401

pytestmark = pytest.mark.timeout(120)


def _build() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    return model, torch.optim.AdamW(model.parameters(), lr=0.1)


@pytest.mark.usefixtures("group")
def test_a_fresh_optimizers_empty_state_is_refused_not_skipped(tmp_path: Path) -> None:
    model, opt = _build()
    model(torch.ones(2, 3)).sum().backward()
    opt.step()
    dcp.save({"optim": opt.state_dict()}, **dcp_kwargs(tmp_path, save=True))
    _, fresh = _build()
    state = {"optim": fresh.state_dict()}
    template = copy.deepcopy(state)
    assert not plan_resume(tmp_path, copy.deepcopy(state), {"optim": fresh}).ok
    with pytest.raises(OptimizerStateError, match=r"optim\.state is empty .* 6 entries"):
        load_dcp(state, {"optim": fresh}, **dcp_kwargs(tmp_path))
    assert state == template, "refused before anything is loaded"


@pytest.mark.usefixtures("group")
def test_an_empty_state_the_checkpoint_holds_nothing_under_loads(tmp_path: Path) -> None:
    _, opt = _build()
    dcp.save({"optim": opt.state_dict()}, **dcp_kwargs(tmp_path, save=True))
    _, fresh = _build()
    state = {"optim": fresh.state_dict()}
    assert plan_resume(tmp_path, copy.deepcopy(state), {"optim": fresh}).ok
    load_dcp(state, {"optim": fresh}, **dcp_kwargs(tmp_path))
    assert state["optim"]["state"] == {}
