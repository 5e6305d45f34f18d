"""Wrong arguments to save / load / read / restore: an error naming the argument, before any
file is read or written and before any generator is set."""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any, Callable

import pytest

pytest.importorskip("torch")

import numpy as np
import torch

import compatshim.rng as rng
from tests.rng.test_safety import Exploit


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    return rng.save(tmp_path / "rng.pt")


@pytest.mark.parametrize("value", ["no", "", 0, 1, None])
def test_trusted_that_is_not_a_bool_runs_no_code_from_the_file(tmp_path: Path, value: Any) -> None:
    """``if trusted:`` took ``trusted="no"`` as yes and unpickled the file in full."""
    sentinel = tmp_path / "pwned"
    path = tmp_path / "rng_state.pth"
    path.write_bytes(pickle.dumps({"python": Exploit(sentinel)}))
    for call in (rng.load, rng.read):
        with pytest.raises(TypeError, match=r"^trusted: expected True or False, got "):
            call(path, trusted=value)
    assert not sentinel.exists()


@pytest.mark.parametrize("value", ["no", 0, 1, None])
def test_warn_that_is_not_a_bool_is_a_type_error(saved: Path, value: Any) -> None:
    before = torch.get_rng_state()
    torch.rand(1)
    with pytest.raises(TypeError, match=r"^warn: expected True or False, got "):
        rng.load(saved, warn=value)
    with pytest.raises(TypeError, match=r"^warn: expected True or False, got "):
        rng.restore(rng.capture(), warn=value)
    assert not torch.equal(torch.get_rng_state(), before)  # nothing was restored


@pytest.mark.parametrize("call", [rng.save, rng.load, rng.read])
@pytest.mark.parametrize(
    ("path", "error", "shown"),
    [(None, TypeError, "None"), (3, TypeError, "3"), (b"rng.pt", TypeError, "b'rng.pt'"),
     ("", ValueError, "''")],
)  # fmt: skip
def test_a_path_that_is_not_one_names_path(
    call: Callable[..., Any], path: Any, error: type[Exception], shown: str
) -> None:
    with pytest.raises(error, match=r"^path: expected a file path") as caught:
        call(path)
    assert str(caught.value).endswith(f"got {shown}")


@pytest.mark.parametrize(("state", "shown"), [([1], "a list"), ("abc", "'abc'"), (3, "3")])
def test_save_state_that_is_not_a_dict_names_state(tmp_path: Path, state: Any, shown: str) -> None:
    with pytest.raises(TypeError, match=r"^state: expected a state dict") as caught:
        rng.save(tmp_path / "rng.pt", state=state)
    assert str(caught.value).endswith(f"got {shown}")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("state", "shown"),
    [("rng.pt", "'rng.pt'"), (Path("rng.pt"), "a PosixPath"), (None, "None"), ([1], "a list")],
)
def test_restore_state_that_is_not_a_dict_names_state(state: Any, shown: str) -> None:
    """``restore("rng.pt")`` (load's argument) was an RNGStateError saying no RNG state was
    found "in the object", as if a file had been read."""
    if isinstance(state, Path) and os.name == "nt":
        shown = "a WindowsPath"
    before = torch.get_rng_state()
    with pytest.raises(TypeError, match=r"^state: expected an RNG state dict") as caught:
        rng.restore(state)
    assert f"got {shown}" in str(caught.value) and not isinstance(caught.value, ValueError)
    assert ("rng.load(path)" in str(caught.value)) == isinstance(state, (str, Path))
    assert torch.equal(torch.get_rng_state(), before)


@pytest.mark.parametrize(
    ("arguments", "error", "message"),
    [
        ({"rank": "0"}, TypeError, "rank: expected an int or None, got '0'"),
        ({"rank": True, "world_size": 2}, TypeError, "rank: expected an int or None, got True"),
        ({"rank": 1.0, "world_size": 2}, TypeError, "rank: expected an int or None, got 1.0"),
        ({"world_size": "2"}, TypeError, "world_size: expected an int or None, got '2'"),
        ({"rank": 0, "world_size": False}, TypeError, "world_size: expected an int or None"),
        ({"rank": -1}, ValueError, "rank: expected a non-negative int or None, got -1"),
        ({"world_size": 0}, ValueError, "world_size: expected a positive int or None, got 0"),
    ],
)
def test_rank_and_world_size_are_checked_and_named(
    saved: Path, arguments: dict[str, Any], error: type[Exception], message: str
) -> None:
    for call, target in ((rng.load, saved), (rng.restore, rng.capture())):
        with pytest.raises(error) as caught:
            call(target, **arguments)
        assert str(caught.value).startswith(message)
        assert not isinstance(caught.value, rng.RNGStateError)


def test_load_checks_its_arguments_before_reading_the_file(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=r"^rank: "):
        rng.load(tmp_path / "missing.pt", rank="0")


def test_integer_like_ranks_still_work(saved: Path) -> None:
    report = rng.load(saved, rank=np.int64(0), world_size=np.int64(1))
    assert report.exact and report.rank == 0 and type(report.rank) is int


def test_a_policy_is_checked_even_where_planning_would_not_read_it() -> None:
    """A state from capture never reaches the world-size planning that checked the name."""
    with pytest.raises(ValueError, match=r"^on_world_size_mismatch must be one of"):
        rng.restore(rng.capture(), on_world_size_mismatch="bogus")  # type: ignore[arg-type]


def test_save_into_a_missing_folder_names_the_path_given(tmp_path: Path) -> None:
    path = tmp_path / "no" / "rng.pt"
    with pytest.raises(FileNotFoundError) as caught:
        rng.save(path)
    assert caught.value.filename == str(path) and ".tmp" not in str(caught.value)
    assert str(path) in str(caught.value)
    assert not list(tmp_path.iterdir())


def test_save_onto_a_folder_names_the_folder_and_leaves_no_temporary(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoint"
    folder.mkdir()
    for given in (folder, str(folder)):
        with pytest.raises(IsADirectoryError) as caught:
            rng.save(given)
        assert caught.value.filename == os.fspath(given) and ".tmp" not in str(caught.value)
        assert caught.value.filename2 is None
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint"]
    assert not list(folder.iterdir())


def _without_format(obj: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in obj.items() if key != "format"}


def test_a_state_without_its_format_says_so(tmp_path: Path) -> None:
    """It was read as a python/numpy layout: 'invalid RNG state at state.python'."""
    state = _without_format(rng.capture())
    with pytest.raises(rng.RNGStateError, match=r"^the RNG state lacks its 'format' key"):
        rng.restore(state)
    with pytest.raises(rng.RNGStateError, match=r"at state\['rng'\] lacks its 'format' key"):
        rng.restore({"rng": state, "step": 3})
    torch.save({"model": {}, "rng": state}, tmp_path / "ckpt.pt")
    with pytest.raises(rng.RNGStateError, match=r"'compatshim\.rng\.state'"):
        rng.read(tmp_path / "ckpt.pt")


def test_a_saved_file_without_its_format_says_so(tmp_path: Path) -> None:
    saved = rng.read(rng.save(tmp_path / "rng.pt"))
    torch.save(_without_format(saved), tmp_path / "edited.pt")
    with pytest.raises(rng.RNGStateError, match=r"lacks its 'format' key.*'compatshim\.rng\.file'"):
        rng.load(tmp_path / "edited.pt")
