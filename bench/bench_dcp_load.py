"""Hardened ``dcp.load`` (``torch-dcp-safe-metadata`` + hardened ``torch.load``) vs torch's own.

    python bench/bench_dcp_load.py [MiB] [tensors] [--ranks N] [--repeats R] [--only PART]

Part ``readers``: saves one DCP folder (``MiB`` of float32 tensors in ``tensors`` entries,
plus a few non-tensor items): from this process, or with ``--ranks N`` from N spawned gloo ranks,
each saving its own 1/N of the tensors with ``dcp.save`` (N ``.distcp`` files plus
``.metadata``). Then, in this process and without a process group, loads the whole
folder into a zeroed state dict alternately with torch's readers and with the hardened
ones (the same functions ``install()`` puts in place under ``COMPATSHIM_SAFE_LOAD=1``,
swapped in and out here), checks the loaded state equals the saved one, and prints
medians and their ratio.

Part ``adapter`` (torch 2.3+; issue 39: "the Stateful adapter adds <= 5% to a DCP load"):
a training state of a model of ``MiB`` float32 parameters with its AdamW moments (about
3x ``MiB`` on disk), a warmup+cosine ``SequentialLR`` and a CPU ``GradScaler``, saved with
``dcp.save``, then loaded into the same template alternately by plain ``dcp.load`` and by
``compatshim.optim.load_dcp``: the same release (nothing to fill) and a 2.4-style save
(without ``decoupled_weight_decay`` and ``_is_initial``, which plain ``dcp.load`` can only
load into a template without them; ``load_dcp`` takes the running template and fills them).

Part ``rewrite`` (issue 39: the dry run and the ``.metadata`` rewrite read no tensor data,
"time <= 1.10x of reading ``.metadata`` alone"): the folder of part ``readers`` (its
``extra`` item is a dict without tensors, which a rewrite for torch 2.2 reads and saves
whole), or with ``--training`` a training state of about ``MiB`` on disk (a model of a
third of it in ``tensors`` Linear layers, its AdamW moments, a warmup+cosine SequentialLR
and a GradScaler, each rank saving the whole replicated state, as DDP does); then,
interleaved in this process: torch's own read of ``.metadata``
(``FileSystemReader.read_metadata``, an unchecked ``pickle.load``), compatshim's hardened
read of it (``_dcp_records.read_folder``, what the other two start with), the same with each
non-tensor item read hardened as the dry run reads it (what the dry run must read to say
what hardened mode refuses, and a rewrite for 2.2 to save a dict whole), ``downgrade_dcp``
for 2.4 and for 2.2 into a fresh folder each call (data files hard-linked), and
``plan_resume`` against the zeroed template (``--training``: the same model built from
another seed, as a resuming script builds it).
"""

from __future__ import annotations

import argparse
import faulthandler
import io
import os
import pickle
import shutil
import socket
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from _common import interleaved, median, ms, table
from torch.distributed.checkpoint import filesystem

from compatshim._engine.patching import Patcher
from compatshim.patches import torch_dcp_safe_metadata as patch
from compatshim.patches.torch_load_safe_globals import _wrap


def _tensor(i: int, per: int, zero: bool) -> torch.Tensor:
    """Tensor ``i``: seeded by its index, so a rank and the checker make the same one."""
    if zero:
        return torch.zeros(per)
    return torch.randn(per, generator=torch.Generator().manual_seed(i))


