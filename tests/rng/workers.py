"""Module-level functions the distributed RNG tests run on real gloo ranks."""

from __future__ import annotations

import random
import warnings
from typing import Any

import numpy as np
import torch

import compatshim.rng as rng


def draws(count: int = 4) -> dict[str, list[float]]:
    """The next draws of every CPU generator (consumes them)."""
    return {
        "python": [random.random() for _ in range(count)],
        "numpy": np.random.rand(count).tolist(),
        "torch": torch.rand(count, dtype=torch.float64).tolist(),
    }


def save_then_draw(rank: int, world_size: int, path: str) -> dict[str, Any]:
    """Seed per rank, advance, save every rank's state, then return the continuation draws."""
    random.seed(100 + rank)
    np.random.seed(200 + rank)
    torch.manual_seed(300 + rank)
    draws(3)
    rng.save(path)
    return draws()


def load_then_draw(rank: int, world_size: int, path: str, policies: list[str]) -> list[Any]:
    """For each policy: load the file on this rank, then the draws that follow (or the error)."""
    return [load_once(path, policy) for policy in policies]


def load_once(path: str, policy: str, **position: int) -> dict[str, Any]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            report = rng.load(path, on_world_size_mismatch=policy, **position)  # type: ignore[arg-type]
        except rng.RNGStateError as exc:
            return {"error": str(exc)}
    return {
        "draws": draws(),
        "restored": list(report.restored),
        "derived": list(report.derived),
        "exact": report.exact,
        "saved_rank": report.saved_rank,
        "warnings": [str(w.message) for w in caught if issubclass(w.category, rng.RNGStateWarning)],
    }


def save_where_rank_0_cannot_write(rank: int, world_size: int, folder: str) -> dict[str, Any]:
    """Rank 0's folder is missing (a node without the shared disk): what each rank meets."""
    import os

    path = os.path.join(folder, "missing", "rng.pt")  # one path, as save() asks
    try:
        rng.save(path)
    except Exception as exc:  # the error is the result
        return {"type": type(exc).__name__, "error": str(exc)}
    return {"type": None}


def save_to_a_path_per_rank(rank: int, world_size: int, folder: str) -> dict[str, Any]:
    """``save(f"rng_{rank}.pt")``, as per-rank RNG files are often named elsewhere."""
    import os

    try:
        rng.save(os.path.join(folder, f"rng_{rank}.pt"))
    except Exception as exc:  # the error is the result
        return {"type": type(exc).__name__, "error": str(exc), "files": sorted(os.listdir(folder))}
    return {"type": None, "files": sorted(os.listdir(folder))}


def restore_rank_0_checkpoint(rank: int, world_size: int, path: str) -> dict[str, Any]:
    """Rank 0 alone saves a checkpoint holding its ``capture()``; every rank restores from it."""
    import torch.distributed as dist

    torch.manual_seed(1000 + rank)
    if rank == 0:
        torch.save({"step": 10, "rng": rng.capture()}, path)
    dist.barrier()
    checkpoint = torch.load(path, weights_only=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = rng.restore(checkpoint["rng"])
    return {
        "draws": draws(),
        "exact": report.exact,
        "derived": list(report.derived),
        "warnings": [str(w.message) for w in caught if issubclass(w.category, rng.RNGStateWarning)],
    }


def dcp_capture_round_trip(rank: int, world_size: int, folder: str) -> dict[str, Any]:
    """Every rank saves its capture() under one key of a DCP checkpoint, then restores it."""
    import torch.distributed.checkpoint as dcp

    random.seed(100 + rank)
    np.random.seed(200 + rank)
    torch.manual_seed(300 + rank)
    save = getattr(dcp, "save", None) or dcp.save_state_dict  # dcp.save from torch 2.2
    load = getattr(dcp, "load", None) or dcp.load_state_dict
    # no copy-ahead: its CUDA streams would be used where torch.cuda says it has a GPU
    writer = dcp.FileSystemWriter(folder, per_thread_copy_ahead=0)
    save({"rng": rng.capture()}, storage_writer=writer)
    continuation = draws()
    loaded = {"rng": rng.capture()}  # the template DCP loads into
    load(loaded, storage_reader=dcp.FileSystemReader(folder))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", rng.RNGStateWarning)
        report = rng.restore(loaded["rng"])
    return {"exact": report.exact, "draws": draws(), "continuation": continuation}
