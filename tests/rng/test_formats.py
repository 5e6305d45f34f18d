"""Files written by real transformers, accelerate and Lightning releases (and Sana-style dicts)
load safely and restore exactly; see fixtures/README.md for how and with what they were made."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

import torch
from packaging.version import Version

import compatshim.rng as rng
from compatshim.checkpoint import load as load_checkpoint
from tests.rng.workers import draws

FIXTURES = Path(__file__).parent / "fixtures"
WRITERS = ["np1", "np2"]  # numpy 1.26.4 and numpy 2.4.6 (see each folder's versions.json)


def expected(writer: str) -> dict[str, Any]:
    return dict(json.loads((FIXTURES / writer / "expected.json").read_text()))


def cases() -> list[Any]:
    return [
        pytest.param(writer, name, id=f"{writer}/{name}")
        for writer in WRITERS
        for name in sorted(expected(writer))
    ]


def restore_quietly(state: Any, **kwargs: Any) -> tuple[rng.RestoreReport, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = rng.restore(state, **kwargs)
    return report, [str(w.message) for w in caught if issubclass(w.category, rng.RNGStateWarning)]


@pytest.mark.parametrize(("writer", "name"), cases())
def test_fixture_reads_safely_and_continues_the_saved_streams(writer: str, name: str) -> None:
    found = rng.read(FIXTURES / writer / name)  # restricted unpickler: trusted=False
    report, warned = restore_quietly(found)
    got, want = draws(), expected(writer)[name]
    assert {"python", "numpy"} <= set(report.restored)
    if "plain" in name:  # no torch state in a plain pickle: torch is reported, not restored
        assert "torch_cpu (not in the state)" in report.skipped
        got.pop("torch"), want.pop("torch")
    else:
        assert "torch_cpu" in report.restored
    assert got == want
    assert len(warned) <= 1  # at most one warning, and only for a real mismatch
    assert bool(warned) == report.mismatch


@pytest.mark.parametrize("writer", WRITERS)
@pytest.mark.parametrize("folder", ["transformers_dist", "accelerate"])
def test_per_rank_checkpoint_folder_restores_each_rank(writer: str, folder: str) -> None:
    found = rng.read(FIXTURES / writer / folder)
    assert found["world_size"] == 3 and found["source"] == folder.split("_")[0]
    for rank, file in enumerate(sorted((FIXTURES / writer / folder).iterdir())):
        report, warned = restore_quietly(found, rank=rank, world_size=3)
        assert report.exact and report.saved_rank == rank and not warned
        assert draws() == expected(writer)[f"{folder}/{file.name}"]


@pytest.mark.parametrize("writer", WRITERS)
def test_per_rank_folder_resumed_on_more_ranks_derives_the_new_one(writer: str) -> None:
    found = rng.read(FIXTURES / writer / "transformers_dist")
    report, warned = restore_quietly(found, rank=3, world_size=4)
    assert report.saved_rank is None and "torch_cpu" in report.derived
    assert len(warned) == 1 and "world size changed 3 -> 4" in warned[0]
    streams = {json.dumps(draws())}
    for rank in range(3):
        restore_quietly(found, rank=rank, world_size=4)
        streams.add(json.dumps(draws()))
    assert len(streams) == 4  # the derived rank replays no saved rank's stream


@pytest.mark.parametrize("writer", WRITERS)
def test_sana_seven_gpu_state_on_this_machine(writer: str) -> None:
    """Sana issue 92: 7 CUDA states, fewer GPUs. Never IndexError; one warning; CPU exact."""
    for name in ("sana_7gpu.pth", "sana_7gpu_torch2.0_layout.pth"):
        found = rng.read(FIXTURES / writer / name)
        cuda = found["ranks"][0]["cuda"]
        assert len(cuda) == 7 and all(t.numel() == 16 for t in cuda)  # 2.0 layout converted
        report, warned = restore_quietly(found)
        assert draws() == expected(writer)[name]
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        assert len(report.skipped) == 7 - min(gpus, 7)
        assert len(warned) == 1 and f"CUDA device count changed 7 -> {gpus}" in warned[0]
        with pytest.raises(rng.RNGStateError, match="7 cuda generator state"):
            rng.restore(found, on_device_mismatch="error")


def test_transformers_single_cuda_tensor_becomes_device_zero(tmp_path: Path) -> None:
    found = rng.read(FIXTURES / "np2" / "transformers_single" / "rng_state.pth")
    state = found["ranks"][0]
    # compatshim's loader reads numpy 2 pickles under numpy 1.24 too (no numpy._core there)
    raw = load_checkpoint(FIXTURES / "np2" / "transformers_single" / "rng_state.pth")
    raw["cuda"] = torch.zeros(16, dtype=torch.uint8)  # what a one-GPU run stores
    torch.save(raw, tmp_path / "rng_state.pth")
    assert len(rng.read(tmp_path / "rng_state.pth")["ranks"][0]["cuda"]) == 1
    assert state["cuda"] == []


def test_lightning_state_is_found_inside_the_fabric_checkpoint() -> None:
    found = rng.read(FIXTURES / "np2" / "lightning_fabric.ckpt")
    assert found["source"] == "lightning"


@pytest.mark.skipif(Version(torch.__version__.split("+")[0]) < Version("2.6"), reason="torch < 2.6")
def test_hazard_is_real_weights_only_refuses_the_frameworks_numpy_state() -> None:
    """Why read() exists: torch >= 2.6's default torch.load refuses these files."""
    with pytest.raises(Exception, match="numpy"):
        torch.load(FIXTURES / "np2" / "transformers_single" / "rng_state.pth")


