"""DataLoader worker start-up under ``forkserver``, armed vs plain.

What a user pays for ``COMPATSHIM_AUTO=1`` when every DataLoader worker is started
by pickle (Python 3.14's default start method on Linux is ``forkserver``): the time
from ``iter(loader)`` to the first batch, ``num_workers=2``, a plain picklable
dataset. Each sample is a fresh interpreter (a training script's start), run with
``COMPATSHIM_AUTO=0`` and ``=1`` alternately. In it the first ``iter()`` also starts
the forkserver (a new interpreter that, armed, runs compatshim's start-up hook); the
later epochs only start workers from it.

Two forkservers: the one of this Python (before CPython's fix for gh-126631 / gh-137996,
in 3.14 and backported to 3.13 by PR 138609, the forkserver never preloads ``__main__``,
so every worker re-runs the script and imports torch), and one with torch preloaded
(``set_forkserver_preload(["torch"])``), which is what the fixed preload gives a script
that imports torch at its top: workers are forked with torch already imported, so
compatshim's share of their start is largest.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

import torch  # at the top, as in a training script: the forkserver imports it once
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import median, ms, table

VARIANTS = {"this Python's forkserver": "plain", "forkserver, torch preloaded": "torch"}
EPOCHS = 3  # the first starts the forkserver; the others only start workers
WORKERS = 2


def child(preload: str) -> None:
    """One training script's start: seconds from ``iter()`` to the first batch, per epoch."""
    if preload == "torch":
        multiprocessing.set_forkserver_preload(["torch"])
    loader = DataLoader(
        TensorDataset(torch.randn(64, 16)),
        batch_size=8,
        num_workers=WORKERS,
        multiprocessing_context="forkserver",
        timeout=300,
    )
    seconds = []
    for _ in range(EPOCHS):
        start = time.perf_counter()
        batches = iter(loader)
        next(batches)
        seconds.append(time.perf_counter() - start)
        del batches  # shuts the epoch's workers down
    armed = "compatshim" in sys.modules and any(
        row["name"] == "multiprocessing-pickle-paths" and row["applied"]
        for row in sys.modules["compatshim"].status()
    )
    print(json.dumps({"seconds": seconds, "armed": armed}))


def sample(preload: str, auto: str) -> list[float]:
    env = dict(os.environ, COMPATSHIM_AUTO=auto, OMP_NUM_THREADS="1")
    env.pop("COMPATSHIM_DISABLE", None)
    done = subprocess.run(
        [sys.executable, __file__, "--child", preload],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if result["armed"] is not (auto == "1"):
        raise RuntimeError(f"COMPATSHIM_AUTO={auto} but armed={result['armed']}")
    seconds: list[float] = result["seconds"]
    return seconds


def main(repeats: int = 7) -> dict[str, float]:
    samples: dict[tuple[str, str], list[list[float]]] = {}
    for round_ in range(repeats):
        for preload in VARIANTS.values():
            order = ("0", "1") if round_ % 2 == 0 else ("1", "0")  # alternate who goes first
            for auto in order:
                samples.setdefault((preload, auto), []).append(sample(preload, auto))

    ratios: dict[str, float] = {}
    rows = []
    for variant, preload in VARIANTS.items():
        for when, label, pick in (
            ("first", "first epoch (starts the forkserver)", lambda s: s[0]),
            ("later", "later epochs (workers only)", lambda s: median(s[1:])),
        ):
            plain = median([pick(s) for s in samples[(preload, "0")]])
            armed = median([pick(s) for s in samples[(preload, "1")]])
            ratios[f"{preload}_{when}"] = armed / plain
            rows.append([variant, label, ms(plain), ms(armed), f"{armed / plain:.3f}x"])
    print(
        f"### DataLoader worker start-up under forkserver, `COMPATSHIM_AUTO=1` vs plain "
        f"(torch {torch.__version__}, {WORKERS} workers, {repeats} interleaved repeats, medians)\n"
    )
    print(table(["forkserver", "iter() to first batch", "plain", "armed", "ratio"], rows))
    print(
        "\nEach repeat is a fresh interpreter per contender; `later epochs` is the median of "
        f"epochs 2-{EPOCHS} within it. Armed, the dataset is pickled through "
        "`multiprocessing-pickle-paths`' wrapper and the forkserver runs compatshim's start-up "
        "hook (workers forked from it inherit it).\n"
    )
    return ratios


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2])
    else:
        print(main())
