"""EMA update cost: compatshim vs what users run today, on CUDA when present, else CPU.

Two measures, contenders run alternately in one process, medians:

1. Host overhead (issue 24 item 4): 120 parameters of 4 elements, so the
   arithmetic costs nothing and only the per-call host work shows. compatshim
   ``update_ema`` against the bare ``torch._foreach_lerp_`` on the same pairs:
   on their ``.data`` (plain tensors; the floor) and on the Parameter objects
   themselves under ``no_grad`` (the lists ``update_ema`` passes). Goal: <= 1.2x
   the bare call on ``.data`` (what a hand-written loop passes; timm's
   ``ModelEmaV3`` passes ``state_dict()`` values, detached alike).
   ``BENCH_EMA_ALSO`` (interpreters separated by ``os.pathsep``, each with
   torch and this compatshim importable, e.g. through ``PYTHONPATH``) adds one
   row per interpreter: the same section run there (``--host-only``).
   The buffer case (issue 38): 24 ``BatchNorm1d(4)``, 120 tensors (48 params,
   48 float buffers, 24 ``num_batches_tracked``), ``update_ema`` with its
   default ``buffers="average"`` against the bare calls doing the same work:
   ``_foreach_lerp_`` over the 96 floating tensors' ``.data`` plus
   ``_foreach_copy_`` over the 24 counters (goal <= 1.2x); and, for scale,
   ``buffers="skip"`` (parameters only) and timm ``ModelEmaV3`` (if installed).
2. A ~50M-parameter model (120 tensors): compatshim, Open-Sora's loop, timm
   ``ModelEmaV3`` (if installed), ``AveragedModel`` + ``get_ema_multi_avg_fn``,
   and the floor: one ``lerp_`` over a flat buffer of the same size (goal:
   compatshim <= 1.15x). Each row gives GB/s (an EMA update reads the EMA and
   the source and writes the EMA: 3 x the parameter bytes) and its fraction of
   the device's copy bandwidth (``copy_`` of a flat buffer: 2 x the bytes).
   On CUDA each timed update ends in a synchronize, so that table holds the host work
   too (1.35x of the floor on an H200, 2026-12-04); a second table times 10 updates back
   to back with one synchronize, as a training loop runs them. A ~1.6B-parameter model
   in 240 tensors follows, where memory allows.
Prints Markdown tables and a JSON line of the ratios.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import time
from collections import OrderedDict
from typing import Any, Callable

from _common import interleaved, median, ms, table

DECAY = 0.9999
WIDTH = 1024
BLOCKS = 12  # 12 blocks x 4 (1024x1024 + bias) ~= 50.4M params
HOST_TENSORS = 120
HOST_BATCH = 5  # calls per sample: short samples, so the median skips the preempted ones
BACK_TO_BACK = 10  # CUDA updates per sample in the throughput table (one synchronize)


def build_model(device: str, width: int = WIDTH, blocks: int = BLOCKS, per_block: int = 4) -> Any:
    import torch

    torch.manual_seed(0)
    layers: list[Any] = []
    for _ in range(blocks):
        layers += [torch.nn.Linear(width, width) for _ in range(per_block)]
        if per_block == 4:
            layers.append(torch.nn.LayerNorm(width))
    return torch.nn.Sequential(*layers).to(device)


def open_sora_update_ema(ema_model: Any, model: Any, decay: float) -> None:
    """Open-Sora 1.0's loop (non-sharded branch), verbatim in spirit."""
    import torch

    with torch.no_grad():
        ema_params = OrderedDict(ema_model.named_parameters())
        for name, param in model.named_parameters():
            if not param.requires_grad:
                continue
            ema_params[name].mul_(decay).add_(param.data, alpha=1 - decay)


def _synced(fn: Callable[[], object], device: str) -> Callable[[], object]:
    if device != "cuda":
        return fn
    import torch

    def run() -> object:
        out = fn()
        torch.cuda.synchronize()
        return out

    return run


def _batched(fn: Callable[[], object], times: int) -> Callable[[], object]:
    def run() -> object:
        for _ in range(times):
            fn()
        return None

    return run


