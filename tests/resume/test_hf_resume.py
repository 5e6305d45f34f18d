"""transformers Trainer and accelerate resume their own checkpoints, with and without compatshim.

On torch 2.6+ transformers 4.46's ``_load_rng_state`` calls plain
``torch.load`` on ``rng_state.pth`` (numpy arrays; transformers issue 40500)
and the resume fails; accelerate 0.34's ``load_state`` catches the same
refusal, logs "Could not load random states" at INFO and trains on with the
wrong RNG. transformers 4.47+ and accelerate 1.1+ allow-list numpy themselves
for that load (the file still needs it: a plain ``torch.load`` refuses it),
so there the patch must stay out of the way. Both promise that the RNG is
restored, so a resumed run must end with the weights and RNG draws of an
uninterrupted one, at the same step.

Across numpy majors: transformers allow-lists numpy under the running numpy's
names only (``numpy._core.multiarray._reconstruct`` under numpy 2), so a
Trainer checkpoint written under numpy 1.x (``numpy.core...``) does not resume
under numpy 2, and the reverse. ``hf_fixtures/numpy-<v>/checkpoint-3`` are
real Trainer checkpoints written by ``python tests/resume/hf_job.py
trainer-fixture tests/resume/hf_fixtures`` (transformers 5.23.0, torch 2.15.0)
under numpy 1.26.4 and 2.4.6; each env resumes the other major's.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from .jobs import release, run_job, timeout_for, torch_loads_weights_only_by_default

SCRIPT = "hf_job.py"
FIXTURES = Path(__file__).resolve().parent / "hf_fixtures"
HALF, STEPS = 3, 6  # hf_job.py: a checkpoint after 3 of 6 steps
pytestmark = pytest.mark.timeout(timeout_for(5 + 2))  # the first test runs its module fixture


def trainer_breaks() -> bool:
    """transformers < 4.47 loads rng_state.pth with torch's default (4.47 added safe_globals())."""
    return torch_loads_weights_only_by_default() and release("transformers") < (4, 47)


def accelerate_drops_rng() -> bool:
    """accelerate < 1.1 loads random_states_*.pkl with torch's default and swallows the error.

    (1.1 reads it through ``accelerate.utils.load``, which allow-lists numpy.)
    """
    return torch_loads_weights_only_by_default() and release("accelerate") < (1, 1)


@pytest.fixture(scope="module")
def trainer_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder: Path = tmp_path_factory.mktemp("trainer")
    return {
        "saved": run_job(SCRIPT, "trainer-save", folder, compatshim=False),
        "plain": run_job(SCRIPT, "trainer-resume", folder, compatshim=False),
        "patched": run_job(SCRIPT, "trainer-resume", folder, compatshim=True),
        "rng_file_plain": run_job(SCRIPT, "trainer-rng-file", folder, compatshim=False),
        "rng_file_patched": run_job(SCRIPT, "trainer-rng-file", folder, compatshim=True),
    }


def _other_numpy_fixture() -> tuple[Path, dict[str, str]]:
    """The committed Trainer checkpoint written under the other numpy major, and its writer."""
    running = release("numpy")[0]
    for folder in sorted(FIXTURES.glob("numpy-*")):
        written_by: dict[str, str] = json.loads((folder / "written_by.json").read_text())
        if int(written_by["numpy"].split(".")[0]) != running:
            return folder, written_by
    raise AssertionError(f"no Trainer checkpoint written under numpy != {running} in {FIXTURES}")


