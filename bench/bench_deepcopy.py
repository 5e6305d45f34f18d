"""Deep copies of a model that holds a ProcessGroup, side by side with what a user has today.

A user's EMA code runs ``copy.deepcopy(model)``. Contenders, alternating in
one process, on the same architecture (blocks of Linear + SyncBatchNorm +
ReLU, many small modules: the case where per-object overhead shows most):

- ``deepcopy`` with the ``torch-processgroup-copy`` patch, model holding a
  ProcessGroup (each SyncBatchNorm and the model itself),
- ``clone_module`` (no patch needed) on that same model,
- baseline: plain ``deepcopy`` of the same architecture built without a
  group (``process_group=None``), the only thing that works without
  compatshim.

Goals (issue 2): patched deepcopy <= 1.05x the baseline. The group is a
bare, unregistered ``ProcessGroup``: copying never talks to it, so no
process group needs to be initialised.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
import torch.distributed as dist
from _common import interleaved, median, ms, table

import compatshim
from compatshim.patches.torch_processgroup_copy import _bare_group

BLOCKS = 64
WIDTH = 64
PATCH = "torch-processgroup-copy"


def build_model(group: Any) -> torch.nn.Module:
    layers: list[torch.nn.Module] = []
    for _ in range(BLOCKS):
        layers += [
            torch.nn.Linear(WIDTH, WIDTH),
            torch.nn.SyncBatchNorm(WIDTH, process_group=group),
            torch.nn.ReLU(),
        ]
    model = torch.nn.Sequential(*layers)
    model.group = group  # type: ignore[assignment]
    return model


def main(repeats: int = 60) -> dict[str, float]:
    torch.set_num_threads(1)
    group = _bare_group(dist.ProcessGroup)
    with_group = build_model(group)
    without_group = build_model(None)
    compatshim.install([PATCH])
    try:
        samples = interleaved(
            {
                "baseline": lambda: copy.deepcopy(without_group),
                "patched": lambda: copy.deepcopy(with_group),
                "clone": lambda: compatshim.clone_module(with_group),
            },
            repeats=repeats,
            warmup=3,
        )
        assert copy.deepcopy(with_group).group is group
    finally:
        compatshim.uninstall([PATCH])
    base = median(samples["baseline"])
    ratios = {
        "patched_deepcopy_vs_plain": median(samples["patched"]) / base,
        "clone_module_vs_plain": median(samples["clone"]) / base,
    }
    modules = sum(1 for _ in with_group.modules())
    print(
        f"### Deep copy of a model holding a ProcessGroup ({modules} modules, "
        f"torch {torch.__version__}, {repeats} interleaved repeats, medians)\n"
    )
    print(
        table(
            ["contender", "median", "ratio to baseline", "goal"],
            [
                ["plain `copy.deepcopy`, same model without a group", ms(base), "1.00x", ""],
                [
                    "`copy.deepcopy` with the patch, model holding a group",
                    ms(median(samples["patched"])),
                    f"{ratios['patched_deepcopy_vs_plain']:.3f}x",
                    "<= 1.05x",
                ],
                [
                    "`compatshim.clone_module`, model holding a group, no patch needed",
                    ms(median(samples["clone"])),
                    f"{ratios['clone_module_vs_plain']:.3f}x",
                    "",
                ],
            ],
        )
    )
    return ratios


if __name__ == "__main__":
    main()
