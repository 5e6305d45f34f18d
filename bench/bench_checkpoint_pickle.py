"""compatshim.checkpoint.load on pickle-heavy files, against what a user would call instead.

The ~1 GB benchmark (bench_checkpoint) is dominated by reading tensor bytes; these shapes
are dominated by the pickle itself, where compatshim's loader (a Python opcode machine with
checked handlers, a work budget and a result walk) does the most work per byte:
20 000 small tensors, a list of 1 000 000 floats, 100 000 small dicts, and an Adam
optimizer state for 3 000 parameters. Contenders run alternately in one process, from the
same file in the page cache: ``torch.load(weights_only=True)`` (what a user picks on torch
>= 2.6) and ``torch.load(weights_only=False)`` (the unsafe C unpickler). Medians.

``main()`` prints Markdown and returns the ratios (compatshim / weights-only torch).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Callable

from _common import interleaved, median, ms, table


def _shapes() -> dict[str, Callable[[], Any]]:
    import torch

    def tensors() -> Any:
        return {f"layer{i}.weight": torch.full((4,), float(i)) for i in range(20_000)}

    def floats() -> Any:
        return [i * 0.5 for i in range(1_000_000)]

    def dicts() -> Any:
        return [{"step": i, "loss": i * 0.1, "name": "train"} for i in range(100_000)]

    def adam() -> Any:
        params = [torch.nn.Parameter(torch.zeros(4)) for _ in range(3_000)]
        optimizer = torch.optim.Adam(params)
        for p in params:
            p.grad = torch.ones(4)
        optimizer.step()
        return optimizer.state_dict()

    return {
        "20 000 small tensors": tensors,
        "1 000 000 floats": floats,
        "100 000 small dicts": dicts,
        "Adam state, 3 000 params": adam,
    }


def main(repeats: int = 11) -> dict[str, float]:
    import torch

    from compatshim.checkpoint import load

    rows = []
    ratios: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as folder:
        for name, make in _shapes().items():
            path = Path(folder) / "c.pt"
            torch.save(make(), path)
            size = path.stat().st_size
            samples = interleaved(
                {
                    "compatshim": lambda p=path: load(p),
                    "weights_only=True": lambda p=path: torch.load(p, weights_only=True),
                    "weights_only=False": lambda p=path: torch.load(p, weights_only=False),
                },
                repeats,
            )
            ours = median(samples["compatshim"])
            safe = median(samples["weights_only=True"])
            unsafe = median(samples["weights_only=False"])
            ratios[name] = ours / safe
            rows.append(
                [
                    name,
                    f"{size / 2**20:.1f} MiB",
                    ms(ours),
                    ms(safe),
                    ms(unsafe),
                    f"{ours / safe:.2f}x",
                    f"{ours / unsafe:.2f}x",
                ]
            )
    print(
        f"### compatshim.checkpoint.load on pickle-heavy files (torch {torch.__version__}, "
        f"{repeats} interleaved repeats, medians)\n"
    )
    print(
        table(
            [
                "file",
                "size",
                "compatshim",
                "torch weights_only=True",
                "torch weights_only=False",
                "vs weights-only",
                "vs unsafe C unpickler",
            ],
            rows,
        )
    )
    return ratios


if __name__ == "__main__":
    main()