@pytest.fixture(scope="module")
def other_numpy_runs(
    tmp_path_factory: pytest.TempPathFactory, trainer_runs: dict[str, Any]
) -> dict[str, Any]:
    fixture, written_by = _other_numpy_fixture()
    writer = tuple(int(part) for part in written_by["transformers"].split(".")[:2])
    if release("transformers") < writer:
        pytest.skip(
            f"{fixture.name} was written by transformers {written_by['transformers']}; an older "
            "Trainer cannot read a newer one's trainer_state.json (4.46: best_global_step)"
        )
    runs: dict[str, Any] = {"saved": trainer_runs["saved"], "written_by": written_by}
    for name, compatshim in (("plain", False), ("patched", True)):
        folder: Path = tmp_path_factory.mktemp(f"other-numpy-{name}")
        shutil.copytree(fixture / f"checkpoint-{HALF}", folder / f"checkpoint-{HALF}")
        runs[name] = run_job(SCRIPT, "trainer-resume", folder, compatshim=compatshim)
    return runs


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


def _trainer_continued(resumed: dict[str, Any], saved: dict[str, Any]) -> None:
    """Resumed at the checkpoint's step (not from scratch) and ended as if never interrupted."""
    _same_run(resumed, saved)  # RNG restored: same dropout, numpy and python draws
    assert saved["global_step"] == STEPS and f"checkpoint-{HALF}" in saved["checkpoints"]
    assert resumed["resumed_at"] == HALF and resumed["first_step"] == HALF
    assert resumed["global_step"] == STEPS


def test_plain_trainer_resume(trainer_runs: dict[str, Any]) -> None:
    plain = trainer_runs["plain"]
    if trainer_breaks():
        assert not plain["ok"] and plain["error_type"] == "UnpicklingError"
        assert "Weights only load failed" in plain["error"]
        assert "Unsupported global: GLOBAL numpy" in plain["error"]
    else:
        _trainer_continued(plain, trainer_runs["saved"])


def test_trainer_resumes_with_compatshim(trainer_runs: dict[str, Any]) -> None:
    patched = trainer_runs["patched"]
    _trainer_continued(patched, trainer_runs["saved"])
    retried = [line for line in patched["retries"] if "rng_state.pth" in line]
    assert len(retried) == int(trainer_breaks()), patched["retries"]


def test_the_trainer_rng_file_needs_numpy_allow_listed(trainer_runs: dict[str, Any]) -> None:
    """A plain torch.load of rng_state.pth: refused on torch 2.6+, so a plain resume that works
    there works because transformers allow-lists numpy itself; compatshim's retry reads it."""
    plain, patched = trainer_runs["rng_file_plain"], trainer_runs["rng_file_patched"]
    if torch_loads_weights_only_by_default():
        assert not plain["ok"] and plain["error_type"] == "UnpicklingError"
        assert "Unsupported global: GLOBAL numpy" in plain["error"]
    else:
        assert plain["ok"]
    retried = [line for line in patched["retries"] if "rng_state.pth" in line]
    assert len(retried) == int(torch_loads_weights_only_by_default()), patched["retries"]
    assert patched["ok"], patched.get("traceback")
    assert {"cpu", "numpy", "python"} <= set(patched["keys"])


def test_plain_trainer_resume_of_the_other_numpys_checkpoint(
    other_numpy_runs: dict[str, Any],
) -> None:
    plain = other_numpy_runs["plain"]
    if not torch_loads_weights_only_by_default():
        _trainer_continued(plain, other_numpy_runs["saved"])  # a full load: any numpy name goes
        return
    written_under_numpy2 = other_numpy_runs["written_by"]["numpy"].startswith("2.")
    named = "numpy._core" if written_under_numpy2 else "numpy.core"
    assert not plain["ok"] and plain["error_type"] == "UnpicklingError"
    assert f"Unsupported global: GLOBAL {named}.multiarray._reconstruct" in plain["error"]


def test_trainer_resumes_the_other_numpys_checkpoint_with_compatshim(
    other_numpy_runs: dict[str, Any],
) -> None:
    """Resumed from the other numpy's checkpoint, the run ends as one never interrupted here
    (numpy's legacy RNG streams are the same under 1.x and 2.x)."""
    _trainer_continued(other_numpy_runs["patched"], other_numpy_runs["saved"])


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
    assert len(retried) == int(accelerate_drops_rng()), patched["retries"]


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
