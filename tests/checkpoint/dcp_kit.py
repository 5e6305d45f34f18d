"""Real torch.distributed.checkpoint folders for the DCP tests, on every torch from 2.1.

torch 2.1 has ``save_state_dict``/``load_state_dict`` (``no_dist=True`` without a
process group); 2.2 adds ``save``/``load``, but its ``load`` gathers the keys over a
process group even with ``no_dist=True``, so one process loads there with
``load_state_dict`` (the same reader and planner); from 2.3 ``save``/``load`` need no group.
``poison_*`` write hostile copies whose payload would touch a marker file (the tests
assert it never exists).
"""

from __future__ import annotations

import inspect
import os
import pickle
import shutil
import struct
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

ROOT = str(Path(__file__).resolve().parents[2])  # where ``tests`` is a package
# torch 2.2's save needs a process group unless told ``no_dist=True`` (2.3 decides alone)
GROUPLESS = hasattr(dcp, "load") and "checkpoint_id" in inspect.signature(dcp.load).parameters
_NO_DIST: dict[str, Any] = {} if GROUPLESS else {"no_dist": True}


class Payload:
    """Pickles as ``os.system("touch MARKER")``."""

    def __init__(self, marker: Path | str) -> None:
        self.marker = marker

    def __reduce__(self) -> Any:
        return (os.system, (f"touch {self.marker}",))


def state(extra: Any = None) -> dict[str, Any]:
    """A small model + training state; ``zeros_like`` of it is the load template."""
    return {
        "model": {
            "w": torch.arange(12, dtype=torch.float32).reshape(3, 4),
            "b": torch.tensor([1.5, -2.0, 0.25, 4.0], dtype=torch.bfloat16),
        },
        "step": 7,
        "extra": {"name": "run-1", "lrs": [0.1, 0.01]} if extra is None else extra,
    }


def template() -> dict[str, Any]:
    return {
        "model": {"w": torch.zeros(3, 4), "b": torch.zeros(4, dtype=torch.bfloat16)},
        "step": 0,
        "extra": {"name": "", "lrs": []},
    }


def save(folder: Path | str, state_dict: dict[str, Any]) -> None:
    """One process, no process group."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        writer = dcp.FileSystemWriter(str(folder))
        if hasattr(dcp, "save"):
            dcp.save(state_dict, storage_writer=writer, **_NO_DIST)
        else:
            dcp.save_state_dict(state_dict, storage_writer=writer, no_dist=True)


def load(folder: Path | str, state_dict: dict[str, Any], reader: Any = None) -> None:
    """``dcp.load`` (2.3+) or ``load_state_dict`` (2.1, 2.2), in place (``FileSystemReader``
    unless another ``reader`` is given)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reader = reader or dcp.FileSystemReader(str(folder))
        if GROUPLESS:
            dcp.load(state_dict, storage_reader=reader)
        else:
            dcp.load_state_dict(state_dict, storage_reader=reader, no_dist=True)


def save_ranks(rank: int, world_size: int, folder: str) -> int:
    """Each gloo rank saves its own tensor (so each writes a data file) and the shared state.

    Run with ``run_ranks(..., init=False)``: the group is made here and left to the
    process's exit (on torch 2.1 ``destroy_process_group`` can hang once a peer is gone).
    """
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    own = {f"rank{rank}.w": torch.full((2, rank + 1), float(rank))}
    state_dict = {**state(), **own}
    writer = dcp.FileSystemWriter(folder)
    if hasattr(dcp, "save"):
        dcp.save(state_dict, storage_writer=writer)
    else:
        dcp.save_state_dict(state_dict, storage_writer=writer)
    dist.barrier()
    return rank


