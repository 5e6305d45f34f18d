"""Every case of the malicious corpus: no code runs, only library errors, no state changes.

For each hostile file (``corpus.CASES``): the marker file never appears, no
``.patch`` file is written, ``load`` raises the expected library error (or
loads harmlessly), ``inspect`` raises nothing but CheckpointError, and the
objects an attacker would target are unchanged afterwards (torch's rebuild
functions and their defaults, argparse.Namespace, OrderedDict, the copyreg
extension registry, sys.modules). Memory and recursion bombs also run in a
fresh interpreter whose peak RSS must stay within 200 MB of a baseline.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import copyreg
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

import torch
import torch._utils

from compatshim.checkpoint import CheckpointError, UnsafeCheckpointError, inspect, load
from tests.checkpoint.corpus import CASES, EXTENSION_CODES, MEMORY, Case
from tests.checkpoint.helpers import peak_rss_mb

REBUILDS = [name for name in dir(torch._utils) if name.startswith("_rebuild")]
NEW_MODULES_ALLOWED = ("numpy", "torch", "compatshim", "encodings.", "argparse", "pathlib")
MEMORY_BUDGET_MB = 200


def snapshot() -> dict[str, Any]:
    functions = [getattr(torch._utils, name) for name in REBUILDS]
    return {
        "defaults": [f.__defaults__ for f in functions],
        "function_dicts": [dict(vars(f)) for f in functions],
        "namespace": dict(vars(argparse.Namespace)),
        "ordered_dict": set(vars(collections.OrderedDict)),
        "float32": dir(torch.float32),
        "extensions": dict(copyreg._extension_registry),  # type: ignore[attr-defined]
        "modules": set(sys.modules),
    }


def assert_unchanged(before: dict[str, Any], after: dict[str, Any]) -> None:
    new_modules = after.pop("modules") - before.pop("modules")
    unexpected = [m for m in new_modules if not m.startswith(NEW_MODULES_ALLOWED)]
    assert not unexpected, f"a load imported {unexpected}"
    assert before == after


@pytest.fixture
def extensions() -> Iterator[None]:
    """Register copyreg extension codes naming system(), as an attacker would hope for."""
    names = [("os", "system"), ("posix", "system"), ("subprocess", "getoutput")]
    for (module, name), code in zip(names, EXTENSION_CODES):
        copyreg.add_extension(module, name, code)
    yield
    for (module, name), code in zip(names, EXTENSION_CODES):
        copyreg.remove_extension(module, name, code)


def attempt(path: Path) -> str:
    try:
        load(path)
    except UnsafeCheckpointError:
        return "unsafe"
    except CheckpointError:
        return "damaged"
    return "loads"


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hostile_file(
    case: Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, extensions: None
) -> None:
    monkeypatch.chdir(tmp_path)  # torch's legacy source check would write .patch files here
    marker = tmp_path / "PWNED"
    path = case.build(marker, tmp_path)
    load(_benign(tmp_path))  # imports what a normal load imports, before the snapshot
    before = snapshot()
    outcome = attempt(path)
    with contextlib.suppress(CheckpointError):
        inspect(path)
    after = snapshot()
    assert not marker.exists(), "code from the file ran"
    assert not list(tmp_path.glob("*.patch")), "a .patch file was written"
    expected = {"either": ("unsafe", "damaged")}.get(case.expect, (case.expect,))
    assert outcome in expected, f"{case.name}: {outcome}, expected {case.expect}"
    assert_unchanged(before, after)


def test_refusal_names_every_refused_global_and_the_file(tmp_path: Path) -> None:
    path = tmp_path / "two.pkl"
    path.write_bytes(b"\x80\x02(cos\nsystem\nclogging\nFileHandler\ncbuiltins\nset\nt.")
    with pytest.raises(UnsafeCheckpointError) as caught:
        load(path)
    message = str(caught.value)
    assert str(path) in message
    assert "os.system" in message and "logging.FileHandler" in message
    assert "builtins.set" not in message
    assert {"os.system", "logging.FileHandler"} <= set(caught.value.refused)


def test_refused_error_is_an_unpickling_error(tmp_path: Path) -> None:
    import pickle

    path = tmp_path / "x.pkl"
    path.write_bytes(b"\x80\x02cos\nsystem\n.")
    with pytest.raises(pickle.UnpicklingError):
        load(path)


def _benign(folder: Path) -> Path:
    path = folder / "benign.pt"
    if not path.exists():
        import numpy as np

        torch.save({"t": torch.ones(2), "a": np.ones(2), "n": argparse.Namespace(x=1)}, path)
    return path


@pytest.fixture(scope="module")
def baseline_mb(tmp_path_factory: pytest.TempPathFactory) -> float:
    path = _benign(tmp_path_factory.mktemp("baseline"))
    peak, _ = peak_rss_mb(f"from compatshim.checkpoint import load\nload({str(path)!r})\n")
    return peak


@pytest.mark.slow
@pytest.mark.parametrize("name", MEMORY)
def test_bomb_stays_within_memory_budget(name: str, tmp_path: Path, baseline_mb: float) -> None:
    case = next(c for c in CASES if c.name == name)
    path = case.build(tmp_path / "PWNED", tmp_path)
    benign = _benign(tmp_path)
    code = f"""
        from compatshim.checkpoint import CheckpointError, load
        load({str(benign)!r})
        try:
            load({str(path)!r})
        except CheckpointError as exc:
            print("ERROR", type(exc).__name__)
        """
    peak, _ = peak_rss_mb(code)
    assert peak - baseline_mb < MEMORY_BUDGET_MB, f"{name}: {peak:.0f} MB vs {baseline_mb:.0f} MB"
