"""Shared helpers for the benchmarks: interleaved repeats, medians, Markdown tables.

Machines here are shared and noisy, so every benchmark runs its contenders
alternately in the same process (or the same batch of child processes) and
reports medians and ratios, never a single wall-clock figure.
"""

from __future__ import annotations

import compileall
import os
import statistics
import subprocess
import sys
import time
from typing import Callable, Sequence


def interleaved(
    contenders: dict[str, Callable[[], object]],
    repeats: int,
    warmup: int = 1,
    rotate: bool = False,
) -> dict[str, list[float]]:
    """Time each contender ``repeats`` times, alternating between them; seconds per call.
    ``rotate``: each round starts one contender later, so none always follows the same
    one (a contender that writes files or fills caches slows whichever runs next)."""
    for _ in range(warmup):
        for fn in contenders.values():
            fn()
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    order = list(contenders.items())
    for round_ in range(repeats):
        shift = round_ % len(order) if rotate else 0
        for name, fn in order[shift:] + order[:shift]:
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


def compile_compatshim(env: dict[str, str] | None = None) -> str:
    """Byte-compile the compatshim a child started with ``env`` imports, as pip does when it
    installs the wheel (uv does not, and PYTHONDONTWRITEBYTECODE may be set): a timing that
    includes importing it is then a user's. Returns the package folder."""
    out = subprocess.run(
        [sys.executable, "-c", "import compatshim as c, os; print(os.path.dirname(c.__file__))"],
        capture_output=True,
        text=True,
        check=True,
        env=os.environ if env is None else env,
    )
    package = out.stdout.strip()
    compileall.compile_dir(package, quiet=1)
    return package
