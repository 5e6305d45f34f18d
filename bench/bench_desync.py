"""Cost of the lightning-fabric-desync patch and of sync_point on a healthy run (2 gloo ranks).

Contenders run side by side in the same two processes, alternating, so both
see the same machine noise:

- a training-step collective: ``Fabric.all_reduce`` of a 1M-element float32
  tensor, patched (breadcrumb) vs Lightning's original method (goal: <= 1.01x);
- ``Fabric.setup_module`` of a small MLP, patched (sync point + parameter
  comparison through the store) vs the original;
- ``compatshim.dist.sync_point`` vs ``torch.distributed.barrier`` and
  ``monitored_barrier`` (what a user would otherwise reach for).

The monitor thread runs throughout (it is part of being armed); it writes one
heartbeat per half second and does not touch the hot path.
"""

from __future__ import annotations

import os
import socket
import sys
from typing import Any

import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import interleaved, median, table

STEP_REPEATS = 400
SETUP_REPEATS = 15
SYNC_REPEATS = 150


def _worker(rank: int, world_size: int, port: int, queue: Any) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        WORLD_SIZE=str(world_size),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        NODE_RANK="0",
    )
    import torch
    import torch.distributed as dist
    from lightning.fabric import Fabric

    import compatshim
    from compatshim.dist import sync_point

    originals = {name: Fabric.__dict__[name] for name in ("all_reduce", "setup_module")}
    compatshim.install(include=["lightning-fabric-desync"])
    patched = {name: Fabric.__dict__[name] for name in originals}
    assert all(patched[n] is not originals[n] for n in originals), "patch did not apply"

    fabric = Fabric(accelerator="cpu", devices=world_size, strategy="ddp")
    fabric.launch()
    tensor = torch.ones(1_000_000)

    def model() -> torch.nn.Module:
        torch.manual_seed(0)
        return torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(8)])

    steps = interleaved(
        {
            "unpatched": lambda: originals["all_reduce"](fabric, tensor, reduce_op="sum"),
            "patched": lambda: patched["all_reduce"](fabric, tensor, reduce_op="sum"),
        },
        repeats=STEP_REPEATS,
        warmup=5,
    )
    setups = interleaved(
        {
            "unpatched": lambda: originals["setup_module"](fabric, model()),
            "patched": lambda: patched["setup_module"](fabric, model()),
        },
        repeats=SETUP_REPEATS,
        warmup=2,
    )
    counter = iter(range(10**9))
    syncs = interleaved(
        {
            "barrier": lambda: dist.barrier(),
            "monitored_barrier": lambda: dist.monitored_barrier(),
            "sync_point": lambda: sync_point(f"bench {next(counter)}", timeout=60),
        },
        repeats=SYNC_REPEATS,
        warmup=3,
    )
    if rank == 0:
        queue.put(
            {"steps": steps, "setups": setups, "syncs": syncs, "crumb": _breadcrumb_cost(fabric)}
        )
    dist.barrier()


def _breadcrumb_cost(fabric: Any) -> dict[str, list[float]]:
    """The wrapper's own cost, on a method that does nothing (too small to see in one step)."""
    import time

    from compatshim.patches.lightning_fabric_desync import _breadcrumb

    def nothing(self: Any) -> None:
        return None

    wrapped = _breadcrumb("barrier", nothing)
    calls = 20_000
    samples: dict[str, list[float]] = {"plain": [], "breadcrumb": []}
    for _ in range(7):
        for name, fn in (("plain", nothing), ("breadcrumb", wrapped)):
            start = time.perf_counter()
            for _ in range(calls):
                fn(fabric)
            samples[name].append((time.perf_counter() - start) / calls)
    return samples


def main() -> dict[str, float]:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    procs = [ctx.Process(target=_worker, args=(r, 2, port, queue)) for r in range(2)]
    for proc in procs:
        proc.start()
    try:
        samples = queue.get(timeout=110)
    finally:
        for proc in procs:
            proc.join(20)
            if proc.is_alive():
                proc.kill()
    ms = {
        group: {name: median(values) * 1e3 for name, values in samples[group].items()}
        for group in ("steps", "setups", "syncs", "crumb")
    }
    crumb_us = (ms["crumb"]["breadcrumb"] - ms["crumb"]["plain"]) * 1e3
    ratios = {
        "all_reduce_1M_patched_vs_original": ms["steps"]["patched"] / ms["steps"]["unpatched"],
        "setup_module_patched_vs_original": ms["setups"]["patched"] / ms["setups"]["unpatched"],
        "breadcrumb_share_of_1M_step": crumb_us / (ms["steps"]["unpatched"] * 1e3),
        "sync_point_vs_barrier": ms["syncs"]["sync_point"] / ms["syncs"]["barrier"],
        "sync_point_vs_monitored_barrier": ms["syncs"]["sync_point"]
        / ms["syncs"]["monitored_barrier"],
    }
    rows = [
        [
            "Fabric.all_reduce, 1M float32 (one step)",
            f"{ms['steps']['unpatched']:.3f}",
            f"{ms['steps']['patched']:.3f}",
            f"{ratios['all_reduce_1M_patched_vs_original']:.3f}x",
            f"{(ms['steps']['patched'] - ms['steps']['unpatched']) * 1e3:+.0f} µs",
        ],
        [
            "Fabric.setup_module, 8x Linear(64,64)",
            f"{ms['setups']['unpatched']:.3f}",
            f"{ms['setups']['patched']:.3f}",
            f"{ratios['setup_module_patched_vs_original']:.3f}x",
            f"{(ms['setups']['patched'] - ms['setups']['unpatched']) * 1e3:+.0f} µs",
        ],
        [
            "breadcrumb alone (wrapper on a no-op method)",
            "-",
            "-",
            f"{ratios['breadcrumb_share_of_1M_step'] * 100:.3f}% of a 1M step",
            f"{crumb_us:+.2f} µs",
        ],
        [
            "sync_point vs dist.barrier",
            f"{ms['syncs']['barrier']:.3f}",
            f"{ms['syncs']['sync_point']:.3f}",
            f"{ratios['sync_point_vs_barrier']:.3f}x",
            f"monitored_barrier {ms['syncs']['monitored_barrier']:.3f} ms",
        ],
    ]
    print("## lightning-fabric-desync: cost on a healthy run (2 gloo ranks, medians)\n")
    print(table(["operation", "without (ms)", "with compatshim (ms)", "ratio", "added"], rows))
    return ratios


if __name__ == "__main__":
    print(main())