def test_unknown_layout_error_lists_the_known_ones(tmp_path: Path) -> None:
    torch.save({"weights": torch.zeros(2)}, tmp_path / "model.pt")
    with pytest.raises(rng.RNGStateError, match=r"transformers:.*accelerate:.*lightning:.*sana:"):
        rng.read(tmp_path / "model.pt")


def test_legacy_non_zip_torch_file_reads_safely(tmp_path: Path) -> None:
    import random

    import numpy as np

    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "cpu": torch.get_rng_state(),
    }
    torch.save(state, tmp_path / "rng_state.pth", _use_new_zipfile_serialization=False)
    want = draws()
    assert rng.load(tmp_path / "rng_state.pth").exact
    assert draws() == want


def test_a_lightning_file_with_another_numpy_bit_generator_restores_the_rest(
    tmp_path: Path,
) -> None:
    """After np.random.set_bit_generator(PCG64(...)) (numpy 1.25+), Lightning's
    _collect_rng_states() saves numpy's state as a dict: the whole file was refused, where
    capture() leaves such a state out and restores the rest, not exact."""
    import random

    np = pytest.importorskip("numpy")
    if not hasattr(np.random, "set_bit_generator"):
        pytest.skip(f"numpy {np.__version__} has no set_bit_generator (1.25+)")
    pcg = {"bit_generator": "PCG64", "state": {"state": 5, "inc": 7}, "has_uint32": 0,
           "uinteger": 0}  # fmt: skip
    state = {"torch": torch.get_rng_state(), "numpy": pcg, "python": random.getstate()}
    torch.save(state, tmp_path / "rng.pt")
    want = draws()
    report = rng.load(tmp_path / "rng.pt", warn=False)
    assert {"python", "torch_cpu"} <= set(report.restored), report.summary()
    assert not report.exact
    assert "numpy (bit generator 'PCG64': only MT19937 is restored)" in report.skipped
    got = draws()
    assert (got["python"], got["torch"]) == (want["python"], want["torch"])


