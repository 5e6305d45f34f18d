"""transformers Trainer and accelerate resume their own checkpoints, with and without compatshim.

On torch 2.6+ transformers 4.46's ``_load_rng_state`` calls plain
``torch.load`` on ``rng_state.pth`` (numpy arrays; transformers issue 40500)
and the resume fails; accelerate 0.34's ``load_state`` catches the same
refusal, logs "Could not load random states" at INFO and trains on with the
wrong RNG. Newer releases allow-list numpy themselves. Both promise that the
RNG is restored, so a resumed run must end with the weights and RNG draws of
an uninterrupted one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from .jobs import release, run_job, torch_loads_weights_only_by_default

SCRIPT = "hf_job.py"


def trainer_breaks() -> bool:
    """transformers < 4.50 loads rng_state.pth with torch's default (fixed upstream later)."""
    return torch_loads_weights_only_by_default() and release("transformers") < (4, 50)


def accelerate_drops_rng() -> bool:
    """accelerate < 1.0 loads random_states_*.pkl with torch's default and swallows the error."""
    return torch_loads_weights_only_by_default() and release("accelerate") < (1, 0)


@pytest.fixture(scope="module")
def trainer_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder: Path = tmp_path_factory.mktemp("trainer")
    return {
        "saved": run_job(SCRIPT, "trainer-save", folder, compatshim=False),
        "plain": run_job(SCRIPT, "trainer-resume", folder, compatshim=False),
        "patched": run_job(SCRIPT, "trainer-resume", folder, compatshim=True),
    }


@pytest.fixture(scope="module")
def accelerate_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder: Path = tmp_path_factory.mktemp("accelerate")
    return {
        "folder": folder,
        "saved": run_job(SCRIPT, "accelerate-save", folder, compatshim=False),
        "plain": run_job(SCRIPT, "accelerate-resume", folder, compatshim=False),
        "patched": run_job(SCRIPT, "accelerate-resume", folder, compatshim=True),
    }


def _same_run(resumed: dict[str, Any], saved: dict[str, Any]) -> None:
    assert resumed["ok"], resumed.get("traceback")
    assert resumed["weights"] == saved["weights"]
    assert resumed["draws"] == saved["draws"]


def test_plain_trainer_resume(trainer_runs: dict[str, Any]) -> None:
    plain = trainer_runs["plain"]
    if trainer_breaks():
        assert not plain["ok"] and plain["error_type"] == "UnpicklingError"
        assert "Weights only load failed" in plain["error"]
    else:
        _same_run(plain, trainer_runs["saved"])


def test_trainer_resumes_with_compatshim(trainer_runs: dict[str, Any]) -> None:
    patched = trainer_runs["patched"]
    _same_run(patched, trainer_runs["saved"])  # RNG restored: same dropout, numpy and python draws
    assert patched["resumed_at"] == 3 and patched["global_step"] == 6
    retried = [line for line in patched["retries"] if "rng_state.pth" in line]
    assert bool(retried) == trainer_breaks()


def test_plain_accelerate_load_state(accelerate_runs: dict[str, Any]) -> None:
    plain, saved = accelerate_runs["plain"], accelerate_runs["saved"]
    assert plain["ok"], plain.get("traceback")
    assert plain["step_after_load"] == 3
    if accelerate_drops_rng():  # the silent failure: no error, wrong RNG from here on
        assert plain["draws"] != saved["draws"]
    else:
        _same_run(plain, saved)


def test_accelerate_resumes_with_compatshim(accelerate_runs: dict[str, Any]) -> None:
    patched = accelerate_runs["patched"]
    _same_run(patched, accelerate_runs["saved"])
    assert patched["step_after_load"] == 3 and patched["step"] == 6
    retried = [line for line in patched["retries"] if "random_states_0.pkl" in line]
    assert bool(retried) == accelerate_drops_rng()


def test_a_swallowed_refusal_still_warns(accelerate_runs: dict[str, Any], tmp_path: Path) -> None:
    """A random-states file neither torch nor compatshim accepts: accelerate swallows, we warn."""
    import shutil
    from fractions import Fraction

    import torch

    from compatshim.checkpoint import load

    folder = tmp_path / "run"
    shutil.copytree(accelerate_runs["folder"], folder)
    states_file = folder / "state" / "random_states_0.pkl"
    states = load(states_file)  # numpy RNG state inside: compatshim's loader reads it safely
    states["unknown"] = Fraction(1, 3)  # harmless, but on no allowlist
    torch.save(states, states_file)
    resumed = run_job(SCRIPT, "accelerate-resume", folder, compatshim=True)
    assert "CheckpointRefusedWarning" in resumed["stderr"]
    assert "random_states_0.pkl" in resumed["stderr"]
    assert "fractions.Fraction" in resumed["stderr"]
