"""Overhead of the ``torch-load-safe-globals`` wrapper on loads torch accepts (a state dict).

    python bench/bench_torch_load_patch.py

Alternates the original ``torch.load`` and the wrapped one on the same
in-memory state dict, and prints medians and their ratio.
"""

from __future__ import annotations

import io
import statistics
import time

import torch

from compatshim.patches.torch_load_safe_globals import _wrap


def main(repeats: int = 300) -> None:
    state = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(8)]).state_dict()
    buffer = io.BytesIO()
    torch.save(state, buffer)
    data = buffer.getvalue()
    # not hardened; torch_checks: torch >= 2.6 (the bench-torch2.13 env) reads weights-only first
    original, wrapped = torch.load, _wrap(torch.load, hardened=False, torch_checks=True)
    times: dict[str, list[float]] = {"original": [], "wrapped": []}
    for _ in range(repeats):
        for name, load in (("original", original), ("wrapped", wrapped)):
            stream = io.BytesIO(data)
            start = time.perf_counter()
            load(stream)
            times[name].append(time.perf_counter() - start)
    medians = {k: statistics.median(v) * 1e6 for k, v in times.items()}
    print(f"torch {torch.__version__}, state dict {len(data) / 1e3:.0f} kB, {repeats} loads each")
    print(
        f"original {medians['original']:.1f} us, wrapped {medians['wrapped']:.1f} us, "
        f"ratio {medians['wrapped'] / medians['original']:.3f}"
    )


if __name__ == "__main__":
    main()