def shared_lists(folder: Path, shared: str, uses: int = 10_000) -> Path:
    """A folder whose ``.metadata`` (under 400 KB) shares one list among ``uses`` entries by
    memo reads: one route tuple of 10,000 parts for every planner_data key (``"route"``), or
    one TensorStorageMetadata with 1,000 chunks for every fqn (``"chunks"``). Walked at each
    use, as torch's planner walks it: 10**7-10**8 steps. ``"chunk"``: one fqn whose list
    holds one chunk and ``uses`` memo reads of it, 2-5 bytes each, where torch writes 120+
    with its storage entry. ``"sizes"``: one fqn with ``uses`` chunks, each its own record
    but all holding one ``torch.Size`` by memo reads, 16 bytes each.
    Named as the running torch names TensorProperties (2.3 moved it), so its own hardened
    reader gets as far as the walk."""
    import importlib

    from torch.distributed.checkpoint.metadata import TensorProperties

    from compatshim.checkpoint._downgrade import _Pickler

    out = _Pickler()
    keep, again = b"r" + struct.pack("<I", 9999), b"j" + struct.pack("<I", 9999)  # memo 9999
    dcp_ = "torch.distributed.checkpoint.metadata"
    home = TensorProperties.__module__
    encoding = next(n for n in ("_MEM_FORMAT_ENCODING", "MEM_FORMAT_ENCODING")
                    if hasattr(importlib.import_module(home), n))  # fmt: skip
    classes = [
        f"{dcp_}.{name}" for name in ("Metadata", "TensorStorageMetadata", "ChunkStorageMetadata")
    ]
    classes += [f"{home}.TensorProperties", f"{home}.{encoding}"]
    ref = out.declare([*classes, "torch.Size", "torch.float32", "torch.serialization._get_layout"])
    size = ref["torch.Size"] + b"((J\x01\x00\x00\x00ttR"
    props = (
        ref[f"{home}.TensorProperties"] + b")\x81(" + ref["torch.float32"]
        + ref["torch.serialization._get_layout"] + out.encode(("torch.strided",)) + b"R\x89"
        + ref[f"{home}.{encoding}"] + out.encode((0,)) + b"R\x89tb"
    )  # fmt: skip
    chunk = ref[f"{dcp_}.ChunkStorageMetadata"] + b")\x81}("
    chunk += out.encode("offsets") + size + out.encode("sizes") + size + b"ub"
    tsm = ref[f"{dcp_}.TensorStorageMetadata"]
    if shared == "route":
        one = b"(" + b"".join(out.encode(f"p{i}") for i in range(10_000)) + b"t"
        planner = b"}(" + b"".join(
            out.encode(f"k{i}") + (one + keep if i == 0 else again) for i in range(uses)
        ) + b"u"  # fmt: skip
        sdm = b"}"
    elif shared in ("chunk", "sizes"):
        listed = chunk + keep + again * (uses - 1)
        if shared == "sizes":  # memo 250, 251, 252: "offsets", the Size, "sizes"
            head = chunk[: chunk.index(b"(") + 1]  # the class, NEWOBJ, a dict, MARK
            key, dims, key2 = b"h\xfa", b"h\xfb", b"h\xfc"  # each fetched in 2 bytes
            listed = head + out.encode("offsets") + b"q\xfa" + size + b"q\xfb"
            listed += out.encode("sizes") + b"q\xfc" + dims + b"ub"
            listed += (head + key + dims + key2 + dims + b"ub") * (uses - 1)
        sdm = b"}(" + out.encode("t") + tsm + b")\x81}(" + out.encode("properties") + props
        sdm += out.encode("size") + size + out.encode("chunks") + b"](" + listed + b"eubu"
        planner = b"N"
    else:
        one = tsm + b")\x81}(" + out.encode("properties") + props + out.encode("size") + size
        one += out.encode("chunks") + b"](" + chunk * 1_000 + b"eub"
        sdm = b"}(" + b"".join(
            out.encode(f"t{i}") + (one + keep if i == 0 else again) for i in range(uses)
        ) + b"u"  # fmt: skip
        planner = b"N"
    top = ref[f"{dcp_}.Metadata"] + b")\x81}("
    out.raw(top + out.encode("state_dict_metadata") + sdm + out.encode("planner_data"))
    out.raw(planner + out.encode("storage_data") + b"}ub")
    folder.mkdir()
    (folder / ".metadata").write_bytes(out.finish())
    return folder


def poison_metadata(source: Path, target: Path, marker: Path) -> None:
    """A copy of ``source`` whose ``.metadata`` also holds the payload (our own file: read
    with pickle here, in the test process, on purpose)."""
    shutil.copytree(source, target)
    with open(source / ".metadata", "rb") as file:
        metadata = pickle.load(file)
    metadata.planner_data = {"poison": Payload(marker)}
    with open(target / ".metadata", "wb") as file:
        pickle.dump(metadata, file)


