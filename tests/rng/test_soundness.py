"""The RNG reader's soundness bugs stay fixed: bounded memory, only RNGStateError, no code run."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")

import numpy as np
import torch

import compatshim.rng as rng


def _transformers_file(path: Path, **overrides: object) -> Path:
    state = {
        "python": __import__("random").getstate(),
        "numpy": np.random.get_state(),
        "cpu": torch.get_rng_state(),
    }
    state.update(overrides)
    torch.save(state, path)
    return path


def test_huge_rank_number_in_a_folder_is_a_clear_error(tmp_path: Path) -> None:
    _transformers_file(tmp_path / "random_states_0.pkl")
    (tmp_path / "random_states_1000000000.pkl").write_bytes(b"x")
    with pytest.raises(rng.RNGStateError, match="not a plausible rank"):
        rng.read(tmp_path)


def test_gap_in_rank_files_names_the_first_missing(tmp_path: Path) -> None:
    for rank in (0, 1, 5000):
        _transformers_file(tmp_path / f"rng_state_{rank}.pth")
    with pytest.raises(
        rng.RNGStateError, match=r"missing for ranks \[2, 3, 4, 5, 6, 7, 8, 9, 10, 11\]"
    ):
        rng.read(tmp_path)


def _peak_rss_mb(code: str) -> float:
    script = textwrap.dedent(code) + textwrap.dedent(
        """
        import resource
        print("PEAK", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return float(done.stdout.split("PEAK")[-1])


def test_expanded_tensor_is_refused_before_any_copy(tmp_path: Path) -> None:
    path = _transformers_file(
        tmp_path / "rng_state.pth", cpu=torch.zeros(1, dtype=torch.uint8).expand(2**31)
    )
    baseline = _peak_rss_mb("import torch, compatshim.rng")
    peak = _peak_rss_mb(
        f"""
        import torch, compatshim.rng as rng
        try:
            rng.read({str(path)!r})
        except rng.RNGStateError as exc:
            assert "elements" in str(exc), exc
        else:
            raise SystemExit("accepted")
        """
    )
    assert peak - baseline < 200, (peak, baseline)


@pytest.mark.parametrize(
    "key",
    [
        np.zeros((2, 312), dtype=np.uint32),
        np.zeros(624, dtype=np.float64),
        np.zeros(3, dtype="U3"),
        np.zeros(0, dtype=np.uint32),
        np.array(5, dtype=np.uint32),
    ],
    ids=["2d", "float", "unicode", "empty", "0d"],
)
def test_odd_numpy_values_raise_rng_state_error(tmp_path: Path, key: np.ndarray) -> None:
    path = _transformers_file(tmp_path / "rng_state.pth", numpy=("MT19937", key, 0, 0, 0.0))
    with pytest.raises(rng.RNGStateError):
        rng.read(path)


def test_numpy_object_array_is_refused(tmp_path: Path) -> None:
    key = np.array([1, "a"], dtype=object)
    path = _transformers_file(tmp_path / "rng_state.pth", numpy=("MT19937", key, 0, 0, 0.0))
    with pytest.raises(rng.RNGStateError, match="object"):
        rng.read(path)


def deep_dict_pickle(keys: tuple[str, ...], depth: int) -> bytes:
    """A protocol-2 pickle of {key: [[[...]]] for key in keys}, ``depth`` lists deep."""
    body = b"\x80\x02}"
    for key in keys:
        raw = key.encode()
        body += b"X" + len(raw).to_bytes(4, "little") + raw
        body += b"]" * depth + b"a" * (depth - 1) + b"s"
    return body + b"."


@pytest.mark.parametrize("depth", [900, 100_000])
def test_deeply_nested_value_gives_rng_state_error_not_recursion_error(
    tmp_path: Path, depth: int
) -> None:
    path = tmp_path / "rng_state.pth"
    path.write_bytes(deep_dict_pickle(("python", "numpy", "cpu"), depth))
    with pytest.raises(rng.RNGStateError):
        rng.read(path)


def test_torchscript_archive_under_an_rng_name_is_refused(tmp_path: Path) -> None:
    marker = tmp_path / "ran"

    class Scripted(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.path = str(marker)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x

    path = tmp_path / "rng_state.pth"
    torch.jit.save(torch.jit.script(Scripted()), str(path))
    with pytest.raises(rng.RNGStateError, match="TorchScript"):
        rng.read(path)
    assert not marker.exists()