def host_overhead(device: str, repeats: int = 401) -> dict[str, float]:
    """Section 1: per-call host cost at 120 tiny tensors."""
    import torch

    import compatshim.ema as cema

    torch.manual_seed(0)
    model = torch.nn.ParameterList(
        [torch.nn.Parameter(torch.randn(4, device=device)) for _ in range(HOST_TENSORS)]
    )
    ema = copy.deepcopy(model)
    ema_data = [p.data for p in ema.parameters()]
    src_data = [p.data for p in model.parameters()]
    ema_params = list(ema.parameters())
    src_params = list(model.parameters())

    def on_params() -> None:
        with torch.no_grad():
            torch._foreach_lerp_(ema_params, src_params, 1 - DECAY)

    runs = {
        "bare `_foreach_lerp_` on `.data` (floor)": lambda: torch._foreach_lerp_(
            ema_data, src_data, 1 - DECAY
        ),
        "bare `_foreach_lerp_` on the Parameters, `no_grad`": on_params,
        "compatshim update_ema": lambda: cema.update_ema(ema, model, decay=DECAY),
    }
    batched = {name: _synced(_batched(fn, HOST_BATCH), device) for name, fn in runs.items()}
    samples = interleaved(batched, repeats=repeats, warmup=3)
    per_call = {name: median(values) / HOST_BATCH for name, values in samples.items()}
    floor = per_call["bare `_foreach_lerp_` on `.data` (floor)"]
    ours = per_call["compatshim update_ema"]
    rows = [
        [name, f"{value * 1e6:.1f} us", f"{value / floor:.2f}x"] for name, value in per_call.items()
    ]
    print(
        f"### EMA host overhead ({HOST_TENSORS} tensors of 4 elements on {device}; "
        f"median of {repeats} x {HOST_BATCH} calls)"
    )
    print()
    print(table(["contender", "per call", "vs bare on .data"], rows))
    print()
    print(f"compatshim / bare foreach = {ours / floor:.3f} (goal <= 1.2)")
    print()
    on_params_time = per_call["bare `_foreach_lerp_` on the Parameters, `no_grad`"]
    return {
        "host: compatshim / bare foreach on .data": ours / floor,
        "host: compatshim / bare foreach on Parameters": ours / on_params_time,
        "host: compatshim per call (us)": ours * 1e6,
        "host: bare foreach on .data per call (us)": floor * 1e6,
    }


