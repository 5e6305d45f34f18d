"""``torch-load-safe-globals``: a weights-only refusal is retried by compatshim's loader.

In-process mechanics on the installed torch; the frameworks' own resume paths
are in tests/resume.
"""

from __future__ import annotations

import argparse
import io
import pickle
import warnings
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from compatshim.patches import torch_load_safe_globals as patch  # noqa: E402

PATCH = "torch-load-safe-globals"
DEFAULT_IS_WEIGHTS_ONLY = tuple(int(p) for p in torch.__version__.split(".")[:2]) >= (2, 6)
needs_default = pytest.mark.skipif(
    not DEFAULT_IS_WEIGHTS_ONLY, reason=f"torch {torch.__version__} defaults to weights_only=False"
)


@pytest.fixture
def installed() -> Any:
    import compatshim

    compatshim.uninstall([PATCH])
    original = torch.load
    safe_globals = list(torch.serialization.get_safe_globals()) if DEFAULT_IS_WEIGHTS_ONLY else []
    compatshim.install(include=[PATCH])
    yield compatshim
    compatshim.uninstall([PATCH])
    assert torch.load is original and torch.serialization.load is original
    if DEFAULT_IS_WEIGHTS_ONLY:
        assert torch.serialization.get_safe_globals() == safe_globals


def _saved(obj: Any) -> io.BytesIO:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return buffer


def _retries() -> list[str]:
    from compatshim import _decisions

    return [line for line in _decisions.recent(PATCH) if ": retried" in line]


def test_probe_finds_the_weights_only_default() -> None:
    import compatshim

    compatshim.uninstall([PATCH])
    assert patch.probe(torch) is DEFAULT_IS_WEIGHTS_ONLY


def test_install_twice_wraps_once_and_uninstall_restores(installed: Any) -> None:
    installed.install(include=[PATCH])
    (row,) = [r for r in installed.status() if r.name == PATCH]
    assert row.applied is DEFAULT_IS_WEIGHTS_ONLY
    if DEFAULT_IS_WEIGHTS_ONLY:
        assert row.fixed
        assert torch.load is torch.serialization.load
        assert not hasattr(torch.load.__compatshim_original__, "__compatshim_original__")


@needs_default
def test_the_probe_through_the_wrapper_is_named_in_the_decisions(installed: Any) -> None:
    assert patch.probe(torch) is False  # fixed: the wrapper's retry loads the probe checkpoint
    (line, *_) = reversed(_retries())
    assert "the patch's own probe checkpoint" in line and "BytesIO" not in line


@needs_default
def test_refused_types_load_as_saved(installed: Any, tmp_path: Path) -> None:
    np = pytest.importorskip("numpy")
    path = tmp_path / "hparams.ckpt"
    torch.save(
        {"hparams": argparse.Namespace(lr=0.1), "rng": np.random.get_state(), "w": torch.ones(2)},
        path,
    )
    loaded = torch.load(path, map_location="cpu")
    assert type(loaded["hparams"]) is argparse.Namespace and loaded["hparams"].lr == 0.1
    assert (
        np.array_equal(loaded["rng"][1], np.random.get_state()[1]) or loaded["rng"][0] == "MT19937"
    )
    assert torch.equal(loaded["w"], torch.ones(2))
    assert any(str(path) in line for line in _retries())


@needs_default
def test_a_file_object_is_rewound_to_where_it_stood(installed: Any) -> None:
    stream = _saved({"hparams": argparse.Namespace(step=3)})  # torch reads it to the end first
    assert torch.load(stream)["hparams"].step == 3


@needs_default
def test_explicit_weights_only_false_is_left_alone(installed: Any) -> None:
    before = len(_retries())
    loaded = torch.load(_saved({"hparams": argparse.Namespace(a=1)}), weights_only=False)
    assert loaded["hparams"].a == 1 and len(_retries()) == before


@needs_default
def test_a_plain_state_dict_never_retries(installed: Any) -> None:
    before = len(_retries())
    torch.load(_saved(torch.nn.Linear(2, 2).state_dict()))
    assert len(_retries()) == before


class _RunsCode:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> Any:
        return (Path.write_text, (self.marker, "ran"))


@needs_default
@pytest.mark.parametrize("warnings_are_errors", [False, True])
def test_refused_by_both_raises_torchs_error_and_warns(
    installed: Any, tmp_path: Path, warnings_are_errors: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    marker = tmp_path / "marker"
    path = tmp_path / "evil.ckpt"
    torch.save({"x": _RunsCode(marker)}, path)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("error" if warnings_are_errors else "always")
        with pytest.raises(pickle.UnpicklingError, match=r"^Weights only load failed") as raised:
            torch.load(path)
    assert not marker.exists()  # no code from the file ran, in either loader
    (note,) = raised.value.__notes__
    assert "compatshim.checkpoint.load refused it too" in note and "global" in note
    if warnings_are_errors:  # the warning cannot replace torch's error: it goes to stderr
        assert "CheckpointRefusedWarning" in capsys.readouterr().err
    else:
        assert [w.category for w in seen] == [patch.CheckpointRefusedWarning]
        assert str(path) in str(seen[0].message)


@needs_default
def test_an_unseekable_stream_keeps_torchs_own_error(installed: Any) -> None:
    """torch needs seek/tell before it unpickles anything: its error passes through, no retry."""

    class Forward(io.RawIOBase):
        def __init__(self, data: bytes) -> None:
            self._data = io.BytesIO(data)

        def readable(self) -> bool:
            return True

        def readinto(self, b: Any) -> int:
            return self._data.readinto(b)

    data = _saved({"hparams": argparse.Namespace(a=1)}).getvalue()
    before = list(installed.status())
    with warnings.catch_warnings(record=True) as seen, pytest.raises(io.UnsupportedOperation):
        torch.load(io.BufferedReader(Forward(data)))
    assert seen == [] and list(installed.status()) == before  # no retry, no refusal recorded
