"""compatshim.checkpoint.load vs torch.load(weights_only=True) for every ``map_location`` form.

Two files of each shape: saved on the CPU, and saved with every storage tagged ``cuda:0``
(what a GPU run writes; made here by replacing ``torch.serialization.location_tag`` while
saving). Shapes: a 512 MiB state dict (64 x 8 MiB float32 plus small buffers; half the
1 GiB of ``bench_checkpoint`` so that two loads in flight fit a shared 24 GiB machine)
where reading bytes dominates, and 10 000 small tensors where the per-storage placement
call does. Forms: ``"cpu"``, ``torch.device("cpu")``, ``{"cuda:0": "cpu"}``,
``lambda s, loc: s``, ``None``, and with CUDA ``"cuda"``; ``mmap=True`` with ``"cpu"``.
A form torch cannot place on this machine (a CUDA location without CUDA) is left out.

Contenders alternate in one process on the same file in the page cache; each result is
dropped right after its call, as a user's would be, and nothing calls ``gc.collect()``.
Alternating hides a load whose storages outlive its result (a reference cycle): the next
call, whichever contender, page-faults fresh memory. So one row per file runs each
contender's calls back to back (the procedure of the 2026-11-27 GPU run, where that
defect showed as 1.48x with ``"cpu"``). Medians.

Each call's minor page faults are counted too (``getrusage``; unlike time, they do not
depend on the machine's load): a loader that copied a storage once more, or kept the
previous result alive, would fault more pages per call than torch. Usually both
fault one page per 4 KiB of tensor data (131 041 for the 512 MiB file): the previous
result's memory went back to the system when it was dropped. But a call sometimes finds
the previous result's memory still in glibc's heap (a freed small chunk in glibc's
per-thread cache above it stopped the trim; bench/RESULTS.md traces which), faults far
less and runs faster, and which contender that favours is the heap's layout before the
call, not the loader's work. So the tables run once per heap regime, each in a child
process whose environment sets glibc's ``MALLOC_*_`` tunables (the benchmark's own
process and a user's are untouched): "fresh pages" (``MALLOC_MMAP_THRESHOLD_=131072``:
every storage is mmapped and unmapped when dropped, as in a process's first load),
"reused heap" (mmap and trim thresholds at 4 GiB: dropped storages stay in the heap and
the next call reuses them, no page faults) and glibc's default (the ratio then follows
the fault counts); and "calls in a row" once more with one contender per process.

``BENCH_QUICK=1`` (the GPU leg's clock): the 512 MiB file in the "fresh pages" regime
only, 3 repeats, no one-contender-per-process rows. ``main()`` prints Markdown and
returns the ratios (compatshim / torch).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from _common import compile_compatshim, median, table

MIB = 2**20
ROUNDS = 6  # child processes per contender in the one-contender-per-process rows
BLOCK = 3  # calls per block in the "calls in a row" rows (the first not counted)
HEAPS = {  # glibc heap regimes for the one-contender-per-process rows (child environment only)
    "fresh pages": {"MALLOC_MMAP_THRESHOLD_": "131072"},
    "reused heap": {"MALLOC_MMAP_THRESHOLD_": str(2**32), "MALLOC_TRIM_THRESHOLD_": str(2**32)},
    "glibc default": {},
}


def big_state() -> dict[str, Any]:
    import torch

    torch.manual_seed(0)
    state = {}
    for index in range(64):
        state[f"layers.{index}.weight"] = torch.randn(1024, 2048)
        state[f"layers.{index}.bias"] = torch.randn(2048)
        state[f"layers.{index}.norm.num_batches_tracked"] = torch.tensor(7)
    return state


def many_state() -> dict[str, Any]:
    import torch

    return {f"layer{i}.weight": torch.full((4,), float(i)) for i in range(10_000)}


def save(state: dict[str, Any], path: Path, saved_on: str) -> Path:
    import torch

    original = torch.serialization.location_tag
    if saved_on != "cpu":
        torch.serialization.location_tag = lambda storage: saved_on
    try:
        torch.save(state, path)
    finally:
        torch.serialization.location_tag = original
    return path


def forms(saved_on: str) -> dict[str, tuple[Any, bool, bool]]:
    """label -> (map_location, mmap, in a row), the forms torch can place on this machine."""
    import torch

    cuda = torch.cuda.is_available()
    out: dict[str, tuple[Any, bool, bool]] = {
        '"cpu"': ("cpu", False, False),
        'torch.device("cpu")': (torch.device("cpu"), False, False),
        '{"cuda:0": "cpu"}': ({"cuda:0": "cpu"}, False, False),
        "lambda s, loc: s": (lambda storage, location: storage, False, False),
    }
    if saved_on == "cpu" or cuda:
        out["None"] = (None, False, False)
    if cuda:
        out['"cuda"'] = ("cuda", False, False)
    out['"cpu", mmap=True'] = ("cpu", True, False)
    out['"cpu", calls in a row'] = ("cpu", False, True)
    return out


FAULTS: dict[str, list[int]] = {"compatshim": [], "torch": []}  # minor faults per call


def minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def timed(fn: Callable[[], Any], sync: Callable[[], None], who: str = "") -> float:
    sync()
    faults = minor_faults()
    start = time.perf_counter()
    result = fn()
    sync()
    took = time.perf_counter() - start
    if who:
        FAULTS[who].append(minor_faults() - faults)
    del result
    return took


def child(path: str, who: str, calls: int) -> None:
    """One contender's ``calls`` loads with ``"cpu"`` back to back; prints (faults, s) of each,
    the first (the process's first load, as when a run resumes) included."""
    import torch

    from compatshim.checkpoint import load

    if who == "compatshim":
        fn = lambda: load(path, map_location="cpu")  # noqa: E731
    else:
        fn = lambda: torch.load(path, map_location="cpu", weights_only=True)  # noqa: E731
    FAULTS[who] = []
    times = [timed(fn, lambda: None, who) for _ in range(calls)]
    print(json.dumps(list(zip(FAULTS[who], times))))


def in_processes(path: Path, heap: dict[str, str], rounds: int, calls: int) -> list[float]:
    """Medians (compatshim s, torch s, compatshim faults, torch faults) of the calls after
    each process's first, then (compatshim s, torch s) of the first calls, over ``rounds``
    pairs of child processes, the order alternating."""
    env = {**os.environ, **heap}
    got: dict[str, list[tuple[int, float]]] = {"compatshim": [], "torch": []}
    first: dict[str, list[float]] = {"compatshim": [], "torch": []}
    for index in range(rounds):
        order = ("compatshim", "torch") if index % 2 == 0 else ("torch", "compatshim")
        for who in order:
            command = [sys.executable, __file__, "--child", str(path), who, str(calls)]
            out = subprocess.run(command, env=env, check=True, capture_output=True, text=True)
            pairs = [tuple(pair) for pair in json.loads(out.stdout.splitlines()[-1])]
            first[who].append(pairs[0][1])
            got[who] += pairs[1:]
    return [
        *(median([t for _, t in got[who]]) for who in ("compatshim", "torch")),
        *(median([f for f, _ in got[who]]) for who in ("compatshim", "torch")),
        *(median(first[who]) for who in ("compatshim", "torch")),
    ]


def compare(
    path: Path, map_location: Any, mmap: bool, repeats: int, in_a_row: bool = False
) -> tuple[float, float]:
    """Median seconds (compatshim, torch), one warm-up each; alternating, or (``in_a_row``)
    each contender's calls back to back, the procedure of the 2026-11-27 GPU run."""
    import torch

    from compatshim.checkpoint import load

    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    ours = lambda: load(path, map_location=map_location, mmap=mmap)  # noqa: E731
    theirs = lambda: torch.load(  # noqa: E731
        str(path), map_location=map_location, weights_only=True, mmap=mmap
    )
    for faults in FAULTS.values():
        faults.clear()
    if in_a_row:
        # short blocks in A B B A order, repeated, so that the load of a shared box, which
        # drifts over seconds, falls on both alike; a block's first call follows the other
        # contender's and is not counted: every counted call follows one of its own
        a, b = [], []
        blocks = ((ours, a, "compatshim"), (theirs, b, "torch"))
        for _ in range(-(-repeats // 4)):
            for fn, into, who in blocks + blocks[::-1]:
                into += [timed(fn, sync, who) for _ in range(BLOCK)][1:]
                del FAULTS[who][-BLOCK]
        return median(a), median(b)
    timed(ours, sync)
    timed(theirs, sync)
    a, b = [], []
    for index in range(repeats):
        pair = ((ours, a, "compatshim"), (theirs, b, "torch"))
        for fn, into, who in pair if index % 2 == 0 else pair[::-1]:
            into.append(timed(fn, sync, who))
    return median(a), median(b)


def tables(heap: str, repeats: int) -> dict[str, float]:
    """The per-form tables, in this process (whose heap regime ``heap`` names)."""

    import compatshim.checkpoint._load  # noqa: F401  (imports are not what is measured)

    folder = Path(tempfile.mkdtemp(prefix="bench_map_location_"))
    ratios: dict[str, float] = {}
    shapes = {"512 MiB state dict (192 tensors)": big_state, "10 000 small tensors": many_state}
    if os.environ.get("BENCH_QUICK") == "1":  # host overhead per storage is measured on CPU
        del shapes["10 000 small tensors"]
    for title, make in shapes.items():
        state = make()
        nbytes = sum(t.numel() * t.element_size() for t in state.values())
        files = {
            on: save(state, folder / f"{on.replace(':', '')}.pt", on) for on in ("cpu", "cuda:0")
        }
        del state
        rows: dict[str, list[str]] = {}
        fault_rows: dict[str, list[str]] = {}
        for saved_on, path in files.items():
            for label, (map_location, mmap, in_a_row) in forms(saved_on).items():
                ours, theirs = compare(path, map_location, mmap, repeats, in_a_row)
                ratio = ours / theirs
                ratios[f"{title} | {heap} | saved on {saved_on} | {label}"] = ratio
                rows.setdefault(label, ["-"] * 6)
                at = 0 if saved_on == "cpu" else 3
                rows[label][at : at + 3] = [
                    f"{ours * 1e3:.1f}",
                    f"{theirs * 1e3:.1f}",
                    f"{ratio:.2f}x",
                ]
                fault_rows.setdefault(label, ["-"] * 4)
                at = 0 if saved_on == "cpu" else 2
                fault_rows[label][at : at + 2] = [
                    f"{median(FAULTS[who]):.0f}" for who in ("compatshim", "torch")
                ]
        print(
            "## checkpoint.load vs torch.load(weights_only=True) by map_location: "
            f"{title}, heap: {heap}\n"
        )
        print(f"{nbytes / MIB:.1f} MiB of tensor data; ms are medians of {repeats}.\n")
        header = (
            "map_location",
            "CPU-saved: compatshim ms",
            "torch ms",
            "ratio",
            "CUDA-saved: compatshim ms",
            "torch ms",
            "ratio",
        )
        print(table(header, [(label, *cells) for label, cells in rows.items()]))
        print()
        print("Minor page faults per call, medians (getrusage; independent of the box's load):\n")
        header = (
            "map_location",
            "CPU-saved: compatshim",
            "torch",
            "CUDA-saved: compatshim",
            "torch",
        )
        print(table(header, [(label, *cells) for label, cells in fault_rows.items()]))
        print()
        for path in files.values():
            path.unlink()
    folder.rmdir()
    print(json.dumps(ratios))
    return ratios


def main(repeats: int = 9) -> dict[str, float]:
    """Each heap regime's tables in a child process, then the one-contender-per-process
    rows; prints Markdown, returns every ratio."""
    import torch

    compile_compatshim()  # the first-load rows include importing compatshim, as a user's do
    quick = os.environ.get("BENCH_QUICK") == "1"  # the GPU leg's short clock: one regime
    heaps = {"fresh pages": HEAPS["fresh pages"]} if quick else HEAPS
    repeats = 3 if quick else repeats
    ratios: dict[str, float] = {}
    for heap, tunables in heaps.items():
        command = [sys.executable, __file__, "--heap", heap, str(repeats)]
        out = subprocess.run(
            command, env={**os.environ, **tunables}, check=True, capture_output=True, text=True
        ).stdout.splitlines()
        print("\n".join(out[:-1]))
        ratios.update(json.loads(out[-1]))
    if quick:
        print(json.dumps(ratios))
        return ratios
    folder = Path(tempfile.mkdtemp(prefix="bench_map_location_"))
    state = big_state()
    files = {on: save(state, folder / f"{on.replace(':', '')}.pt", on) for on in ("cpu", "cuda:0")}
    del state
    rows = []
    for heap, tunables in HEAPS.items():
        for saved_on, path in files.items():
            ours, theirs, f_ours, f_theirs, first_ours, first_theirs = in_processes(
                path, tunables, ROUNDS, 6
            )
            key = f"512 MiB | {heap} | saved on {saved_on} | one contender per process"
            ratios[key] = ours / theirs
            ratios[f"{key}, first load"] = first_ours / first_theirs
            rows.append((
                heap, saved_on, f"{first_ours * 1e3:.1f}", f"{first_theirs * 1e3:.1f}",
                f"{first_ours / first_theirs:.2f}x", f"{ours * 1e3:.1f}", f"{theirs * 1e3:.1f}",
                f"{ours / theirs:.2f}x", f"{f_ours:.0f}", f"{f_theirs:.0f}",
            ))  # fmt: skip
    for path in files.values():
        path.unlink()
    folder.rmdir()
    print(
        '## "cpu", calls in a row, one contender per process: 512 MiB state dict\n\n'
        f"{ROUNDS} processes a contender, alternating; each loads 6 times. 'first load': "
        "the median of the processes' first calls (what a run that resumes meets); 'later "
        f"loads': the median of the {ROUNDS * 5} other calls, each after the previous "
        "result was dropped (faults: of those).\n"
    )
    header = ("heap", "saved on", "first load: compatshim ms", "torch ms", "ratio",
              "later loads: compatshim ms", "torch ms", "ratio",
              "compatshim faults", "torch faults")  # fmt: skip
    print(table(header, rows))
    print()
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA"
    print(
        f"Device: {device}. '-': a form torch cannot place on this machine (a CUDA location "
        "without CUDA; compatshim raises CheckpointError there, tested). Per-form tables: "
        "contenders alternate in one process on the same file in the page cache, each result "
        "dropped after its call, no gc.collect(); 'calls in a row': each contender's calls "
        f"back to back, in blocks of {BLOCK} ordered A B B A, repeated, each block's first "
        "call not counted (the procedure of the 2026-11-27 GPU run). Heap regimes (glibc "
        "tunables in the child's environment): 'fresh pages' MALLOC_MMAP_THRESHOLD_=131072 "
        "(every storage mapped anew, as in a process's first load), 'reused heap' mmap and "
        "trim thresholds at 4 GiB (dropped storages reused), 'glibc default' none set: there "
        "the ratio follows the page faults, that is whether a freed small chunk left in "
        "glibc's per-thread cache above the dropped storages kept them in the heap (the "
        "heap's layout before the call decides it). Shared machine: compare the ratios and "
        "the faults."
    )
    print(json.dumps(ratios))
    return ratios


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif sys.argv[1:2] == ["--heap"]:
        tables(sys.argv[2], int(sys.argv[3]))
    else:
        main()