def host_overhead_buffers(device: str, repeats: int = 401) -> dict[str, float]:
    """Section 1b: per-call host cost with BatchNorm buffers (120 tensors in 24 BatchNorm1d)."""
    import torch

    import compatshim.ema as cema

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.BatchNorm1d(4) for _ in range(HOST_TENSORS // 5)])
    model.to(device).train()
    model(torch.randn(8, 4, device=device))  # statistics and counters away from their start
    ema = copy.deepcopy(model)
    ema_skip = copy.deepcopy(model)
    pairs = list(zip(ema.state_dict().values(), model.state_dict().values()))
    assert len(pairs) == HOST_TENSORS
    ema_float = [e for e, m in pairs if e.is_floating_point()]
    src_float = [m for e, m in pairs if e.is_floating_point()]
    ema_int = [e for e, m in pairs if not e.is_floating_point()]
    src_int = [m for e, m in pairs if not e.is_floating_point()]

    def bare() -> None:
        torch._foreach_lerp_(ema_float, src_float, 1 - DECAY)
        torch._foreach_copy_(ema_int, src_int)

    runs: dict[str, Callable[[], object]] = {
        "bare `_foreach_lerp_` + `_foreach_copy_` on `.data` (floor)": bare,
        'compatshim update_ema (buffers="average", default)': lambda: cema.update_ema(
            ema, model, decay=DECAY
        ),
        'compatshim update_ema (buffers="skip": parameters only)': lambda: cema.update_ema(
            ema_skip, model, decay=DECAY, buffers="skip"
        ),
    }
    try:
        from timm.utils import ModelEmaV3

        timm_ema = ModelEmaV3(model, decay=DECAY)
        runs["timm ModelEmaV3 (averages buffers, copies counters)"] = lambda: timm_ema.update(model)
    except Exception as exc:  # timm is optional: report, do not fail
        print(f"(timm ModelEmaV3 not run: {type(exc).__name__}: {exc})\n")
    batched = {name: _synced(_batched(fn, HOST_BATCH), device) for name, fn in runs.items()}
    samples = interleaved(batched, repeats=repeats, warmup=3)
    per_call = {name: median(values) / HOST_BATCH for name, values in samples.items()}
    floor = per_call["bare `_foreach_lerp_` + `_foreach_copy_` on `.data` (floor)"]
    ours = per_call['compatshim update_ema (buffers="average", default)']
    rows = [
        [name, f"{value * 1e6:.1f} us", f"{value / floor:.2f}x"] for name, value in per_call.items()
    ]
    print(
        f"### EMA host overhead with BatchNorm buffers ({HOST_TENSORS} tensors: "
        f"{HOST_TENSORS // 5} BatchNorm1d(4) on {device}; median of {repeats} x {HOST_BATCH} calls)"
    )
    print()
    print(table(["contender", "per call", "vs bare"], rows))
    print()
    print(f"compatshim (buffers on) / bare foreach = {ours / floor:.3f} (goal <= 1.2)")
    print()
    return {
        "host buffers: compatshim / bare lerp+copy on .data": ours / floor,
        "host buffers: compatshim per call (us)": ours * 1e6,
        "host buffers: bare lerp+copy per call (us)": floor * 1e6,
    }


def host_across_releases(interpreters: list[str]) -> dict[str, float]:
    """Section 1 again under other interpreters (other torch releases), one row each."""
    rows, ratios = [], {}
    for python in interpreters:
        try:
            done = subprocess.run(
                [python, __file__, "--host-only"], capture_output=True, text=True, timeout=1800
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            rows.append([python, "failed", f"{type(exc).__name__}: {exc}", "", ""])
            continue
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        if done.returncode != 0 or not lines:
            tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
            rows.append([python, "failed", tail, "", ""])
            continue
        got = json.loads(lines[-1])
        version = got.pop("torch")
        rows.append(
            [
                f"torch {version}",
                f"{got['host: compatshim per call (us)']:.1f} us",
                f"{got['host: bare foreach on .data per call (us)']:.1f} us",
                f"{got['host: compatshim / bare foreach on .data']:.2f}x",
                f"{got['host: compatshim / bare foreach on Parameters']:.2f}x",
            ]
        )
        ratios.update({f"[torch {version}] {k}": v for k, v in got.items()})
    print(f"### EMA host overhead on other torch releases ({HOST_TENSORS} tensors of 4 elements)")
    print()
    header = ["torch", "update_ema", "bare on .data", "vs bare on .data", "vs bare on Parameters"]
    print(table(header, rows))
    print()
    return ratios


def contenders(model: Any, device: str) -> tuple[dict[str, Callable[[], object]], list[str], int]:
    import torch
    from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

    import compatshim.ema as cema

    ema_compat = copy.deepcopy(model)
    ema_loop = copy.deepcopy(model)
    averaged = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(DECAY), use_buffers=False)
    total = sum(p.numel() for p in model.parameters())
    flat_ema = torch.randn(total, device=device)
    flat_src = torch.randn(total, device=device)
    runs: dict[str, Callable[[], object]] = {
        "compatshim update_ema": lambda: cema.update_ema(ema_compat, model, decay=DECAY),
        "Open-Sora loop": lambda: open_sora_update_ema(ema_loop, model, DECAY),
        "AveragedModel + get_ema_multi_avg_fn": lambda: averaged.update_parameters(model),
        "flat buffer lerp_ (floor)": lambda: flat_ema.lerp_(flat_src, 1 - DECAY),
        "flat buffer copy_ (bandwidth)": lambda: flat_ema.copy_(flat_src),
    }
    count = len(list(model.parameters()))
    notes = [f"model: {total / 1e6:.1f}M fp32 params in {count} tensors on {device}"]
    try:
        from timm.utils import ModelEmaV3

        timm_ema = ModelEmaV3(model, decay=DECAY)
        runs["timm ModelEmaV3"] = lambda: timm_ema.update(model)
    except Exception as exc:  # timm is optional: report, do not fail
        notes.append(f"timm ModelEmaV3 not run: {type(exc).__name__}: {exc}")
    return runs, notes, total * 4


def _table(
    runs: dict[str, Callable[[], object]], nbytes: int, repeats: int, title: str, per: int = 1
) -> dict[str, float]:
    """``per``: updates each run makes (back to back); the table is per update."""
    samples = interleaved(runs, repeats=repeats, warmup=2)
    medians = {name: median(values) / per for name, values in samples.items()}
    ours = medians["compatshim update_ema"]
    floor = medians["flat buffer lerp_ (floor)"]
    copy_rate = 2 * nbytes / medians["flat buffer copy_ (bandwidth)"]
    rows = []
    for name, value in medians.items():
        moved = 2 * nbytes if "copy_" in name else 3 * nbytes
        rate = moved / value
        rows.append(
            [
                name,
                ms(value),
                f"{value / ours:.2f}x",
                f"{value / floor:.2f}x",
                f"{rate / 1e9:.1f}",
                f"{rate / copy_rate:.0%}",
            ]
        )
    print(title)
    print()
    header = ["contender", "median per update", "vs compatshim", "vs flat floor", "GB/s"]
    print(table([*header, "of copy bandwidth"], rows))
    print()
    print(f"compatshim / flat floor = {ours / floor:.3f} (goal <= 1.15)")
    print()
    ratios = {f"{name} / compatshim": value / ours for name, value in medians.items()}
    ratios["compatshim / flat floor"] = ours / floor
    ratios["compatshim fraction of copy bandwidth"] = 3 * nbytes / ours / copy_rate
    return ratios


def _large_cuda_table(repeats: int) -> dict[str, float]:
    """~1.6B params in 240 tensors (120 Linear 3664x3664) where the GPU has room for them."""
    import torch

    total_gib = torch.cuda.get_device_properties(0).total_memory / 2**30
    if total_gib < 60:
        print(f"(1.6B-parameter table skipped: {total_gib:.0f} GiB GPU memory, needs 60)\n")
        return {}
    import compatshim.ema as cema

    model = build_model("cuda", width=3664, blocks=30, per_block=4)
    ema = copy.deepcopy(model)
    ema_list = [p.data for p in ema.parameters()]
    src_list = [p.data for p in model.parameters()]
    total = sum(p.numel() for p in model.parameters())
    flat_ema = torch.empty(total, device="cuda")
    flat_src = torch.empty(total, device="cuda")
    runs = {
        "compatshim update_ema": lambda: cema.update_ema(ema, model, decay=DECAY),
        "bare `_foreach_lerp_` on `.data`": lambda: torch._foreach_lerp_(
            ema_list, src_list, 1 - DECAY
        ),
        "flat buffer lerp_ (floor)": lambda: flat_ema.lerp_(flat_src, 1 - DECAY),
        "flat buffer copy_ (bandwidth)": lambda: flat_ema.copy_(flat_src),
    }
    title = (
        f"### EMA update, {total / 1e9:.2f}B fp32 params in {len(ema_list)} tensors on cuda "
        f"(median of {repeats})"
    )
    ratios = _table({n: _synced(f, "cuda") for n, f in runs.items()}, total * 4, repeats, title)
    return {f"[1.6B] {name}": value for name, value in ratios.items()}


def main(repeats: int = 12) -> dict[str, float]:
    """Host overhead, then the 50M tables (default threads and 1 thread on CPU; CUDA: one).

    With several CPU threads every per-tensor op is one parallel region, so on a
    busy machine the per-tensor contenders wait for descheduled threads and the
    flat floor pulls ahead; the 1-thread table shows the cost without that noise.
    """
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    ratios = host_overhead("cpu")
    ratios.update(host_overhead_buffers("cpu"))
    also = [path for path in os.environ.get("BENCH_EMA_ALSO", "").split(os.pathsep) if path]
    if also:
        ratios.update(host_across_releases(also))
    if device == "cuda":
        ratios.update({f"[cuda] {k}": v for k, v in host_overhead("cuda").items()})
        ratios.update({f"[cuda] {k}": v for k, v in host_overhead_buffers("cuda").items()})
    model = build_model(device)
    runs, notes, nbytes = contenders(model, device)
    load = os.getloadavg()[0]
    default_threads = torch.get_num_threads()
    where = torch.cuda.get_device_name(0) if device == "cuda" else f"{default_threads} threads"
    ratios.update(
        _table(
            {name: _synced(fn, device) for name, fn in runs.items()},
            nbytes,
            repeats,
            f"### EMA update ({', '.join(notes)}; torch {torch.__version__}; {where}; "
            f"load average {load:.1f}; median of {repeats})",
        )
    )
    if device == "cuda":  # each update above ends in a synchronize: host work adds to it
        back = {name: _synced(_batched(fn, BACK_TO_BACK), device) for name, fn in runs.items()}
        title = (
            f"### Same, {BACK_TO_BACK} updates back to back, one synchronize (as in a training "
            "loop: the host work of one update overlaps the kernels before it)"
        )
        ratios.update(
            {
                f"[back to back] {name}": value
                for name, value in _table(back, nbytes, repeats, title, BACK_TO_BACK).items()
            }
        )
        del runs, model, back
        torch.cuda.empty_cache()
        ratios.update(_large_cuda_table(repeats))
        return ratios
    torch.set_num_threads(1)
    try:
        title = f"### Same, 1 intra-op thread (load average {load:.1f})"
        single = _table(runs, nbytes, repeats, title)
    finally:
        torch.set_num_threads(default_threads)
    ratios.update({f"{name} [1 thread]": value for name, value in single.items()})
    return ratios


if __name__ == "__main__":
    started = time.perf_counter()
    if "--host-only" in sys.argv[1:]:
        import torch

        print(json.dumps({"torch": torch.__version__, **host_overhead("cpu")}))
    else:
        print(json.dumps(main()))
