"""Save and load a DCP folder under whichever torch runs this (``python -m`` from the repo root).

``save FOLDER``: a state with several dtypes, a transposed and a channels_last tensor, a
0-dim tensor, nested dicts and a non-tensor item, written by ``dcp.save`` alone (no
process group), and the same values as ``FOLDER.pt`` (``torch.save``). ``load FOLDER``:
plain ``dcp.load`` of that state's tensors into zeros; every value must equal the
``.pt`` file's, and ``meta`` (a dict without tensors, which torch 2.2 asks for as one item
and 2.3+ save entry by entry) equal the saved one.
Used by ``test_downgrade`` across the tox envs' interpreters.
"""

from __future__ import annotations

import inspect
import sys
import tempfile
import warnings
from typing import Any

import torch
import torch.distributed.checkpoint as dcp


def state() -> dict[str, Any]:
    gen = torch.Generator().manual_seed(0)
    conv = torch.randn(2, 3, 4, 5, generator=gen).to(memory_format=torch.channels_last)
    return {
        "model": {
            "w": torch.randn(6, 4, generator=gen),
            "wt": torch.randn(4, 6, generator=gen).t(),  # non-contiguous: strides (1, 6)
            "conv": conv,
            "bf16": torch.randn(8, generator=gen).to(torch.bfloat16),
            "ids": torch.arange(5, dtype=torch.int64),
        },
        "nested": {"inner": {"scale": torch.tensor(2.5)}},
        "meta": {"epoch": 3, "names": ["a", "b"]},
    }


def _tensors(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, torch.Tensor):
        return {prefix: value}
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, inner in value.items():
            out.update(_tensors(inner, f"{prefix}.{key}" if prefix else key))
        return out
    return {}


def _grouped() -> bool:
    return "checkpoint_id" not in inspect.signature(dcp.load).parameters  # torch 2.2


def main(mode: str, folder: str) -> None:
    if mode == "save":
        full = state()
        torch.save({k: v.contiguous() for k, v in _tensors(full).items()}, folder + ".pt")
        if _grouped():
            dcp.save(full, storage_writer=dcp.FileSystemWriter(folder), no_dist=True)
        else:
            dcp.save(full, checkpoint_id=folder, no_dist=True)
        return
    want = torch.load(folder + ".pt", weights_only=True)
    template = state()
    for value in _tensors(template).values():
        value.zero_()
    template["meta"] = {"epoch": 0, "names": []}
    if _grouped():  # torch 2.2's dcp.load gathers keys over a group, even alone
        import torch.distributed as dist

        store = tempfile.mktemp()
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
        # load_state_dict, not load: 2.2's load sets each top-level key back to the caller's
        # old value afterwards, dropping a non-tensor item it read (from 2.2's own folders too)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            dcp.load_state_dict(template, storage_reader=dcp.FileSystemReader(folder))
        dist.destroy_process_group()
    else:
        dcp.load(template, checkpoint_id=folder)
    got = _tensors(template)
    assert set(got) == set(want), (sorted(got), sorted(want))
    for key, value in want.items():
        assert torch.equal(got[key], value), key
    assert template["meta"] == state()["meta"], template["meta"]
    print(f"torch {torch.__version__}: {len(want)} tensors equal, meta equal")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
