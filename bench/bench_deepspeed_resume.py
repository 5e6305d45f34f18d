"""Hardened mode on a real DeepSpeed resume: cost against DeepSpeed's own unsafe load.

DeepSpeed's default checkpoint engine (``TorchCheckpointEngine``) reads every
file with ``torch.load(..., weights_only=False)``. An engine (``deepspeed.initialize``
on DeepSpeed's CPU accelerator, one rank over gloo, set up as
``tests/zoo/test_deepspeed.py`` does) of a 25.2M-parameter MLP with
``torch.optim.Adam`` writes a real checkpoint with ``engine.save_checkpoint``,
once per ZeRO stage:

- stage 0: one file, ``mp_rank_00_model_states.pt`` (weights and Adam moments),
  which torch's weights-only unpickler reads;
- stage 1: ``mp_rank_00_model_states.pt`` (weights) and
  ``zero_pp_rank_0_mp_rank_00_optim_states.pt`` (fp32 partition, Adam moments,
  DeepSpeed's ``LossScaler`` and ``ZeroStageEnum``): torch's weights-only
  unpickler refuses the optimizer file, so hardened mode reads it a second time
  through compatshim's loader (its allow-list names both classes).

The same resume call, ``engine.load_checkpoint(folder, tag=...)``, then runs in
two kinds of fresh interpreter, alternating:

- unsafe: nothing armed; DeepSpeed's ``weights_only=False`` runs torch's full
  unpickler (what every DeepSpeed user gets);
- hardened: ``COMPATSHIM_AUTO=1 COMPATSHIM_SAFE_LOAD=1``; every ``torch.load``
  is weights-only whatever its argument.

Reported: the median time of the checkpoint read (``engine.load_checkpoint``:
the files, then the state copied into the module and the optimizer; DeepSpeed
reads the model states file twice), of the
``torch.load`` calls inside it, and of the whole resume (the read plus one more
Adam step), and their ratios. Each interpreter builds its engine once (untimed),
resumes once untimed (first-call costs) and then ``RESUMES`` times, garbage
collected between runs. Weights, optimizer state and step counters after the
last read must equal what was saved, in both modes, and the state after the
extra step must be the same in both, or the benchmark fails.

``main()`` prints Markdown and returns the ratios (hardened / unsafe).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import median, ms, table

ROUNDS = 6  # fresh interpreters per kind and mode, alternating
RESUMES = 3  # timed resumes in each interpreter, after one untimed
KINDS = ("zero0", "zero1")  # ZeRO stage of the engine that saves and resumes

CHILD = r"""
import enum, gc, hashlib, json, os, sys, time, warnings

mode, folder, port, kind, resumes = sys.argv[1:6]
resumes = int(resumes)
os.environ.update(DS_ACCELERATOR="cpu", MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
                  RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", CROSS_RANK="0", CROSS_SIZE="1")
warnings.filterwarnings("ignore")
import torch
import deepspeed

WIDTH, LAYERS, BATCH = 1024, 24, 8
path = os.path.join(folder, kind)


def build():
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])
    config = {"train_batch_size": BATCH, "zero_optimization": {"stage": int(kind[-1])}}
    engine, *_ = deepspeed.initialize(
        model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3), config=config
    )
    return engine


def step(engine):
    batch = torch.randn(BATCH, WIDTH, generator=torch.Generator().manual_seed(engine.global_steps))
    engine.backward(engine(batch).square().mean())
    engine.step()


def feed(h, obj):
    if isinstance(obj, torch.Tensor):
        flat = obj.detach().cpu().contiguous().flatten()
        h.update(f"{flat.dtype}{tuple(obj.shape)}".encode())
        h.update(flat.view(torch.uint8).numpy().tobytes())
    elif isinstance(obj, dict):
        for key in sorted(obj, key=repr):
            h.update(repr(key).encode())
            feed(h, obj[key])
    elif isinstance(obj, (list, tuple)):
        h.update(f"{type(obj).__name__}{len(obj)}".encode())
        for item in obj:
            feed(h, item)
    elif obj is None or isinstance(obj, (bool, int, float, str, enum.Enum)):
        h.update(repr(obj).encode())
    else:  # DeepSpeed's LossScaler, fragment_address: their fields
        h.update(type(obj).__qualname__.encode())
        feed(h, dict(vars(obj)))


def digest(engine):
    # weights, the optimizer's own state_dict (ZeRO 1: fp32 partition, Adam moments, loss
    # scaler) and the step counters DeepSpeed restores
    h = hashlib.sha256()
    feed(h, engine.module.state_dict())
    feed(h, engine.optimizer.state_dict())
    feed(h, [engine.global_steps, engine.global_samples, engine.skipped_steps])
    return h.hexdigest()


engine = build()
if mode == "save":
    for _ in range(2):
        step(engine)
    engine.save_checkpoint(path, tag="ckpt")
    print("RESULT " + json.dumps({"saved": digest(engine)}))
    sys.exit(0)

loads = []
original = torch.load  # hardened: compatshim's loader, installed when torch was imported
def timed_load(*args, **kwargs):
    start = time.perf_counter()
    try:
        return original(*args, **kwargs)
    finally:
        loads.append(time.perf_counter() - start)
torch.load = timed_load

result = {"read": [], "load": [], "fit": []}
for run in range(resumes + 1):  # each run's step moves the state on: the next read restores it
    gc.collect()  # the last run's garbage: freed before, not during, the next
    del loads[:]
    start = time.perf_counter()
    done, _ = engine.load_checkpoint(path, tag="ckpt")
    read = time.perf_counter() - start
    assert done is not None, "load_checkpoint found no checkpoint"
    if run == resumes:  # (the first read starts from the engine as built)
        result["loaded"] = digest(engine)
    start = time.perf_counter()
    step(engine)
    more = time.perf_counter() - start
    if run:
        result["read"].append(read)
        result["load"].append(sum(loads))
        result["fit"].append(read + more)