def digest(state_dict: dict[str, Any]) -> dict[str, Any]:
    return {
        "w": state_dict["model"]["w"].tolist(),
        "b": state_dict["model"]["b"].float().tolist(),
        "step": state_dict["step"],
        "extra": state_dict["extra"],
    }


# The hardened child: reads a folder one way (``mode``) and prints one RESULT line.
CHILD = r"""
import json, sys, warnings
warnings.simplefilter("ignore")
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import filesystem
import compatshim
from tests.checkpoint.dcp_kit import digest, load, template

mode, folder = sys.argv[1], sys.argv[2]
result = {"pickle_is_module": type(filesystem.pickle).__name__ == "module"}
try:
    if mode == "load":
        loaded = template()
        load(folder, loaded)
        result["values"] = digest(loaded)
    elif mode == "load_item":  # "extra" as one item (2.4 would plan a dict template key by key)
        load(folder, {**template(), "extra": None})
    elif mode == "reader":
        dcp.FileSystemReader(folder).read_metadata()
    elif mode == "load_in_group":  # dcp.load itself in a one-rank gloo group (2.2 needs one)
        import torch.distributed as dist
        dist.init_process_group("gloo", init_method="file://" + sys.argv[3], rank=0, world_size=1)
        loaded = template()
        (getattr(dcp, "load", None) or dcp.load_state_dict)(  # 2.1: load_state_dict
            loaded, storage_reader=dcp.FileSystemReader(folder)
        )
        result["values"] = digest(loaded)
    elif mode in ("fsspec_reader", "fsspec_load"):  # torch 2.1-2.3: its own pickle.load
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader
        from torch.distributed.checkpoint import _fsspec_filesystem as fsspec_fs
        result["fsspec_pickle_is_module"] = type(vars(fsspec_fs).get("pickle")).__name__ == "module"
        if mode == "fsspec_reader":
            FsspecReader(folder).read_metadata()
        else:
            loaded = template()
            load(folder, loaded, reader=FsspecReader(folder))
            result["values"] = digest(loaded)
    elif mode == "to_torch_save":
        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
        dcp_to_torch_save(folder, sys.argv[3])
        result["values"] = digest(torch.load(sys.argv[3]))
    elif mode == "lightning":  # what lightning's consolidate_checkpoint runs
        from lightning.fabric.utilities.load import _load_distributed_checkpoint
        result["values"] = digest(_load_distributed_checkpoint(__import__("pathlib").Path(folder)))
    elif mode == "accelerate":  # accelerate merge-weights
        from accelerate.utils import merge_fsdp_weights
        merge_fsdp_weights(folder, sys.argv[3], safe_serialization=False)
        result["values"] = digest(torch.load(sys.argv[3] + "/pytorch_model.bin"))
    result["ok"] = True
except BaseException as exc:  # DCP raises CheckpointException, a BaseException
    result.update(ok=False, type=type(exc).__name__, error=str(exc)[-3000:])
    result["compatshim_error"] = isinstance(exc, compatshim.checkpoint.CheckpointError)
    result["exception"] = isinstance(exc, Exception)
row = [s for s in compatshim.status() if s.name == "torch-dcp-safe-metadata"][0]
result.update(defect=row.defect, fixed=row.fixed)
print("RESULT " + json.dumps(result))
"""


def run_hardened(tmp_path: Path, mode: str, *args: Any, hardened: bool = True) -> dict[str, Any]:
    """:data:`CHILD` in a fresh interpreter armed by ``COMPATSHIM_AUTO=1`` and, unless
    ``hardened=False``, ``COMPATSHIM_SAFE_LOAD=1``; its RESULT record."""
    from tests.checkpoint.test_hardened import run_child

    script = tmp_path / "dcp_child.py"
    script.write_text(CHILD)
    env = {"PYTHONPATH": os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)}
    if not hardened:
        env["COMPATSHIM_SAFE_LOAD"] = "0"
    return run_child(script, mode, *map(str, args), **env)
