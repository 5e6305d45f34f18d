"""Shared helpers for the benchmarks: interleaved repeats, medians, Markdown tables.

Machines here are shared and noisy, so every benchmark runs its contenders
alternately in the same process (or the same batch of child processes) and
reports medians and ratios, never a single wall-clock figure.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable, Sequence


def interleaved(
    contenders: dict[str, Callable[[], object]], repeats: int, warmup: int = 1
) -> dict[str, list[float]]:
    """Time each contender ``repeats`` times, alternating between them; seconds per call."""
    for _ in range(warmup):
        for fn in contenders.values():
            fn()
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(repeats):
        for name, fn in contenders.items():
            start = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - start)
    return samples


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"
