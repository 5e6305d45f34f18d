"""timm train-script checkpoints through timm's own save and resume paths, plain and armed.

timm's ``CheckpointSaver`` saves ``args`` (an ``argparse.Namespace``), the EMA
weights and the AMP scaler state. How timm reads them back depends on the
release: 0.9 calls a plain ``torch.load``, which torch 2.6+ makes weights-only,
so its own ``resume_checkpoint`` refuses the Namespace (armed, compatshim's
loader reads it); 1.0.9 passes ``weights_only=False`` (runs any code in the
file; the patch must leave it alone); 1.0.31 loads weights-only with
``argparse.Namespace`` added through ``torch.serialization.safe_globals``.
Either way the file must also load through ``compatshim.checkpoint.load``
exactly as torch's unrestricted loader reads it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("timm")

from .jobs import run_job, timeout_for, torch_loads_weights_only_by_default

SCRIPT = "timm_job.py"
pytestmark = pytest.mark.timeout(timeout_for(3))
STATE = ("weights", "optimizer", "ema", "scaler")


def timm_release() -> tuple[int, ...]:
    from importlib.metadata import version

    return tuple(int(p) for p in version("timm").split(".")[:3] if p.isdigit())


def plain_timm_refuses() -> bool:
    """timm < 1.0.9 (checked: 0.9.16) calls torch.load without weights_only; 1.0.9+ passes it."""
    return torch_loads_weights_only_by_default() and timm_release() < (1, 0, 9)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder: Path = tmp_path_factory.mktemp("timm")
    saved = run_job(SCRIPT, "save", folder)
    assert saved["ok"], saved.get("traceback")
    return {
        "folder": folder,
        "saved": saved["states"],
        "plain": run_job(SCRIPT, "resume-plain", folder),
        "armed": run_job(SCRIPT, "resume-armed", folder),
    }


def _resumed_as_saved(runs: dict[str, Any], resumed: dict[str, Any]) -> None:
    assert resumed["ok"], resumed.get("traceback")
    start, at_save = resumed["states"]["at_start"], runs["saved"]["after_epoch_1"]
    assert start["epoch"] == 2  # checkpoint-1 holds epoch 1 (version 2): resume at the next
    for key in STATE:  # model, optimizer, EMA (load_checkpoint(use_ema=True)), scaler
        assert start[key] == at_save[key], key
    end, reference = resumed["states"]["after_epoch_2"], runs["saved"]["after_epoch_2"]
    for key in ("epoch", *STATE):  # as if never interrupted
        assert end[key] == reference[key], key
    if resumed["states"]["saver_restored"]:  # timm 1.0.26+: the saver's history came back
        assert end["best"] == reference["best"]


def test_plain_timm_resume(runs: dict[str, Any]) -> None:
    """The baseline: only timm releases calling a plain torch.load break (torch 2.6+)."""
    plain = runs["plain"]
    if plain_timm_refuses():
        assert not plain["ok"]
        assert plain["error_type"] == "_pickle.UnpicklingError"
        assert "argparse.Namespace" in plain["error"]
    else:
        _resumed_as_saved(runs, plain)


def test_armed_timm_resume(runs: dict[str, Any]) -> None:
    armed = runs["armed"]
    _resumed_as_saved(runs, armed)
    if torch_loads_weights_only_by_default():
        assert armed["installed"] == ["torch-load-safe-globals"]
        assert armed["restored"], "compatshim.uninstall left torch.load wrapped"
    retried = [line for line in armed["retried"] if "checkpoint-1.pth.tar" in line]
    # resume_checkpoint and load_checkpoint(use_ema=True) each read the file once
    assert len(retried) == (2 if plain_timm_refuses() else 0), armed["retried"]
    if not plain_timm_refuses():
        assert runs["plain"]["states"] == armed["states"]


def test_compatshim_loader_reads_the_file_as_torch_does(runs: dict[str, Any]) -> None:
    import torch

    from compatshim.checkpoint import inspect, load
    from tests.checkpoint.helpers import assert_same

    path = runs["folder"] / "checkpoint-1.pth.tar"
    info = inspect(path)
    assert info.loadable, info.unknown
    expected = torch.load(path, map_location="cpu", weights_only=False)  # our own file
    got = load(path, map_location="cpu")
    assert {"epoch", "arch", "state_dict", "state_dict_ema", "optimizer", "args"} <= got.keys()
    assert_same(expected, got)
