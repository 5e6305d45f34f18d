"""Hardened ``dcp.load`` (``torch-dcp-safe-metadata`` + hardened ``torch.load``) vs torch's own.

    python bench/bench_dcp_load.py [MiB] [tensors] [--ranks N] [--repeats R]

Saves one DCP folder (``MiB`` of float32 tensors in ``tensors`` entries, plus a few
non-tensor items): from this process, or with ``--ranks N`` from N spawned gloo ranks,
each saving its own 1/N of the tensors with ``dcp.save`` (N ``.distcp`` files plus
``.metadata``). Then, in this process and without a process group, loads the whole
folder into a zeroed state dict alternately with torch's readers and with the hardened
ones (the same functions ``install()`` puts in place under ``COMPATSHIM_SAFE_LOAD=1``,
swapped in and out here), checks the loaded state equals the saved one, and prints
medians and their ratio.
"""

from __future__ import annotations

import argparse
import faulthandler
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
    rank: int, ranks: int, port: int, folder: str, mib: int, count: int, timeout: float
) -> None:
    """One spawned rank: join the gloo group, save its share of the state."""
    warnings.simplefilter("ignore")
    faulthandler.dump_traceback_later(timeout, exit=True)  # a stuck rank says where, and ends
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=ranks
    )
    try:
        _save(folder, _state(mib, count, zero=False, ranks=ranks, rank=rank), no_dist=False)
    finally:
        dist.destroy_process_group()


def _save_ranks(folder: str, mib: int, count: int, ranks: int, timeout: float = 600) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    args = (ranks, port, folder, mib, count, timeout)
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


def main(mib: int = 256, count: int = 64, ranks: int = 1, repeats: int = 7) -> None:
    warnings.simplefilter("ignore")
    folder = tempfile.mkdtemp(prefix="bench-dcp-")
    try:
        if ranks == 1:
            _save(folder, _state(mib, count, zero=False), no_dist=True)
        else:
            _save_ranks(folder, mib, count, ranks)
        target = _state(mib, count, zero=True)
        original_load, original_view = torch.load, vars(filesystem).get("_create_file_view")
        hardened_load = _wrap(original_load, hardened=True)
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


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mib", type=int, nargs="?", default=256)
    parser.add_argument("tensors", type=int, nargs="?", default=64)
    parser.add_argument("--ranks", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=7)
    options = parser.parse_args()
    main(options.mib, options.tensors, options.ranks, options.repeats)
