"""At test time, in the rng-frameworks env: the installed transformers, accelerate and Lightning
write RNG files with their own code, and compatshim reads and restores each exactly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

import compatshim.rng as rng
from compatshim._engine.versions import installed_version
from tests.rng.workers import draws

# Installed distributions, not find_spec: tests/lightning would pass for a "lightning" package.
MISSING = [d for d in ("transformers", "accelerate", "lightning") if installed_version(d) is None]
pytestmark = pytest.mark.skipif(
    bool(MISSING), reason=f"needs the rng-frameworks env ({', '.join(MISSING)} not installed)"
)


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    from tests.rng.fixtures import make_fixtures

    out = tmp_path_factory.mktemp("frameworks")
    return out, make_fixtures.write_all(out)


def test_every_file_the_frameworks_wrote_restores_exactly(
    written: tuple[Path, dict[str, Any]],
) -> None:
    out, expected = written
    assert len(expected) >= 12
    for name, want in expected.items():
        report = rng.restore(rng.read(out / name), warn=False)
        got = draws()
        if "plain" in name:
            got.pop("torch"), want.pop("torch")
        assert got == want, name
        assert "python" in report.restored and "numpy" in report.restored


def test_checkpoint_folders_of_three_ranks(written: tuple[Path, dict[str, Any]]) -> None:
    out, expected = written
    for folder, pattern in (
        ("transformers_dist", "rng_state_{}.pth"),
        ("accelerate", "random_states_{}.pkl"),
    ):
        found = rng.read(out / folder)
        assert found["world_size"] == 3
        for rank in range(3):
            assert rng.restore(found, rank=rank, world_size=3).exact
            assert draws() == expected[f"{folder}/{pattern.format(rank)}"]


def test_frameworks_own_restore_agrees_with_compatshim(
    written: tuple[Path, dict[str, Any]],
) -> None:
    """Lightning's _set_rng_states on the same dict lands where compatshim's restore does."""
    import torch
    from lightning.fabric.utilities.seed import _set_rng_states

    out, expected = written
    checkpoint = torch.load(out / "lightning_fabric.ckpt", weights_only=False)
    _set_rng_states(checkpoint["rng_states"])
    theirs = draws()
    rng.load(out / "lightning_fabric.ckpt")
    assert draws() == theirs == expected["lightning_fabric.ckpt"]