@pytest.mark.parametrize(
    ("names", "pattern"),
    [
        (("rng_state_0.pth", "rng_state_00.pth"), r"rng_state_0\.pth.*rng_state_00\.pth"),
        (("rng_state_1.pth", "rng_state_0.pth", "rng_state_001.pth"), r"rng_state_001\.pth"),
        (("random_states_0.pkl", "random_states_000.pkl"), r"random_states_0\.pkl"),
    ],
)
def test_two_files_naming_one_rank_are_refused_naming_both(
    tmp_path: Path, names: tuple[str, ...], pattern: str
) -> None:
    """rng_state_0.pth beside rng_state_00.pth: whichever the folder listed last was used.
    transformers and accelerate write unpadded numbers only, so neither is the right one."""
    source = FIXTURES / "np2" / "transformers_dist" / "rng_state_0.pth"
    for name in names:
        (tmp_path / name).write_bytes(source.read_bytes())
    with pytest.raises(rng.RNGStateError, match=rf"two files for rank.*{pattern}"):
        rng.read(tmp_path)


def _whole_run_file(seeds: tuple[int, ...]) -> dict[str, Any]:
    """What ``compatshim.rng.save`` writes at world size ``len(seeds)``: every rank's state."""
    from compatshim.rng.state import make_file

    states = []
    for seed in seeds:
        torch.manual_seed(seed)
        states.append(rng.capture())
    return make_file(states, source="compatshim", world_size=len(states))


def test_a_whole_run_file_named_as_a_rank_file_keeps_every_rank(tmp_path: Path) -> None:
    """rng.save(f"{ckpt}/rng_state_{rank}.pth") at world size 2: rank 0 writes every rank's
    state under rank 0's name. The folder was read as world size 1, rank 1's state dropped."""
    torch.save(_whole_run_file((1, 2)), tmp_path / "rng_state_0.pth")
    found = rng.read(tmp_path)
    assert found["world_size"] == 2 and len(found["ranks"]) == 2
    restored = rng.restore(found, rank=1, world_size=2)
    assert restored.exact and torch.equal(torch.get_rng_state(), found["ranks"][1]["torch_cpu"])


def test_a_whole_run_file_named_rng_state_pth_in_a_folder_keeps_every_rank(
    tmp_path: Path,
) -> None:
    """The folder's rng_state.pth was given world size 1 whatever it held: 2 ranks' states
    with world size 1, which restore then refused as an invalid file."""
    torch.save(_whole_run_file((1, 2)), tmp_path / "rng_state.pth")
    found = rng.read(tmp_path)
    assert found["world_size"] == 2 and len(found["ranks"]) == 2
    assert rng.restore(found, rank=1, world_size=2).exact
    assert torch.equal(torch.get_rng_state(), found["ranks"][1]["torch_cpu"])


def test_whole_run_files_beside_each_other_are_refused(tmp_path: Path) -> None:
    """Two such files: each rank's first state was kept, so rank 1 restored rank 0's stream."""
    for rank in (0, 1):
        torch.save(_whole_run_file((1, 2)), tmp_path / f"rng_state_{rank}.pth")
    with pytest.raises(rng.RNGStateError, match=r"rng_state_0\.pth.*holds 2 rank states"):
        rng.read(tmp_path)


@pytest.mark.parametrize("written_by", ["torch.save", "rng.save"])
def test_a_rank_file_holding_another_ranks_state_is_refused(
    tmp_path: Path, written_by: str
) -> None:
    """rng_state_{rank}.pth with the names swapped, as bare states (torch.save of capture())
    or as one-rank files (rng.save(state=...) outside a process group): the state says which
    rank captured it, and it is not the rank its name says."""
    for rank in (0, 1):
        state = rng.capture()
        state["meta"] = {**state["meta"], "rank": 1 - rank, "world_size": 2}
        path = tmp_path / f"rng_state_{rank}.pth"
        torch.save(state, path) if written_by == "torch.save" else rng.save(path, state=state)
    with pytest.raises(rng.RNGStateError, match=r"rng_state_0\.pth.*rank 1 captured.*rank 0"):
        rng.read(tmp_path)
