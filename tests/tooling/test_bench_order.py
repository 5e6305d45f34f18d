"""bench/_common.py: balanced orders keep a contender from always running after the same one."""

from __future__ import annotations

import collections
import runpy
from pathlib import Path
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "_common.py"


def common() -> dict[str, Any]:
    """bench/_common.py's names (bench/ is no package: run by path, not imported)."""
    return runpy.run_path(str(SCRIPT), run_name="compatshim_bench_common")


@pytest.mark.parametrize("count", [2, 3, 4, 5, 6])
def test_each_contender_goes_first_and_follows_each_other_equally_often(count: int) -> None:
    orders = common()["balanced_orders"](count)
    assert all(sorted(order) == list(range(count)) for order in orders)
    first = collections.Counter(order[0] for order in orders)
    follows = collections.Counter(pair for order in orders for pair in zip(order, order[1:]))
    assert set(first) == set(range(count)) and len(set(first.values())) == 1
    assert len(follows) == count * (count - 1) and len(set(follows.values())) == 1


def test_interleaved_runs_whole_squares() -> None:
    seen: list[str] = []
    contenders = {name: (lambda name=name: seen.append(name)) for name in "abc"}
    samples = common()["interleaved"](contenders, repeats=4, warmup=0, balanced=True)
    assert {len(times) for times in samples.values()} == {6}  # 4 rounded up to one 6-row square
    pairs = collections.Counter(zip(seen, seen[1:]))
    assert all(pairs[(a, b)] >= 2 for a in "abc" for b in "abc" if a != b)
