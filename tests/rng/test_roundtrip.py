"""capture -> draw -> restore -> the same draws, on whatever torch/numpy this env pins."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

import torch

import compatshim.rng as rng
from tests.rng.workers import draws


def test_capture_restore_replays_every_cpu_generator() -> None:
    state = rng.capture()
    first = draws()
    report = rng.restore(state)
    assert draws() == first
    assert report.exact and not report.mismatch
    assert set(report.restored) >= {"python", "numpy", "torch_cpu"}


def test_capture_under_another_numpy_bit_generator_skips_numpy() -> None:
    """After ``np.random.set_bit_generator(PCG64())`` (numpy 1.25+) capture() raised
    ``ValueError: too many values to unpack``: numpy's legacy get_state() is a dict then."""
    np = pytest.importorskip("numpy")
    if not hasattr(np.random, "set_bit_generator"):
        pytest.skip("numpy < 1.25 has no set_bit_generator")
    previous = np.random.get_bit_generator()
    np.random.set_bit_generator(np.random.PCG64(5))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # numpy's RuntimeWarning about legacy=True too
            state = rng.capture()
        assert state["numpy"] is None and state["python"] is not None
        with pytest.warns(rng.RNGStateWarning):
            report = rng.restore(state)
        assert not report.exact
        assert report.skipped == ("numpy (bit generator 'PCG64': only MT19937 is restored)",)
    finally:
        np.random.set_bit_generator(previous)


def test_restore_twice_is_idempotent() -> None:
    state = rng.capture()
    rng.restore(state)
    first = draws()
    rng.restore(state)
    assert draws() == first


def test_state_is_plain_and_loads_weights_only(tmp_path: Path) -> None:
    model = torch.nn.Linear(2, 2)  # built first: its init draws from torch's generator
    state = rng.capture()
    checkpoint = {"model": model.state_dict(), "rng": state}
    torch.save(checkpoint, tmp_path / "ckpt.pt")
    loaded = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    first = draws()
    rng.restore(loaded["rng"])
    assert draws() == first


def test_save_load_file_round_trip(tmp_path: Path) -> None:
    path = rng.save(tmp_path / "rng.pt")
    assert torch.load(path, weights_only=True)["world_size"] == 1
    first = draws()
    report = rng.load(path)
    assert draws() == first
    assert report.exact and report.saved_rank == 0 and report.saved_world_size == 1


def test_read_restores_nothing(tmp_path: Path) -> None:
    rng.save(tmp_path / "rng.pt")
    before = draws()  # advances the generators past the saved point
    rng.read(tmp_path / "rng.pt")
    after = draws()
    assert before != after  # read did not rewind anything


def test_import_is_cheap() -> None:
    code = (
        "import sys, compatshim, compatshim.rng; "
        "print('torch' in sys.modules, 'numpy' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_atomic_save_leaves_old_file_on_crash(tmp_path: Path) -> None:
    from compatshim.rng.files import atomic_write

    target = tmp_path / "rng.pt"
    rng.save(target)
    good = target.read_bytes()

    def torn(file: object) -> None:
        file.write(b"PK\x03\x04 half a file")  # type: ignore[attr-defined]
        raise KeyboardInterrupt("killed mid-save")

    with pytest.raises(KeyboardInterrupt):
        atomic_write(target, torn)
    assert target.read_bytes() == good
    assert [p.name for p in tmp_path.iterdir()] == ["rng.pt"]


def test_process_killed_mid_save_leaves_no_torn_file(tmp_path: Path) -> None:
    target = tmp_path / "rng.pt"
    rng.save(target)
    code = f"""
import os, torch, compatshim.rng as rng
from compatshim.rng import files
real = torch.save
def dying_save(obj, f, *a, **k):
    f.write(b"PK\\x03\\x04 torn")
    f.flush()
    os._exit(9)
torch.save = dying_save
rng.save({str(target)!r})
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 9, proc.stderr
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rng.load(target)  # still the complete earlier file
    assert torch.load(target, weights_only=True)["format"] == "compatshim.rng.file"


def _warned_at(call: Any) -> list[tuple[str, int]]:
    """(file, line) of each RNGStateWarning that ``call`` issues."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call()
    return [(w.filename, w.lineno) for w in caught if issubclass(w.category, rng.RNGStateWarning)]


def test_the_mismatch_warning_names_the_callers_line() -> None:
    """Through ``restore`` and through ``load`` (which calls it) alike, the warning points at
    the line that called compatshim, not at compatshim's own files (issue 38 item 5). A plain
    pickle holds no torch state: torch's generator is skipped, a mismatch."""
    plain = Path(__file__).parent / "fixtures" / "np1" / "numpy1_plain_p2.pkl"
    state = rng.read(plain)
    line = sys._getframe().f_lineno
    by_restore = _warned_at(lambda: rng.restore(state))
    by_load = _warned_at(lambda: rng.load(plain))
    assert by_restore == [(__file__, line + 1)], by_restore
    assert by_load == [(__file__, line + 2)], by_load
