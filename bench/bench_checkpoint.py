"""compatshim.checkpoint.load vs torch.load(weights_only=True) on a ~1 GB state dict.

What a user would otherwise call on torch >= 2.6 is ``torch.load(path,
weights_only=True)``; compatshim's loader runs its own pickle machine and
checks every storage and view before building it, so the ratios say what
that costs. Each call runs in a fresh interpreter (peak RSS is per process),
contenders alternate, and medians are reported: time of the load call itself
(imports excluded: compatshim's loader modules are imported first, as torch's are at
``import torch``) and peak RSS above the interpreter's RSS before the call.
Also: ``inspect`` of the same file (target < 0.2 s) and ``mmap=True``
against torch's own mmap.

``main()`` prints Markdown and returns the ratios (compatshim / torch).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import median, ms, table

GIB = 2**30
TENSORS = 64  # 64 x 16 MiB float32 tensors, plus small buffers: ~1 GiB

CHILD = """
import json, resource, sys, time
path, how = sys.argv[1], sys.argv[2]
import torch
from compatshim.checkpoint import inspect, load
# Imports are not what is measured: import the loader's modules as torch.load's are at import.
import compatshim.checkpoint._inspect, compatshim.checkpoint._load, packaging.specifiers
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20
before = rss()
start = time.perf_counter()
if how == "compatshim":
    result = load(path)
elif how == "torch":
    result = torch.load(path, weights_only=True)
elif how == "compatshim-mmap":
    result = load(path, mmap=True)
elif how == "torch-mmap":
    result = torch.load(path, weights_only=True, mmap=True)
else:
    result = inspect(path)
took = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"seconds": took, "peak_mb": peak - before}))
"""


def make_state_dict(path: Path) -> int:
    import torch

    torch.manual_seed(0)
    state = {}
    for index in range(TENSORS):
        state[f"layers.{index}.weight"] = torch.randn(2048, 2048)
        state[f"layers.{index}.bias"] = torch.randn(2048)
        state[f"layers.{index}.norm.running_mean"] = torch.zeros(2048)
        state[f"layers.{index}.norm.num_batches_tracked"] = torch.tensor(7)
    torch.save(state, path)
    return sum(t.numel() * t.element_size() for t in state.values())


def run(path: Path, how: str) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(path), how],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def compare(path: Path, ours: str, theirs: str, repeats: int) -> dict[str, dict[str, float]]:
    samples: dict[str, dict[str, list[float]]] = {
        name: {"seconds": [], "peak_mb": []} for name in (ours, theirs)
    }
    for _ in range(repeats):
        for name in (ours, theirs):
            measured = run(path, name)
            for key, value in measured.items():
                samples[name][key].append(value)
    return {name: {k: median(v) for k, v in got.items()} for name, got in samples.items()}


def main(repeats: int = 5) -> dict[str, float]:
    folder = Path(tempfile.mkdtemp(prefix="bench_checkpoint_"))
    path = folder / "state_dict.pt"
    nbytes = make_state_dict(path)
    run(path, "torch")  # page cache warm for everyone
    rows, ratios = [], {}
    for label, ours, theirs in (
        ("load", "compatshim", "torch"),
        ("load, mmap=True", "compatshim-mmap", "torch-mmap"),
    ):
        got = compare(path, ours, theirs, repeats)
        a, b = got[ours], got[theirs]
        ratios[f"{label} time"] = a["seconds"] / b["seconds"]
        ratios[f"{label} peak"] = a["peak_mb"] / max(b["peak_mb"], 1.0)
        rows.append(
            (
                label,
                ms(a["seconds"]),
                ms(b["seconds"]),
                f"{ratios[f'{label} time']:.2f}x",
                f"{a['peak_mb']:.0f} MB",
                f"{b['peak_mb']:.0f} MB",
                f"{ratios[f'{label} peak']:.2f}x",
            )
        )
    inspect_times = [run(path, "inspect")["seconds"] for _ in range(repeats)]
    ratios["inspect seconds"] = median(inspect_times)
    print(
        f"## compatshim.checkpoint vs torch.load(weights_only=True), "
        f"{nbytes / GIB:.2f} GiB state dict ({4 * TENSORS} tensors)\n"
    )
    header = ("call", "compatshim", "torch", "time ratio", "compatshim peak", "torch peak")
    print(table((*header, "peak ratio"), rows))
    print(
        f"\n`inspect` of the same file: {ms(median(inspect_times))} (median of {repeats}; "
        "reads the zip directory and data.pkl only, imports no torch)."
    )
    print(
        "\nEach call in a fresh interpreter, contenders alternating; peak = RSS high-water mark "
        "above the RSS just before the call. Shared machine: other jobs ran beside it (load "
        "average below), so compare the ratios, not the milliseconds."
    )
    for child in folder.iterdir():
        child.unlink()
    folder.rmdir()
    print(json.dumps(ratios))
    return ratios


if __name__ == "__main__":
    main()
