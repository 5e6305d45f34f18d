"""Checkpoints written by other torch / numpy releases load here to the same values.

``fixtures/`` holds one folder per writer (torch 2.1 + numpy 1.24, torch 2.4 +
numpy 2.0, torch 2.13 + numpy 1.26, torch 2.15 + numpy 2.4; see
``fixtures/make_fixtures.py``); every checkpoint env loads all of them, so
numpy 2 pickles (``numpy._core``) load under numpy 1.24, which has no
``numpy._core`` at all, and the reverse, without warnings.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

pytest.importorskip("torch")

from compatshim.checkpoint import inspect, load
from tests.checkpoint.helpers import digest

FIXTURES = Path(__file__).parent / "fixtures"
FILES = sorted(p for p in FIXTURES.glob("*/*") if p.suffix in (".pt", ".pkl"))


def test_fixtures_cover_old_and_new_torch_and_both_numpy_majors() -> None:
    folders = {p.parent.name for p in FILES}
    assert any(f.startswith("torch2.1.") and "numpy1." in f for f in folders)
    assert any(f.startswith("torch2.15.") and "numpy2." in f for f in folders)
    assert len(FILES) == 3 * len(folders)


@pytest.mark.parametrize("path", FILES, ids=[f"{p.parent.name}/{p.name}" for p in FILES])
def test_fixture_loads_to_the_values_its_writer_saved(path: Path) -> None:
    expected = json.loads((path.parent / "expected.json").read_text())[path.name]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded = load(path)
    assert json.loads(json.dumps(digest(loaded))) == expected


@pytest.mark.parametrize("path", FILES, ids=[f"{p.parent.name}/{p.name}" for p in FILES])
def test_inspect_tells_the_writer(path: Path) -> None:
    info = inspect(path)
    assert info.loadable, info.unknown
    numpy_major = int(path.parent.name.split("_numpy")[1].split(".")[0])
    assert info.writer.numpy_major == numpy_major
    assert info.container == {".pkl": "pickle", ".pt": "zip"}[path.suffix] or path.stem == "legacy"
