"""Resume a DCP checkpoint written by N gloo ranks on M ranks (issue 25 item 4).

Model, AdamW, StepLR and a replicated EMA go through DCP (``get_state_dict`` /
``set_state_dict``, resharded at load); the RNG state through
``compatshim.rng.save/load``. The saving run goes on past its checkpoint and is
the uninterrupted run: the resumed run's losses, parameters and EMA must equal
it within float tolerance (same global batch, so the numerics are kept), step
counters must continue, and the RNG streams follow ``compatshim.rng``'s policy:
ranks present in the save continue their own stream bit for bit, new ranks get
a derived one, and a changed world size is warned about.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from packaging.version import Version

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed.checkpoint.state_dict")  # torch >= 2.2

from tests.dcpresume.job import train  # noqa: E402
from tests.harness.dist import run_ranks  # noqa: E402
from tests.harness.fsdp2 import fsdp2_cpu_problem  # noqa: E402

SAVE_AT, STEPS = 2, 4
TIMEOUT = 240.0
_NO_FSDP2 = fsdp2_cpu_problem()
LAYOUTS = [
    "ddp",
    pytest.param("fsdp2", marks=pytest.mark.skipif(_NO_FSDP2 is not None, reason=str(_NO_FSDP2))),
]

_saved: dict[tuple[str, int, str], list[dict[str, Any]]] = {}


def _save_run(layout: str, world: int, root: Path) -> tuple[Path, list[dict[str, Any]]]:
    """One saving (= uninterrupted) run per layout and world size, shared by the cases."""
    key = (layout, world, str(root))
    folder = root / f"{layout}-{world}"
    if key not in _saved:
        _saved[key] = run_ranks(
            train, world, args=(layout, str(folder), SAVE_AT, STEPS, False), timeout=TIMEOUT
        )
    return folder, _saved[key]


def _close(got: Any, want: Any) -> None:
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("dcp-resume")


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize(("saved_on", "resumed_on"), [(2, 1), (1, 2), (2, 4), (4, 2)])
def test_resume_on_another_world_size(
    layout: str, saved_on: int, resumed_on: int, root: Path
) -> None:
    folder, before = _save_run(layout, saved_on, root)
    after = run_ranks(
        train, resumed_on, args=(layout, str(folder), SAVE_AT, STEPS, True), timeout=TIMEOUT
    )
    for rank, got in enumerate(after):
        # step counters continue: AdamW's per-param step, the scheduler's epoch
        assert got["optim_steps"] == [float(SAVE_AT)], got["optim_steps"]
        assert got["sched_epoch"] == SAVE_AT
        # losses of the resumed steps equal the uninterrupted run's (same global batch)
        assert sorted(got["losses"]) == list(range(SAVE_AT, STEPS))
        for step, loss in got["losses"].items():
            assert loss == pytest.approx(before[0]["losses"][step], rel=1e-5, abs=1e-7), step
        for name, value in got["params"].items():
            _close(value, before[0]["params"][name])
        # the EMA continues: replicated (DDP) or sharded like the model (FSDP2), regathered
        for name, value in got["ema"].items():
            _close(value, before[0]["ema"][name])
        # RNG: the policy of compatshim.rng for a changed world size
        rng = got["rng"]
        assert rng["saved_world"] == saved_on
        assert "RNGStateWarning" in rng["warned"], "a changed world size is warned about"
        if rank < saved_on:
            assert "torch_cpu" in rng["restored"] and not rng["derived"], rng
            assert got["draws"] == {s: before[rank]["draws"][s] for s in got["draws"]}
        else:
            assert "torch_cpu" in rng["derived"], rng
            saved_streams = [[r["draws"][s] for s in got["draws"]] for r in before]
            assert list(got["draws"].values()) not in saved_streams, "a new rank reused a stream"


@pytest.mark.parametrize("layout", LAYOUTS)
def test_resume_on_the_same_world_size_is_exact(layout: str, root: Path) -> None:
    folder, before = _save_run(layout, 2, root)
    after = run_ranks(train, 2, args=(layout, str(folder), SAVE_AT, STEPS, True), timeout=TIMEOUT)
    for rank, got in enumerate(after):
        assert not got["rng"]["derived"] and got["rng"]["warned"] == []
        assert got["draws"] == {s: before[rank]["draws"][s] for s in got["draws"]}
        for step, loss in got["losses"].items():
            assert loss == before[0]["losses"][step]


# gloo's reduce_scatter_tensor summed whatever ReduceOp it was given (pytorch issue 162338):
# seen in 2.2.2, 2.4.1, 2.5.1, 2.6.0, 2.7.1, 2.8.0; averaging in 2.9.0, 2.9.1, 2.10-2.15
_GLOO_RS_SUMS = (Version("2.2"), Version("2.9"))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_uninterrupted_runs_agree_across_world_sizes(layout: str, root: Path) -> None:
    """What the comparisons above rest on: one global batch, so one gradient at any world size.

    AdamW hides a gradient scaled by a constant, so losses alone would not show the summed
    FSDP2 gradients of torch 2.2-2.8's gloo (N times the mean); the job's probe must see them.
    """
    one = _save_run(layout, 1, root)[1][0]
    release = Version(Version(torch.__version__).base_version)
    for world in (2, 4):
        got = _save_run(layout, world, root)[1][0]
        for name, value in got["grads"].items():
            _close(value, one["grads"][name])
        for step, loss in got["losses"].items():
            assert loss == pytest.approx(one["losses"][step], rel=1e-5, abs=1e-7), (world, step)
        if layout == "fsdp2":
            low, high = _GLOO_RS_SUMS
            # armed, compatshim's torch-gloo-reduce-scatter-op patch makes it average
            expected = low <= release < high and not got["gloo_patch"]
            assert got["reduce_scatter_sums"] == expected, (release, got["gloo_patch"])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_sharded_save_pays_for_its_chunks_many_times_over(layout: str, root: Path) -> None:
    """The hardened readers let a ``.metadata`` ask torch for one read item per
    ``CHUNK_BYTES`` of it: what torch writes at 4 ranks (FSDP2: every tensor in 4 chunks,
    each with its storage entry) must stay far inside that, or a real folder is refused."""
    from compatshim.checkpoint._dcp_folder import load_folder_metadata
    from compatshim.checkpoint._dcp_records import read_folder
    from compatshim.checkpoint._limits import CHUNK_BYTES

    folder = _save_run(layout, 4, root)[0]
    load_folder_metadata(folder)
    tensors = read_folder(folder).tensors().values()
    chunks = sum(len(tensor.chunks) for tensor in tensors)
    size = (folder / ".metadata").stat().st_size
    if layout == "fsdp2":  # each rank's shard of a parameter and its AdamW state: a chunk
        assert max(len(tensor.chunks) for tensor in tensors) == 4
    assert size >= 3 * CHUNK_BYTES * chunks, f"{size} bytes for {chunks} chunks"
