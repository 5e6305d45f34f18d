"""compatshim files written under other torch / numpy releases load and continue exactly here.

``fixtures/own`` holds one file per pinned writer (torch 2.13 + numpy 2.4,
torch 2.13 + numpy 1.26, torch 2.1 + numpy 1.26, made by ``make_own.py``);
every env of the matrix loads all of them, so 2.13/numpy 2 -> 2.1/numpy 1.26
and back are both exercised.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

pytest.importorskip("torch")

import numpy as np
import torch

import compatshim.rng as rng

OWN = Path(__file__).parent / "fixtures" / "own"
FILES = sorted(OWN.glob("*.pt"))


def test_fixtures_cover_both_numpy_majors_and_old_and_new_torch() -> None:
    names = " ".join(p.name for p in FILES)
    assert "numpy1." in names and "numpy2." in names
    assert "torch2.1." in names and "torch2.13." in names


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_weights_only_load_accepts_the_file(path: Path) -> None:
    loaded = torch.load(path, weights_only=True)
    assert loaded["format"] == "compatshim.rng.file" and loaded["world_size"] == 1


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_file_from_another_release_continues_exactly(path: Path) -> None:
    expected = json.loads(path.with_suffix(".json").read_text())
    report = rng.load(path)
    assert report.exact
    got = {
        "python": [random.random() for _ in range(4)],
        "numpy": [*np.random.rand(4).tolist(), float(np.random.randn())],
        "torch": torch.rand(4, dtype=torch.float64).tolist(),
    }
    assert got == expected
