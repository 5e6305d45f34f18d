"""Lightning's own checkpoints through its own resume paths, with and without compatshim.

``trainer.fit(ckpt_path=...)`` and ``LightningModule.load_from_checkpoint`` on
torch 2.6+: Lightning 2.3 and 2.6 call ``torch.load`` without ``weights_only``
and break on their own hyper-parameters; 2.4 and 2.5 pass
``weights_only=False`` and keep working (the patch must leave them alone), and
so run any code a checkpoint holds. Hardened (``COMPATSHIM_SAFE_LOAD=1``), every
release resumes its own clean checkpoints through compatshim's loader, and a
poisoned copy (``poisoned.ckpt``: a payload beside Lightning's keys) is refused
on both paths with the payload never run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("lightning.pytorch")  # not tests/lightning, a folder of this repo

from .jobs import release, run_job, timeout_for, torch_loads_weights_only_by_default

SCRIPT = "lightning_job.py"
pytestmark = pytest.mark.timeout(timeout_for(4))  # the first test runs the module fixture
KINDS = ("namespace", "fabric-attributedict", "attributedict")


def lightning_breaks() -> bool:
    """Whether this Lightning resumes with torch's default (2.4 and 2.5 pass weights_only=False)."""
    return torch_loads_weights_only_by_default() and release("lightning") not in ((2, 4), (2, 5))


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder: Path = tmp_path_factory.mktemp("lightning")
    saved = run_job(SCRIPT, "save", folder, compatshim=False)
    return {
        "saved": saved,
        "plain": run_job(SCRIPT, "resume", folder, compatshim=False),
        "patched": run_job(SCRIPT, "resume", folder, compatshim=True),
        "hardened": run_job(SCRIPT, "resume", folder, compatshim=True, hardened=True),
        "folder": folder,
    }


@pytest.mark.parametrize("kind", KINDS)
def test_plain_lightning_resume_breaks_only_where_expected(runs: dict[str, Any], kind: str) -> None:
    plain = runs["plain"][kind]
    if lightning_breaks():
        for step in ("fit", "load_from_checkpoint"):
            assert not plain[step]["ok"], step
            assert plain[step]["error_type"].endswith("UnpicklingError")
            assert "Unsupported global" in plain[step]["error"]
    else:  # Lightning's own weights_only=False load: works, and runs any code in the file
        _resumed_as_saved(runs, runs["plain"], kind)


def _resumed_as_saved(runs: dict[str, Any], resumed: dict[str, Any], kind: str) -> None:
    """fit resumed at step 4 and ended as if never interrupted; hyper-parameters as saved."""
    fit, loaded = resumed[kind]["fit"], resumed[kind]["load_from_checkpoint"]
    assert fit["ok"], fit.get("traceback")
    assert fit["resumed_at"] == 4 and fit["global_step"] == 8
    assert fit["weights"] == runs["saved"]["reference"][kind]  # weights, momentum, step restored
    assert loaded["ok"], loaded.get("traceback")
    assert loaded["weights"] == runs["saved"]["at_half"][kind]
    assert loaded["hp"] == runs["saved"]["saved"][kind]  # same type, same content
    assert loaded["hparams_type"] == runs["saved"]["hparams_type"][kind]


@pytest.mark.parametrize("kind", KINDS)
def test_lightning_resumes_with_compatshim(runs: dict[str, Any], kind: str) -> None:
    _resumed_as_saved(runs, runs["patched"], kind)


def test_compatshim_retries_only_where_lightning_breaks(runs: dict[str, Any]) -> None:
    folder = str(runs["folder"])
    retried = [line for line in runs["patched"]["retries"] if folder in line]
    if lightning_breaks():  # once for fit(ckpt_path=...), once for load_from_checkpoint
        for kind in KINDS:
            path = repr(str(runs["folder"] / kind / "step=4.ckpt"))
            assert sum(path in line for line in retried) == 2, retried
    else:  # 2.4/2.5 pass weights_only=False: what they load must not change
        assert retried == []
        for kind in KINDS:
            assert runs["plain"][kind] == runs["patched"][kind]


def test_omegaconf_hyper_parameters(runs: dict[str, Any]) -> None:
    """omegaconf hparams resume armed, as the real DictConfig (checked state, no resolvers)."""
    if "omegaconf" not in runs["patched"]:
        pytest.skip("omegaconf is not installed")
    patched = runs["patched"]["omegaconf"]
    for step in ("fit", "load_from_checkpoint"):
        assert patched[step]["ok"], patched[step]
    assert patched["load_from_checkpoint"]["hp"]["type"] == "omegaconf.dictconfig.DictConfig"
    warned = runs["patched"]["compatshim_warnings"]
    assert not [w for w in warned if "omegaconf" in w], warned


@pytest.mark.parametrize("kind", KINDS)
def test_hardened_resumes_its_own_checkpoints(runs: dict[str, Any], kind: str) -> None:
    """COMPATSHIM_SAFE_LOAD=1: Lightning 2.4/2.5's weights_only=False load goes through us too."""
    _resumed_as_saved(runs, runs["hardened"], kind)
    if "omegaconf" in runs["hardened"]:
        for step in ("fit", "load_from_checkpoint"):
            assert runs["hardened"]["omegaconf"][step]["ok"], runs["hardened"]["omegaconf"][step]


@pytest.mark.parametrize("step", ["fit", "load_from_checkpoint"])
def test_poisoned_checkpoint(runs: dict[str, Any], step: str) -> None:
    """Hardened: refused, never run. Plain and armed: 2.4/2.5 run the payload (the gap)."""
    hardened = runs["hardened"]["poisoned"][step]
    assert not hardened["ok"] and not hardened["payload_ran"], hardened
    assert hardened["error_type"] == "compatshim.checkpoint.errors.UnsafeCheckpointError"
    assert hardened["refused"][0] in ("os.system", "posix.system"), hardened
    for mode in ("plain", "patched"):
        outcome = runs[mode]["poisoned"][step]
        if lightning_breaks():  # torch's weights-only default refuses it (armed: after us)
            assert not outcome["ok"] and not outcome["payload_ran"], (mode, outcome)
        else:  # Lightning's own weights_only=False: the payload runs, armed or not
            assert outcome["ok"] and outcome["payload_ran"], (mode, outcome)