def _state(mib: int, count: int, zero: bool, ranks: int = 1, rank: int = 0) -> dict[str, Any]:
    """The state (or, for ``rank`` of ``ranks``, its share of the tensors)."""
    per = max(mib * 2**20 // 4 // count, 1)
    mine = range(count) if ranks == 1 else range(rank, count, ranks)
    tensors = {f"layer{i}.weight": _tensor(i, per, zero) for i in mine}
    return {"model": tensors, "step": 0 if zero else 1000, "extra": {"lr": 0.0 if zero else 0.1}}


def _save(folder: str, state: dict[str, Any], no_dist: bool) -> None:
    writer = dcp.FileSystemWriter(folder)
    if hasattr(dcp, "save"):
        dcp.save(state, storage_writer=writer)
    else:  # torch < 2.2
        dcp.save_state_dict(state, storage_writer=writer, no_dist=no_dist)


def _load(folder: str, state: dict[str, Any]) -> None:
    reader = dcp.FileSystemReader(folder)
    if hasattr(dcp, "load"):
        dcp.load(state, storage_reader=reader)
    else:  # torch < 2.2
        dcp.load_state_dict(state, storage_reader=reader, no_dist=True)


def _rank_save(
    rank: int,
    ranks: int,
    port: int,
    folder: str,
    mib: int,
    count: int,
    timeout: float,
    training: bool = False,
) -> None:
    """One spawned rank: join the gloo group, save its share of the state (``training``:
    the whole replicated training state, which DCP spreads over the ranks' files)."""
    warnings.simplefilter("ignore")
    faulthandler.dump_traceback_later(timeout, exit=True)  # a stuck rank says where, and ends
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=ranks
    )
    try:
        if training:
            state = _template(*_training(mib // 3, count))
        else:
            state = _state(mib, count, zero=False, ranks=ranks, rank=rank)
        _save(folder, state, no_dist=False)
    finally:
        dist.destroy_process_group()


def _save_ranks(
    folder: str, mib: int, count: int, ranks: int, timeout: float = 600, training: bool = False
) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    args = (ranks, port, folder, mib, count, timeout, training)
    context = mp.start_processes(_rank_save, args, ranks, join=False, start_method="spawn")
    try:
        for _ in range(int(timeout)):
            if context.join(timeout=1):
                return
        raise TimeoutError(f"{ranks} ranks did not save within {timeout:.0f} s")
    finally:
        for proc in context.processes:
            if proc.is_alive():
                proc.kill()


def _training(mib: int, count: int, seed: int = 0) -> tuple[Any, ...]:
    """A model of ``mib`` MiB of float32 parameters in ``count`` layers, AdamW stepped once
    (its moments allocated), a warmup+cosine SequentialLR and a CPU GradScaler."""
    torch.manual_seed(seed)
    width = max(int((mib * 2**20 / 4 / count) ** 0.5), 1)
    model = torch.nn.Sequential(*(torch.nn.Linear(width, width) for _ in range(count)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler
    scheduler = sched.SequentialLR(
        optimizer,
        [sched.LinearLR(optimizer, 0.1, total_iters=10), sched.CosineAnnealingLR(optimizer, 90)],
        milestones=[10],
    )
    for parameter in model.parameters():
        parameter.grad = torch.ones_like(parameter)
    optimizer.step()
    scheduler.step()
    return model, optimizer, scheduler, torch.amp.GradScaler("cpu")


def _template(model: Any, optimizer: Any, scheduler: Any, scaler: Any) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer)
    return {
        "model": model_sd,
        "optim": optim_sd,
        "sched": scheduler.state_dict(),
        "scaler": scaler.state_dict(),
        "step": 1,
    }


def _as_2_4(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` without the keys torch 2.4.1 did not save (AdamW's ``decoupled_weight_decay``,
    a scheduler's ``_is_initial``), as a 2.4 save holds it (``verbose`` is left out: the
    running release has no such key to plan)."""
    state = dict(state, optim=dict(state["optim"]), sched=dict(state["sched"]))
    groups = [dict(g) for g in state["optim"]["param_groups"]]
    for group in groups:
        group.pop("decoupled_weight_decay", None)
    state["optim"]["param_groups"] = groups
    state["sched"].pop("_is_initial", None)
    inner = [dict(s) for s in state["sched"].get("_schedulers", [])]
    for one in inner:
        one.pop("_is_initial", None)
    state["sched"]["_schedulers"] = inner
    return state


def adapter(mib: int = 96, count: int = 48, repeats: int = 7) -> None:
    """Plain ``dcp.load`` vs ``compatshim.optim.load_dcp`` of the same folder, interleaved.

    On a shared box the wall-clock medians move by more than 5% between two runs of the same
    load, so each ``load_dcp`` call also times the ``dcp.load`` it makes (torch's function,
    wrapped here): the rest of the call is the adapter's own time, measured under the same
    load as the read it adds to."""
    import time

    from torch.distributed.checkpoint import state_dict_loader

    from compatshim.optim import load_dcp

    warnings.simplefilter("ignore")
    model, optimizer, scheduler, scaler = _training(mib, count)
    saved = _template(model, optimizer, scheduler, scaler)
    torch_load = state_dict_loader.load
    inner: list[float] = []

    def timed_load(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return torch_load(*args, **kwargs)
        finally:
            inner.append(time.perf_counter() - start)

    def one(case: str, folder: str) -> list[str]:
        on_disk = saved if case == "same release" else _as_2_4(saved)
        dcp.save(on_disk, checkpoint_id=folder)
        fresh = _training(mib, count, seed=1)  # another run's values: the load replaces them
        plain_state = _template(*fresh)
        if case != "same release":
            plain_state = _as_2_4(plain_state)
        shim_state = _template(*fresh)
        shim_objects = dict(zip(("optim", "sched", "scaler"), fresh[1:]))
        filled: tuple[str, ...] = ()

        def plain() -> None:
            dcp.load(plain_state, checkpoint_id=folder)

        def shim() -> None:
            nonlocal filled
            filled = load_dcp(shim_state, shim_objects, checkpoint_id=folder)

        state_dict_loader.load = timed_load
        try:
            samples = interleaved({"plain": plain, "shim": shim}, repeats)
        finally:
            state_dict_loader.load = torch_load
        assert len(inner) == len(samples["shim"]) + 1  # + the warm-up call
        own = [total - read for total, read in zip(samples["shim"], inner[1:])]
        share = [o / read for o, read in zip(own, inner[1:])]
        inner.clear()
        assert all(torch.equal(v, saved["model"][k]) for k, v in shim_state["model"].items()), (
            "load_dcp's model differs from the saved one"
        )
        assert shim_state["sched"]["last_epoch"] == saved["sched"]["last_epoch"]
        assert bool(filled) == (case != "same release"), filled
        size = sum(p.stat().st_size for p in Path(folder).iterdir())
        base, shim_median = median(samples["plain"]), median(samples["shim"])
        return [
            f"{case}, {size / 2**20:.0f} MiB, {len(saved['model'])} parameters"
            + (f" ({len(filled)} keys filled)" if filled else ""),
            ms(base),
            ms(shim_median),
            f"{shim_median / base:.3f}",
            ms(median(own)),
            f"**{1 + median(share):.4f}**",
        ]

    rows = []
    for case in ("same release", "2.4-style save"):
        folder = tempfile.mkdtemp(prefix="bench-dcp-adapter-")
        try:
            rows.append(one(case, folder))
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    print(
        f"\ntorch {torch.__version__}: model + AdamW + SequentialLR + GradScaler, "
        f"{repeats} interleaved loads each, medians; loaded state equals saved state"
    )
    print(
        table(
            [
                "case",
                "plain dcp.load",
                "load_dcp",
                "wall ratio",
                "adapter's own time",
                "load_dcp / its dcp.load",
            ],
            rows,
        )
    )


def _saved_folder(prefix: str, mib: int, count: int, ranks: int, training: bool = False) -> str:
    """A new folder holding the state, saved by this process or by ``ranks`` gloo ranks
    (``training``: a model of ``mib // 3`` MiB in ``count`` layers with its AdamW moments,
    its scheduler and GradScaler, about ``mib`` MiB on disk)."""
    folder = tempfile.mkdtemp(prefix=prefix)
    try:
        if ranks == 1 and training:
            _save(folder, _template(*_training(mib // 3, count)), no_dist=True)
        elif ranks == 1:
            _save(folder, _state(mib, count, zero=False), no_dist=True)
        else:
            _save_ranks(folder, mib, count, ranks, training=training)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return folder


def main(mib: int = 256, count: int = 64, ranks: int = 1, repeats: int = 7) -> None:
    warnings.simplefilter("ignore")
    folder = _saved_folder("bench-dcp-", mib, count, ranks)
    try:
        target = _state(mib, count, zero=True)
        original_load, original_view = torch.load, vars(filesystem).get("_create_file_view")
        hardened_load = _wrap(original_load, True, Patcher())
        safe = patch.safe_pickle(pickle)

        def use(load: Any, pickle_module: Any, view: Any) -> None:
            torch.load = torch.serialization.load = load
            filesystem.pickle = pickle_module
            if view is not None:
                filesystem._create_file_view = view

        def plain() -> None:
            use(original_load, pickle, original_view)
            _load(folder, target)

        def hardened() -> None:
            use(hardened_load, safe, patch._file_slice)
            _load(folder, target)

        load_avg = os.getloadavg()[0]
        samples = interleaved({"torch": plain, "hardened": hardened}, repeats)
        use(original_load, pickle, original_view)
        load_avg_end = os.getloadavg()[0]
        # the last load was the hardened one: it must give back exactly what was saved
        expected = _state(mib, count, zero=False)
        assert target.keys() == expected.keys() and target["step"] == expected["step"]
        assert target["extra"] == expected["extra"]
        assert target["model"].keys() == expected["model"].keys()
        assert all(torch.equal(v, expected["model"][k]) for k, v in target["model"].items())
        del expected
        base, hard = median(samples["torch"]), median(samples["hardened"])
        files = list(Path(folder).iterdir())
        size = sum(p.stat().st_size for p in files)
        distcp = sum(p.suffix == ".distcp" for p in files)
        print(
            f"torch {torch.__version__}, {size / 2**20:.0f} MiB in {count} tensors, "
            f"saved by {ranks} rank(s) into {distcp} .distcp files, {repeats} loads; "
            f"load average {load_avg:.1f} at start, {load_avg_end:.1f} at end; "
            "loaded state equals saved state"
        )
        print(
            table(
                ["reader", "median", "ratio"],
                [
                    ["torch (pickle.load, torch.load)", ms(base), "1.00"],
                    ["hardened (compatshim)", ms(hard), f"{hard / base:.3f}"],
                ],
            )
        )
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def rewrite(
    mib: int = 1024, count: int = 64, ranks: int = 4, repeats: int = 7, training: bool = False
) -> None:
    """Reading ``.metadata`` alone, and with the non-tensor items, against the dry run and
    the rewrite, interleaved."""
    from compatshim.checkpoint import downgrade_dcp, plan_resume
    from compatshim.checkpoint._dcp_records import read_folder
    from compatshim.checkpoint._resume_plan import _read_item

    warnings.simplefilter("ignore")
    folder = _saved_folder("bench-dcp-rewrite-", mib, count, ranks, training)
    out = tempfile.mkdtemp(prefix="bench-dcp-rewrite-out-")
    made = [0]
    try:
        if training:  # the running script's state: another seed, as a resume builds it
            template = _template(*_training(mib // 3, count, seed=1))
        else:
            template = _state(mib, count, zero=True)
        plans: list[Any] = []

        def downgrade(release: str) -> Any:
            def run() -> None:  # each call writes a fresh folder, removed after the timing
                made[0] += 1
                downgrade_dcp(folder, os.path.join(out, f"d{made[0]}"), torch=release)

            return run

        held = read_folder(folder)
        fqns = [fqn for fqn, t in held.entries.items() if t is None]
        items = [held.storage_for(fqn) for fqn in fqns]

        def read_with_items() -> None:  # all a load reads but tensor data, read as the dry run does
            read = read_folder(folder)
            for fqn in fqns:
                _read_item(read, fqn)

        def torch_items() -> None:  # what dcp.load spends on them: each file read, torch.load
            for item in items:
                torch.load(io.BytesIO(held.stored(item)), weights_only=True)

        runs = {
            "torch's read of .metadata (pickle.load)": lambda: dcp.FileSystemReader(
                folder
            ).read_metadata(),
            "compatshim's hardened read of .metadata": lambda: read_folder(folder),
            f"the same, and the {len(fqns)} non-tensor items read hardened": read_with_items,
            "downgrade_dcp(torch='2.4')": downgrade("2.4"),
            "downgrade_dcp(torch='2.2'): the dicts without tensors saved whole": downgrade("2.2"),
            "plan_resume (dry run, hardened)": lambda: plans.append(plan_resume(folder, template)),
            f"torch.load(weights_only=True) of the {len(items)} non-tensor items": torch_items,
        }
        load_avg = os.getloadavg()[0]
        samples = interleaved(runs, repeats, balanced=True)
        load_avg_end = os.getloadavg()[0]
        assert plans and plans[-1].ok, plans[-1] if plans else "no plan"
        base = median(samples["torch's read of .metadata (pickle.load)"])
        hardened = median(samples["compatshim's hardened read of .metadata"])
        with_items = median(
            samples[f"the same, and the {len(fqns)} non-tensor items read hardened"]
        )
        files = list(Path(folder).iterdir())
        size = sum(f.stat().st_size for f in files)
        meta = (Path(folder) / ".metadata").stat().st_size
        shape = (
            f"a model of {count} Linear layers with its AdamW moments, a SequentialLR and a "
            f"GradScaler ({len(held.tensors())} tensors + {len(held.entries) - len(held.tensors())}"
            " other items)"
            if training
            else f"{count} tensors + 2 items"
        )
        print(
            f"\ntorch {torch.__version__}: {size / 2**20:.0f} MiB in {shape}, "
            f"saved by {ranks} rank(s), .metadata {meta / 1024:.1f} KiB; {repeats} interleaved "
            f"calls each, in balanced orders (each contender first, and right after each other "
            "one, equally often), medians; load average "
            f"{load_avg:.1f} at start, {load_avg_end:.1f} at end"
        )
        print(
            table(
                [
                    "call",
                    "median",
                    "vs torch's read of .metadata",
                    "vs the hardened read",
                    "vs the hardened read with the items",
                ],
                [
                    [
                        name,
                        ms(t),
                        f"{t / base:.2f}x",
                        f"{t / hardened:.2f}x",
                        f"{t / with_items:.2f}x",
                    ]
                    for name, t in ((name, median(v)) for name, v in samples.items())
                ],
            )
        )
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "mib", type=int, nargs="?", help="256 (readers), 96 (adapter), 1024 (rewrite)"
    )
    parser.add_argument("tensors", type=int, nargs="?", default=64)
    parser.add_argument("--ranks", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--only", choices=("readers", "adapter", "rewrite"))
    parser.add_argument(
        "--training",
        action="store_true",
        help="rewrite: a training state of about MiB on disk in `tensors` layers",
    )
    options = parser.parse_args()
    if options.only == "rewrite":
        rewrite(
            options.mib or 1024, options.tensors, options.ranks, options.repeats, options.training
        )
    elif options.only != "adapter":
        main(options.mib or 256, options.tensors, options.ranks, options.repeats)
    if options.only in (None, "adapter"):
        if hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler"):  # torch 2.3+
            adapter(options.mib or 96, 48, options.repeats)
        else:
            print(f"\nadapter part skipped: torch {torch.__version__} has no CPU GradScaler")
