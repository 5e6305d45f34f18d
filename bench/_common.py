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
    balanced: bool = False,
) -> dict[str, list[float]]:
    """Time each contender ``repeats`` times, alternating between them; seconds per call.
    ``balanced``: rounds take their order from :func:`balanced_orders`, so each contender
    goes first, and runs right after each other one, equally often (a contender that
    writes files or fills caches slows whichever runs next; rotating one fixed order,
    as this did before, kept each contender behind the same one in all but one round in
    every ``len(contenders)``); ``repeats`` is then rounded up to whole squares."""
    for _ in range(warmup):
        for fn in contenders.values():
            fn()
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    orders = balanced_orders(len(contenders)) if balanced else [list(range(len(contenders)))]
    items = list(contenders.items())
    if balanced:
        repeats = -(-repeats // len(orders)) * len(orders)
    for round_ in range(repeats):
        for index in orders[round_ % len(orders)]:
            name, fn = items[index]
            start = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - start)
    return samples


def balanced_orders(count: int) -> list[list[int]]:
    """Orders of ``count`` contenders in which each goes first, and each follows each
    other, equally often within a round: a Williams Latin square (``count`` rows; twice
    that, each row also reversed, for an odd count)."""
    first = [0]
    for step in range(1, count):  # 0, 1, n-1, 2, n-2, ...
        first.append((step + 1) // 2 if step % 2 else count - step // 2)
    rows = [[(i + shift) % count for i in first] for shift in range(count)]
    return rows if count % 2 == 0 else rows + [row[::-1] for row in rows]


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
