"""Hardened ``dcp.load`` (``torch-dcp-safe-metadata`` + hardened ``torch.load``) vs torch's own.

    python bench/bench_dcp_load.py [MiB] [tensors]

Saves one DCP folder (``MiB`` of float32 tensors in ``tensors`` entries, plus a few
non-tensor items), then loads it into a zeroed state dict alternately with torch's
readers and with the hardened ones (the same functions ``install()`` puts in place
under ``COMPATSHIM_SAFE_LOAD=1``, swapped in and out in this one process), and
prints medians and their ratio.
"""

from __future__ import annotations

import pickle
import shutil
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed.checkpoint as dcp
from _common import interleaved, median, ms, table
from torch.distributed.checkpoint import filesystem

from compatshim._engine.versions import version_at_least
from compatshim.patches import torch_dcp_safe_metadata as patch
from compatshim.patches.torch_load_safe_globals import _wrap


def _state(mib: int, count: int, zero: bool) -> dict[str, Any]:
    per = max(mib * 2**20 // 4 // count, 1)
    make: Callable[..., Any] = torch.zeros if zero else torch.randn
    tensors = {f"layer{i}.weight": make(per) for i in range(count)}
    return {"model": tensors, "step": 0 if zero else 1000, "extra": {"lr": 0.0 if zero else 0.1}}


def _load(folder: str, state: dict[str, Any]) -> None:
    reader = dcp.FileSystemReader(folder)
    if hasattr(dcp, "load"):
        dcp.load(state, storage_reader=reader)
    else:
        dcp.load_state_dict(state, storage_reader=reader, no_dist=True)


def main(mib: int = 256, count: int = 64, repeats: int = 7) -> None:
    warnings.simplefilter("ignore")
    folder = tempfile.mkdtemp(prefix="bench-dcp-")
    try:
        writer = dcp.FileSystemWriter(folder)
        state = _state(mib, count, zero=False)
        if hasattr(dcp, "save"):
            dcp.save(state, storage_writer=writer)
        else:
            dcp.save_state_dict(state, storage_writer=writer, no_dist=True)
        target = _state(mib, count, zero=True)
        original_load, original_view = torch.load, vars(filesystem).get("_create_file_view")
        torch_checks = version_at_least(torch.__version__, "2.6")
        hardened_load = _wrap(original_load, hardened=True, torch_checks=torch_checks)
        safe = patch.SafePickle(pickle)

        def use(load: Any, pickle_module: Any, view: Any) -> None:
            torch.load = torch.serialization.load = load
            filesystem.pickle = pickle_module
            if view is not None and not torch_checks:
                filesystem._create_file_view = view

        def plain() -> None:
            use(original_load, pickle, original_view)
            _load(folder, target)

        def hardened() -> None:
            use(hardened_load, safe, patch._file_slice)
            _load(folder, target)

        samples = interleaved({"torch": plain, "hardened": hardened}, repeats)
        use(original_load, pickle, original_view)
        assert torch.equal(target["model"]["layer0.weight"], state["model"]["layer0.weight"])
        base, hard = median(samples["torch"]), median(samples["hardened"])
        size = sum(p.stat().st_size for p in Path(folder).iterdir())
        print(
            f"torch {torch.__version__}, {size / 2**20:.0f} MiB in {count} tensors, {repeats} loads"
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
    main(*map(int, sys.argv[1:3]))
