"""Cost of the ``torch-load-safe-globals`` wrapper on files torch accepts.

    python bench/bench_torch_load_patch.py

Three contenders on the same in-memory files, interleaved, medians: torch's own
``torch.load`` (weights-only), the armed wrapper (torch reads, compatshim only
retries refusals) and the hardened wrapper (compatshim's loader reads every file
first and alone). The ratio that matters for hardened mode is hardened / armed:
what reading first costs compared with today's armed load.
"""

from __future__ import annotations

import io
import statistics
import time
from typing import Any, Callable

import torch

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
    for name, obj in (("state dict, 8 Linear(64, 64)", small.state_dict()), ("training", training)):
        buffer = io.BytesIO()
        torch.save(obj, buffer)
        out[name] = buffer.getvalue()
    return out


def _time(loads: dict[str, Callable[..., Any]], data: bytes, repeats: int) -> dict[str, float]:
    times: dict[str, list[float]] = {name: [] for name in loads}
    order = list(loads.items())
    for round_ in range(repeats):
        shift = round_ % len(order)  # each contender goes first as often: no order bias
        for name, load in order[shift:] + order[:shift]:
            stream = io.BytesIO(data)
            start = time.perf_counter()
            load(stream, weights_only=True)
            times[name].append(time.perf_counter() - start)
    return {k: statistics.median(v) * 1e6 for k, v in times.items()}


def main(repeats: int = 300) -> None:
    loads = {
        "torch.load": torch.load,
        "armed": _wrap(torch.load, hardened=False),
        "hardened": _wrap(torch.load, hardened=True),
    }
    print(f"### torch.load wrapper on files torch accepts (torch {torch.__version__}, medians)")
    print()
    print("| file | torch.load | armed | hardened | armed / torch | hardened / armed |")
    print("|---|---|---|---|---|---|")
    for name, data in _files().items():
        m = _time(loads, data, repeats)
        print(
            f"| {name}, {len(data) / 1e3:.0f} kB | {m['torch.load']:.0f} us | {m['armed']:.0f} us "
            f"| {m['hardened']:.0f} us | {m['armed'] / m['torch.load']:.3f} "
            f"| {m['hardened'] / m['armed']:.3f} |"
        )
    print()
    print(
        f"{repeats} interleaved loads of each file per contender, in rotating order. "
        "Hardened reads with "
        "compatshim.checkpoint.load alone (torch's unpickler never sees the file)."
    )


if __name__ == "__main__":
    main()
