"""mmengine's Runner checkpoints through its own save and resume paths, plain and armed.

mmengine 0.10.7 reads checkpoints with a plain ``torch.load`` (``CheckpointLoader``):
on torch 2.6+ its own ``Runner(load_from=..., resume=True)`` refuses the
``HistoryBuffer`` objects of its ``MessageHub``, whose state also holds
``getattr(HistoryBuffer, 'min')`` and the like. With
``torch-load-safe-globals`` armed, compatshim's loader reads them through the
table's ``HistoryBuffer`` and ``method`` rows and the ``getattr`` rule.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mmengine")

from tests.checkpoint.test_rules import call, g, getattr_, refused, run, s

from .jobs import run_job, timeout_for, torch_loads_weights_only_by_default

SCRIPT = "mmengine_job.py"
pytestmark = pytest.mark.timeout(timeout_for(3))
TIMING = ("train/time", "train/data_time")  # wall-clock: differ between runs


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder: Path = tmp_path_factory.mktemp("mmengine")
    saved = run_job(SCRIPT, "save", folder)
    assert saved["ok"], saved.get("traceback")
    return {
        "saved": saved["states"],
        "plain": run_job(SCRIPT, "resume-plain", folder),
        "armed": run_job(SCRIPT, "resume-armed", folder),
    }


def test_plain_torch_refuses_mmengine_resume_on_weights_only_torch(runs: dict[str, Any]) -> None:
    """The baseline: mmengine's own resume breaks on torch 2.6+ (no weights_only passed)."""
    plain = runs["plain"]
    if not torch_loads_weights_only_by_default():
        assert plain["ok"], plain.get("traceback")
        return
    assert not plain["ok"]
    assert plain["error_type"] == "_pickle.UnpicklingError"
    assert "mmengine.logging.history_buffer.HistoryBuffer" in plain["error"]


def test_armed_resume_continues_where_the_checkpoint_left(runs: dict[str, Any]) -> None:
    armed, saved = runs["armed"], runs["saved"]
    assert armed["ok"], armed.get("traceback")
    assert armed["installed"] == (
        ["torch-load-safe-globals"] if torch_loads_weights_only_by_default() else []
    )
    if armed["installed"]:
        assert armed["restored"], "compatshim.uninstall left torch.load wrapped"
    start, at_save = armed["states"]["at_start"], saved["after_epoch_2"]
    assert (start["epoch"], start["iter"]) == (2, 8)  # 2 epochs of 4 iterations done
    for key in ("weights", "optimizer", "history"):
        assert start[key] == at_save[key], key  # MessageHub history: every scalar, every count
    assert start["runtime"]["seed"] == at_save["runtime"]["seed"]


def test_armed_resume_ends_as_if_never_interrupted(runs: dict[str, Any]) -> None:
    end, reference = runs["armed"]["states"]["after_epoch_3"], runs["saved"]["after_epoch_3"]
    for key in ("epoch", "iter", "weights", "optimizer", "runtime"):
        assert end[key] == reference[key], key
    assert end["history"].keys() == reference["history"].keys()
    for key, (values, counts) in reference["history"].items():
        got_values, got_counts = end["history"][key]
        assert got_counts == counts, key
        assert got_values[: 8 if key in TIMING else None] == values[: 8 if key in TIMING else None]


def test_history_buffer_rows() -> None:
    """The table's getattr rule on the real class; its state filled without its __setstate__."""
    import mmengine.logging.history_buffer as hb

    owner = g("mmengine.logging.history_buffer", "HistoryBuffer")
    before = dict(hb.HistoryBuffer._statistics_methods)
    for name in ("min", "max", "current", "mean"):
        assert run(getattr_(owner, s(name))) is vars(hb.HistoryBuffer)[name]
    for name in ("update", "statistics", "register_statistics", "data", "__setstate__"):
        refused(getattr_(owner, s(name)), "builtins.getattr")
    # its state as mmengine pickles it: filled without __setstate__ (which writes a class dict)
    state = b"}(" + s("statistics_methods") + b"}(" + s("evil") + getattr_(owner, s("min")) + b"u"
    made = run(
        call(g("copyreg", "_reconstructor"), owner, g("builtins", "object"), b"N") + state + b"ub"
    )
    assert type(made) is hb.HistoryBuffer
    assert made.statistics_methods == {"evil": hb.HistoryBuffer.min}
    assert hb.HistoryBuffer._statistics_methods == before  # no class-wide state changed
