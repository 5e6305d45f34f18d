"""What ``inspect`` costs, and what judging omegaconf configs whole adds to it (issue 26 item 5).

    python bench/bench_inspect.py   (an env with omegaconf: resume-lightning2.6, zoo-*)

``inspect`` answers "would ``load`` take this file?" without reading tensor data. A file
naming omegaconf configs whose every global is admitted is also read by ``load``'s machine
with every storage on ``meta`` (the configs are judged only once built). Three contenders,
each call in a fresh interpreter (the CLI's case: torch's import is part of the cost, and
``import compatshim.checkpoint`` is done before the clock), alternating, medians:
``inspect``; ``scan only`` (inspect's headers and symbolic scan alone, what it did before);
and ``load`` (what a user would run to find out).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import median, ms, table

TENSORS = 64
MIB = 4  # per tensor: 256 MiB in all

CHILD = r"""
import json, sys, time
path, how = sys.argv[1], sys.argv[2]
from compatshim.checkpoint import _container, _inspect, inspect, load
start = time.perf_counter()
if how == "inspect":
    inspect(path)
elif how == "scan only":
    _container.read(path, lambda file, what, _: _inspect._headers(file, what))
else:
    load(path)
took = time.perf_counter() - start
print(json.dumps({"seconds": took, "torch": "torch" in sys.modules}))
"""


def _files(folder: Path) -> dict[str, Path]:
    import torch
    from omegaconf import OmegaConf

    torch.manual_seed(0)
    weights = {f"layer{i}.weight": torch.randn(MIB * 2**18) for i in range(TENSORS)}
    hydra = OmegaConf.create(
        {
            "name": "run",
            "data": {"root": "/data", "train": "${.root}/train", "val": "${data.root}/val"},
            "model": {"width": 256, "depth": 12, "heads": "${oc.select:model.h,8}"},
            "optim": {"lr": 3e-4, "betas": [0.9, 0.95], "warmup": "${trainer.max_steps}"},
            "trainer": {"max_steps": 1000, "run": "${name}-${trainer.max_steps}"},
            "paths": {f"p{i}": f"${{data.train}}/{i}/${{..name}}" for i in range(3000)},
        }
    )
    files = {
        "state dict, no omegaconf": {"state_dict": weights, "epoch": 3},
        "Lightning-style, Hydra hparams (6 000 references)": {
            "state_dict": weights,
            "epoch": 3,
            "hparams_name": "cfg",
            "hyper_parameters": {"cfg": hydra},
        },
    }
    paths = {}
    for index, (label, obj) in enumerate(files.items()):
        paths[label] = folder / f"{index}.pt"
        torch.save(obj, paths[label])
    return paths


def _run(path: Path, how: str) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPATSHIM_")}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(path), how],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main(repeats: int = 9) -> None:
    try:
        import omegaconf  # noqa: F401
    except ImportError:
        print("### inspect: skipped (omegaconf is not installed here)")
        return
    contenders = ("inspect", "scan only", "load")
    rows, ratios = [], {}
    with tempfile.TemporaryDirectory() as folder:
        for label, path in _files(Path(folder)).items():
            samples: dict[str, list[float]] = {how: [] for how in contenders}
            imported = {}
            for _ in range(repeats):
                for how in contenders:
                    found = _run(path, how)
                    samples[how].append(float(found["seconds"]))  # type: ignore[arg-type]
                    imported[how] = found["torch"]
            mid = {how: median(samples[how]) for how in contenders}
            ratios[label] = {
                "inspect / scan only": mid["inspect"] / mid["scan only"],
                "inspect / load": mid["inspect"] / mid["load"],
            }
            rows.append(
                (
                    f"{label}, {path.stat().st_size / 2**20:.0f} MiB",
                    *(ms(mid[how]) for how in contenders),
                    f"{ratios[label]['inspect / scan only']:.2f}x",
                    f"{ratios[label]['inspect / load']:.2f}x",
                    "yes" if imported["inspect"] else "no",
                )
            )
    print(f"### inspect vs load, {TENSORS} tensors of {MIB} MiB (fresh interpreters, medians)\n")
    header = ("file", *contenders, "inspect / scan only", "inspect / load", "torch imported")
    print(table(header, rows))
    print(
        f"\n{repeats} interleaved calls per contender, each in a fresh interpreter with "
        "compatshim.checkpoint imported before the clock (torch's import, where a call needs "
        "it, is timed). `scan only` is inspect before the omegaconf whole-load check. "
        "A shared 2-core CPU box: compare the ratios."
    )
    print(json.dumps(ratios))


if __name__ == "__main__":
    main()
