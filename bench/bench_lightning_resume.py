"""Hardened mode on a real Lightning resume: cost against Lightning's own unsafe load.

A Trainer writes real checkpoints (``ModelCheckpoint``: weights, Adam moments,
loops, callbacks) of a 12.6M-parameter MLP, one with ``argparse.Namespace``
hyper-parameters (torch's weights-only unpickler refuses them, so hardened mode
reads the file a second time through compatshim's loader) and one without
(torch's weights-only unpickler reads it). The same resume call,
``trainer.fit(model, ckpt_path=..., weights_only=False)``, then runs in two
kinds of fresh interpreter, alternating:

- unsafe: nothing armed; Lightning's ``weights_only=False`` runs torch's full
  unpickler (what a user who trusts the file writes on Lightning 2.6);
- hardened: ``COMPATSHIM_AUTO=1 COMPATSHIM_SAFE_LOAD=1``; every ``torch.load``
  is weights-only whatever its argument.

Reported: the median time of the checkpoint read alone (Lightning's
``Strategy.load_checkpoint``, timed around the call) and of the whole resume
(``fit`` from the checkpoint through one more optimizer step), and their
ratios. Each interpreter resumes from one checkpoint, once untimed (imports,
first-call costs) and then ``RESUMES`` times, garbage collected between runs;
hardened and unsafe runs must end with equal weights or the benchmark fails.

``main()`` prints Markdown and returns the ratios (hardened / unsafe).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import median, ms, table

ROUNDS = 6  # fresh interpreters per kind and mode, alternating
RESUMES = 3  # timed resumes in each interpreter, after one untimed
KINDS = ("namespace", "none")  # hyper-parameters saved in the checkpoint

CHILD = r"""
import argparse, gc, hashlib, json, os, shutil, sys, time, warnings
import torch
import lightning as L
from lightning.pytorch.strategies.strategy import Strategy

mode, folder, resumes = sys.argv[1], sys.argv[2], int(sys.argv[3])
warnings.filterwarnings("ignore")
STEP, WIDTH, LAYERS = 2, 1024, 12

class Model(L.LightningModule):
    def __init__(self, hp=None):
        super().__init__()
        if hp is not None:
            self.save_hyperparameters()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])
    def training_step(self, batch, index):
        return self.net(batch[0]).square().mean()
    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)

def data():
    g = torch.Generator().manual_seed(0)
    return torch.utils.data.DataLoader(torch.randn(8, WIDTH, generator=g), batch_size=8)

def hparams(kind):
    return argparse.Namespace(lr=1e-3, layers=LAYERS, name="mlp") if kind == "namespace" else None

def trainer(root, steps, checkpointing):
    return L.Trainer(max_steps=steps, default_root_dir=root, accelerator="cpu", devices=1,
                     logger=False, enable_checkpointing=checkpointing,
                     enable_progress_bar=False, enable_model_summary=False)

if mode == "save":
    for kind in sys.argv[4:]:
        root = os.path.join(folder, kind)
        trainer(root, STEP, True).fit(Model(hparams(kind)), data())
        found = [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs if ".ckpt" in f]
        shutil.move(found[0], os.path.join(folder, kind + ".ckpt"))
        shutil.rmtree(root)
    sys.exit(0)

read = []
original = Strategy.load_checkpoint
def timed(self, *args, **kwargs):
    start = time.perf_counter()
    try:
        return original(self, *args, **kwargs)
    finally:
        read.append(time.perf_counter() - start)
Strategy.load_checkpoint = timed

result = {}
for kind in sys.argv[4:]:
    path = os.path.join(folder, kind + ".ckpt")
    fits = []
    for _ in range(resumes + 1):
        model = None
        gc.collect()  # the last run's trainer and model: freed before, not during, the next
        model = Model(hparams(kind))
        start = time.perf_counter()
        trainer(os.path.join(folder, "run"), STEP + 1, False).fit(
            model, data(), ckpt_path=path, weights_only=False
        )
        fits.append(time.perf_counter() - start)
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    result[kind] = {
        "fit": fits[1:],
        "read": read[-resumes:],
        "weights": hashlib.sha256(flat.numpy().tobytes()).hexdigest(),
    }