result["stepped"] = digest(engine)
result["calls"] = len(loads)
result["engine"] = type(engine.checkpoint_engine).__name__
result["applied"] = False
if "compatshim" in sys.modules:  # the start-up hook imports it only when COMPATSHIM_AUTO=1
    import compatshim
    row = next(r for r in compatshim.status() if r.name == "torch-load-safe-globals")
    result["applied"] = row.applied
print("RESULT " + json.dumps(result))
"""


def free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def child(mode: str, folder: Path, kind: str) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPATSHIM_")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if mode == "hardened":
        env.update(COMPATSHIM_AUTO="1", COMPATSHIM_SAFE_LOAD="1")
    done = subprocess.run(
        [sys.executable, "-c", CHILD, mode, str(folder), free_port(), kind, str(RESUMES)],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    results = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not results:
        raise RuntimeError(f"{mode} {kind} child failed:\n{done.stderr[-4000:]}")
    return json.loads(results[-1][len("RESULT ") :])  # type: ignore[no-any-return]


def main() -> dict[str, float]:
    from importlib.metadata import version

    import torch

    folder = Path(tempfile.mkdtemp(prefix="bench_deepspeed_resume_"))
    saved = {kind: child("save", folder, kind)["saved"] for kind in KINDS}
    whats = ("read", "load", "fit")
    samples: dict[tuple[str, str, str], list[float]] = {
        (mode, kind, what): []
        for mode in ("unsafe", "hardened")
        for kind in KINDS
        for what in whats
    }
    stepped: dict[str, set[str]] = {kind: set() for kind in KINDS}
    calls: dict[str, int] = {}
    paired: dict[tuple[str, str], list[float]] = {}  # per round: hardened / unsafe, side by side
    for _ in range(ROUNDS):
        for kind in KINDS:  # one kind per interpreter, as a user's job resumes one checkpoint
            pair = {}
            for mode in ("unsafe", "hardened"):
                got = pair[mode] = child(mode, folder, kind)
                assert got["applied"] == (mode == "hardened"), f"{mode}: patch applied {got}"
                assert got["engine"] == "TorchCheckpointEngine", got
                assert got["loaded"] == saved[kind], f"{mode} {kind}: state read != state saved"
                stepped[kind].add(got["stepped"])  # type: ignore[arg-type]
                calls[kind] = got["calls"]  # type: ignore[assignment]
                for what in whats:
                    samples[(mode, kind, what)] += got[what]  # type: ignore[arg-type]
            for what in whats:
                hardened, unsafe = (median(pair[m][what]) for m in ("hardened", "unsafe"))  # type: ignore[arg-type]
                paired.setdefault((kind, what), []).append(hardened / unsafe)
    for kind in KINDS:
        assert len(stepped[kind]) == 1, f"{kind}: the step after the resume differs between runs"

    rows, ratios = [], {}
    for kind in KINDS:
        files = list((folder / kind).rglob("*.pt"))
        size = sum(p.stat().st_size for p in files) / 2**20
        label = {
            "zero0": "ZeRO 0: weights and Adam moments in one file (torch's weights-only reads it)",
            "zero1": "ZeRO 1: optimizer file holds `LossScaler`, `ZeroStageEnum` "
            "(torch's weights-only refuses; compatshim reads)",
        }[kind]
        label += f"; {len(files)} file{'s' * (len(files) > 1)}, {size:.0f} MiB, "
        label += f"{calls[kind]} `torch.load` calls"
        for what, name in (
            ("read", "checkpoint read"),
            ("load", "its `torch.load` calls"),
            ("fit", "whole resume"),
        ):
            unsafe = median(samples[("unsafe", kind, what)])
            hardened = median(samples[("hardened", kind, what)])
            ratios[f"{kind} {what}"] = hardened / unsafe
            rows.append(
                (
                    label,
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
        f"## Hardened mode on a DeepSpeed {version('deepspeed')} resume vs its own unsafe load "
        f"(torch {torch.__version__}, CPU accelerator, medians of {n} resumes in {ROUNDS} "
        "interpreters each)\n"
    )
    header = ("checkpoint (written by `save_checkpoint`)", "measured", "unsafe", "hardened")
    print(table((*header, "ratio", "ratio per round (min-max)"), rows))
    print(
        "\nBoth run `engine.load_checkpoint(folder, tag=...)` with the default "
        "`TorchCheckpointEngine` (`torch.load(weights_only=False)`) on a 25.2M-parameter MLP "
        "with `torch.optim.Adam`, one rank over gloo; unsafe: nothing armed (torch's full "
        "unpickler); hardened: `COMPATSHIM_AUTO=1 COMPATSHIM_SAFE_LOAD=1` (every `torch.load` "
        "weights-only). Checkpoint read: `load_checkpoint` (files read, then copied into the "
        "module and optimizer); its `torch.load` calls: the part of it spent in `torch.load` "
        "(DeepSpeed reads `mp_rank_00_model_states.pt` twice: its `SDLoader` loads it once "
        "only to check `mp_world_size`); "
        "whole resume: the read plus one more Adam step. In both modes the weights, optimizer "
        "state and step counters read equal those saved, and the step after is identical. "
        "Shared machine: other jobs ran beside it (load average below), so compare the ratios, "
        "not the milliseconds; the range is the ratio of the two interpreters run one after "
        "the other in each round."
    )
    shutil.rmtree(folder)
    print(json.dumps(ratios))
    return ratios


if __name__ == "__main__":
    main()
