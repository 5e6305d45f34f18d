"""Cost of the ``torch-load-safe-globals`` wrapper on files torch accepts.

    python bench/bench_torch_load_patch.py

Three contenders on the same in-memory files, medians: torch's own ``torch.load``
(weights-only), the armed wrapper (torch reads, compatshim only retries refusals)
and the hardened wrapper (compatshim's loader reads every file first and alone).
The ratios that matter for hardened mode: hardened / torch (issue 41: its fixed cost
at most torch's own) and hardened / armed (what reading first costs compared with
today's armed load).

Interleaved, each ratio comes from its two contenders alone, alternating. Armed runs
torch's loader, so with all three alternating torch's loader ran in two calls of
three and stayed warmer in the caches than compatshim's: the empty file read 1.18x
that way and 1.05x two by two (torch 2.1, the same build, one sitting).
"""

from __future__ import annotations

import io
import statistics
import time
from typing import Any, Callable

import torch
from _common import balanced_orders

from compatshim._engine.patching import Patcher
from compatshim.patches.torch_load_safe_globals import _wrap


def _files() -> dict[str, bytes]:
    torch.manual_seed(0)
    small = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(8)])
    blocks = [
        torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.LayerNorm(256)) for _ in range(24)
    ]
    model = torch.nn.Sequential(*blocks)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, 256)).sum().backward()
    optimizer.step()
    training = {
        "epoch": 3,
        "global_step": 1200,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "lr_scheduler": {"last_epoch": 3, "base_lrs": [1e-3], "_step_count": 4},
    }
    out = {}
    files = (
        ("empty state dict (fixed cost per call)", {}),
        ("state dict, 8 Linear(64, 64)", small.state_dict()),
        ("training", training),
    )
    for name, obj in files:
        buffer = io.BytesIO()
        torch.save(obj, buffer)
        out[name] = buffer.getvalue()
    return out


def _time(
    loads: dict[str, Callable[..., Any]], data: bytes, repeats: int, in_a_row: bool = False
) -> tuple[dict[str, float], dict[str, float]]:
    """Median wall and CPU (this thread's) microseconds per load: contenders interleaved, or
    (``in_a_row``) in blocks of ``BLOCK`` calls of one contender, blocks in A B C C B A order
    (each block's first call, the switch, is not counted)."""
    times: dict[str, list[float]] = {name: [] for name in loads}
    cpu: dict[str, list[float]] = {name: [] for name in loads}
    order = list(loads.items())
    if in_a_row:
        rounds = [order + order[::-1]] * max(1, repeats // (2 * BLOCK))
        calls = [[item] * (BLOCK + 1) for blocks in rounds for item in blocks]
    else:  # each contender goes first, and follows each other one, as often: no order bias
        orders = balanced_orders(len(order))
        calls = [[order[i] for i in orders[r % len(orders)]] for r in range(repeats)]
    for batch in calls:
        for index, (name, load) in enumerate(batch):
            stream = io.BytesIO(data)
            start_cpu = time.thread_time()
            start = time.perf_counter()
            load(stream, weights_only=True)
            if in_a_row and index == 0:
                continue
            times[name].append(time.perf_counter() - start)
            cpu[name].append(time.thread_time() - start_cpu)
    return (
        {k: statistics.median(v) * 1e6 for k, v in times.items()},
        {k: statistics.median(v) * 1e6 for k, v in cpu.items()},
    )


BLOCK = 25


def main(repeats: int = 300) -> None:
    loads = {
        "torch.load": torch.load,
        "armed": _wrap(torch.load, False, Patcher()),
        "hardened": _wrap(torch.load, True, Patcher()),
    }
    print(f"### torch.load wrapper on files torch accepts (torch {torch.__version__}, medians)")
    print()
    print(
        "| file | torch.load | armed | hardened | armed / torch | hardened / torch "
        "| hardened / torch, CPU time | hardened / armed |"
    )
    print("|---|---|---|---|---|---|---|---|")
    pairs = (("torch.load", "hardened"), ("torch.load", "armed"), ("armed", "hardened"))
    for name, data in _files().items():
        for in_a_row in (False, True):
            if in_a_row:
                m, c = _time(loads, data, repeats, in_a_row)
                ratio = {pair: m[pair[1]] / m[pair[0]] for pair in pairs}
            else:  # each pair alone: m and c from torch / hardened, armed from its pair
                timed = {pair: _time({k: loads[k] for k in pair}, data, repeats) for pair in pairs}
                m, c = timed[pairs[0]]
                m["armed"] = timed[pairs[1]][0]["armed"]
                ratio = {pair: t[0][pair[1]] / t[0][pair[0]] for pair, t in timed.items()}
            how = "calls in a row" if in_a_row else "interleaved two by two"
            print(
                f"| {name}, {len(data) / 1e3:.0f} kB, {how} | {m['torch.load']:.0f} us "
                f"| {m['armed']:.0f} us | {m['hardened']:.0f} us "
                f"| {ratio[pairs[1]]:.3f} | {ratio[pairs[0]]:.3f} "
                f"| {c['hardened'] / c['torch.load']:.3f} | {ratio[pairs[2]]:.3f} |"
            )
    print()
    print(
        f"{repeats} loads of each file per contender: interleaved two by two (each ratio from "
        "its two contenders alone, alternating; torch.load and hardened from their pair, armed "
        "from its pair with torch.load), or in "
        f"blocks of {BLOCK} calls of one contender (A B C C B A; what a process that loads only "
        "one way sees: a hardened process never calls torch's unpickler); wall-clock "
        "medians, and the ratio of CPU-time medians (this thread's: less sensitive to the other "
        "jobs on a shared box). Hardened reads with "
        "compatshim.checkpoint.load alone (torch's unpickler never sees the file)."
    )


if __name__ == "__main__":
    main()
