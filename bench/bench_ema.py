"""EMA update cost on a ~50M-parameter model (CPU): compatshim vs what users run today.

Contenders, run alternately in one process on the same model:
- compatshim ``update_ema`` (pairs cached once, one ``_foreach_lerp_`` per step);
- Open-Sora's ``update_ema``: a Python loop of ``mul_`` + ``add_`` per parameter;
- timm ``ModelEmaV3.update`` (if timm is installed);
- ``torch.optim.swa_utils.AveragedModel`` with ``get_ema_multi_avg_fn``;
- the floor: one ``lerp_`` over a single flat buffer of the same total size
  (memory-bandwidth bound; goal: compatshim <= 1.15x of it).
Prints a Markdown table; ``main()`` returns the ratios (contender / compatshim,
and compatshim / flat floor).
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from typing import Any, Callable

from _common import interleaved, median, ms, table

DECAY = 0.9999
WIDTH = 1024
BLOCKS = 12  # 12 blocks x 4 (1024x1024 + bias) ~= 50.4M params


def build_model() -> Any:
    import torch

    torch.manual_seed(0)
    layers = []
    for _ in range(BLOCKS):
        layers += [torch.nn.Linear(WIDTH, WIDTH) for _ in range(4)]
        layers.append(torch.nn.LayerNorm(WIDTH))
    return torch.nn.Sequential(*layers)


def open_sora_update_ema(ema_model: Any, model: Any, decay: float) -> None:
    """Open-Sora 1.0's loop (non-sharded branch), verbatim in spirit."""
    import torch

    with torch.no_grad():
        ema_params = OrderedDict(ema_model.named_parameters())
        for name, param in model.named_parameters():
            if not param.requires_grad:
                continue
            ema_params[name].mul_(decay).add_(param.data, alpha=1 - decay)


def contenders(model: Any) -> tuple[dict[str, Callable[[], object]], list[str]]:
    import torch
    from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

    import compatshim.ema as cema

    ema_compat = copy.deepcopy(model)
    ema_loop = copy.deepcopy(model)
    averaged = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(DECAY), use_buffers=False)
    total = sum(p.numel() for p in model.parameters())
    flat_ema = torch.randn(total)
    flat_src = torch.randn(total)
    runs: dict[str, Callable[[], object]] = {
        "compatshim update_ema": lambda: cema.update_ema(ema_compat, model, decay=DECAY),
        "Open-Sora loop": lambda: open_sora_update_ema(ema_loop, model, DECAY),
        "AveragedModel + get_ema_multi_avg_fn": lambda: averaged.update_parameters(model),
        "flat buffer lerp_ (floor)": lambda: flat_ema.lerp_(flat_src, 1 - DECAY),
    }
    notes = [f"model: {total / 1e6:.1f}M fp32 params in {len(list(model.parameters()))} tensors"]
    try:
        from timm.utils import ModelEmaV3

        timm_ema = ModelEmaV3(model, decay=DECAY)
        runs["timm ModelEmaV3"] = lambda: timm_ema.update(model)
    except Exception as exc:  # timm is optional: report, do not fail
        notes.append(f"timm ModelEmaV3 not run: {type(exc).__name__}: {exc}")
    return runs, notes


def _table(runs: dict[str, Callable[[], object]], repeats: int, title: str) -> dict[str, float]:
    samples = interleaved(runs, repeats=repeats, warmup=2)
    medians = {name: median(values) for name, values in samples.items()}
    ours = medians["compatshim update_ema"]
    floor = medians["flat buffer lerp_ (floor)"]
    rows = [
        [name, ms(value), f"{value / ours:.2f}x", f"{value / floor:.2f}x"]
        for name, value in medians.items()
    ]
    print(title)
    print()
    print(table(["contender", "median per update", "vs compatshim", "vs flat floor"], rows))
    print()
    print(f"compatshim / flat floor = {ours / floor:.3f} (goal <= 1.15)")
    print()
    ratios = {f"{name} / compatshim": value / ours for name, value in medians.items()}
    ratios["compatshim / flat floor"] = ours / floor
    return ratios


def main(repeats: int = 12) -> dict[str, float]:
    """Both tables: torch's default intra-op threads, then 1 thread.

    With several threads every per-tensor op is one parallel region, so on a
    busy machine (load average above the core count) the per-tensor contenders
    wait for descheduled threads and the flat floor pulls ahead; the 1-thread
    table shows the cost without that scheduling noise.
    """
    import os

    import torch

    model = build_model()
    runs, notes = contenders(model)
    load = os.getloadavg()[0]
    default_threads = torch.get_num_threads()
    ratios = _table(
        runs,
        repeats,
        f"### EMA update ({', '.join(notes)}; torch {torch.__version__}; "
        f"{default_threads} threads; load average {load:.1f}; median of {repeats})",
    )
    torch.set_num_threads(1)
    try:
        single = _table(runs, repeats, f"### Same, 1 intra-op thread (load average {load:.1f})")
    finally:
        torch.set_num_threads(default_threads)
    ratios.update({f"{name} [1 thread]": value for name, value in single.items()})
    return ratios


if __name__ == "__main__":
    main()