result["applied"] = False
if "compatshim" in sys.modules:  # the start-up hook imports it only when COMPATSHIM_AUTO=1
    import compatshim
    row = next(r for r in compatshim.status() if r.name == "torch-load-safe-globals")
    result["applied"] = row.applied
print(json.dumps(result))
"""


def child(mode: str, folder: Path, *kinds: str) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPATSHIM_")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if mode == "hardened":
        env.update(COMPATSHIM_AUTO="1", COMPATSHIM_SAFE_LOAD="1")
    done = subprocess.run(
        [sys.executable, "-c", CHILD, mode, str(folder), str(RESUMES), *kinds],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{mode} child failed:\n{done.stderr[-4000:]}")
    if mode == "save":
        return {}
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> dict[str, float]:
    import lightning
    import torch

    folder = Path(tempfile.mkdtemp(prefix="bench_lightning_resume_"))
    child("save", folder, *KINDS)
    samples = {
        (mode, kind, what): []
        for mode in ("unsafe", "hardened")
        for kind in KINDS
        for what in ("fit", "read")
    }
    weights: dict[tuple[str, str], set[str]] = {}
    paired: dict[tuple[str, str], list[float]] = {}  # per round: hardened / unsafe, side by side
    for _ in range(ROUNDS):
        for kind in KINDS:  # one kind per interpreter: what one resume leaves behind differs
            pair = {}
            for mode in ("unsafe", "hardened"):
                got = child(mode, folder, kind)
                assert got["applied"] == (mode == "hardened"), f"{mode}: patch applied {got}"
                pair[mode] = measured = got[kind]
                for what in ("fit", "read"):
                    samples[(mode, kind, what)] += measured[what]  # type: ignore[index]
                weights.setdefault((mode, kind), set()).add(measured["weights"])  # type: ignore[index]
            for what in ("fit", "read"):
                hardened, unsafe = (median(pair[m][what]) for m in ("hardened", "unsafe"))  # type: ignore[index]
                paired.setdefault((kind, what), []).append(hardened / unsafe)
    for kind in KINDS:
        assert len(weights[("unsafe", kind)] | weights[("hardened", kind)]) == 1, (
            f"{kind}: hardened and unsafe resumes ended with different weights"
        )

    rows, ratios = [], {}
    for kind in KINDS:
        size = (folder / f"{kind}.ckpt").stat().st_size / 2**20
        label = {
            "namespace": "`Namespace` hparams (torch's weights-only refuses; compatshim reads)",
            "none": "no hparams (torch's weights-only reads it)",
        }[kind]
        for what, name in (("read", "checkpoint read"), ("fit", "whole resume")):
            unsafe = median(samples[("unsafe", kind, what)])
            hardened = median(samples[("hardened", kind, what)])
            ratios[f"{kind} {what}"] = hardened / unsafe
            rows.append(
                (
                    f"{label}, {size:.0f} MiB" if label else "",
                    name,
                    ms(unsafe),
                    ms(hardened),
                    f"{hardened / unsafe:.2f}x",
                    "{:.2f}x-{:.2f}x".format(*sorted(paired[(kind, what)])[:: ROUNDS - 1]),
                )
            )
            label = ""
    n = ROUNDS * RESUMES
    print(
        f"## Hardened mode on a Lightning {lightning.__version__} resume vs its own unsafe load "
        f"(torch {torch.__version__}, medians of {n} resumes in {ROUNDS} interpreters each)\n"
    )
    header = ("checkpoint (written by `Trainer`)", "measured", "unsafe", "hardened", "ratio")
    print(table((*header, "ratio per round (min-max)"), rows))
    print(
        "\nBoth run `trainer.fit(model, ckpt_path=..., weights_only=False)`; unsafe: nothing "
        "armed (torch's full unpickler); hardened: `COMPATSHIM_AUTO=1 COMPATSHIM_SAFE_LOAD=1` "
        "(every `torch.load` weights-only). Checkpoint read: Lightning's "
        "`Strategy.load_checkpoint`; whole resume: `fit` from the checkpoint through one more "
        "Adam step. Hardened and unsafe runs end with identical weights. Shared machine: other "
        "jobs ran beside it (load average below), so compare the ratios, not the milliseconds; "
        "the range is the ratio of the two interpreters run one after the other in each round."
    )
    shutil.rmtree(folder)
    print(json.dumps(ratios))
    return ratios


if __name__ == "__main__":
    main()
