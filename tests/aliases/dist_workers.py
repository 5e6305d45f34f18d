"""Rank functions for the alias collective tests (module level, importable by spawned ranks)."""

from __future__ import annotations

from typing import Any


def through_aliases(rank: int, world_size: int) -> dict[str, Any]:
    """Each renamed collective through the name compatshim provides and through the old one."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    import compatshim

    compatshim.install()
    out: dict[str, Any] = {}
    x = torch.arange(3, dtype=torch.float32) + 10 * rank
    big = torch.arange(world_size * 2, dtype=torch.float32) * (rank + 1)

    def outcome(collective: Any, output: Any, given: Any) -> Any:
        """The output, or the error (torch 2.1's gloo has neither old nor new collective)."""
        try:
            collective(output, given.clone())
        except RuntimeError as exc:
            return f"raises RuntimeError: {exc}"
        return output.tolist()

    for new, old, size, given in (
        ("all_gather_single", "all_gather_into_tensor", world_size * 3, x),
        ("reduce_scatter_single", "reduce_scatter_tensor", 2, big),
    ):
        out[new] = (
            outcome(getattr(dist, new), torch.empty(size), given),
            outcome(getattr(dist, old), torch.empty(size), given),
        )
    gathered = torch.empty(world_size, 3) if rank == 0 else None
    listed = [torch.empty(3) for _ in range(world_size)] if rank == 0 else None
    try:
        dist.gather_single(x, gathered, dst=0)
    except RuntimeError as exc:  # torch 2.14+'s own gather_single: gloo does not implement it
        out["gather_single"] = f"unsupported: {exc}"
    else:
        dist.gather(x, listed, dst=0)
        out["gather_single"] = (
            gathered.flatten().tolist() if gathered is not None else None,
            torch.cat(listed).tolist() if listed is not None else None,
        )
    if hasattr(dist, "set_timeout"):  # torch 2.1 has neither set_timeout nor _set_pg_timeout
        dist.set_timeout(timedelta(seconds=90))
    dist.barrier()
    out["used"] = next(r.used for r in compatshim.status() if r.name == "removed-names")
    return out


class NotAllowed:
    """A class torch.load(weights_only=True) refuses."""


def object_collectives(rank: int, world_size: int, disagree: bool) -> dict[str, Any]:
    """weights_only= on the object collectives, through compatshim where torch lacks it."""
    import torch
    import torch.distributed as dist

    import compatshim

    compatshim.install()
    out: dict[str, Any] = {}
    obj = {"rank": rank, "t": torch.arange(3) * rank}
    safe: list[Any] = [None] * world_size
    plain: list[Any] = [None] * world_size
    dist.all_gather_object(safe, obj, weights_only=True)
    dist.all_gather_object(plain, obj)
    out["all_gather"] = [
        (a["rank"], a["t"].tolist(), b["rank"], b["t"].tolist()) for a, b in zip(safe, plain)
    ]
    listed = [{"x": torch.ones(2)}, "text"] if rank == 0 else [None, None]
    dist.broadcast_object_list(listed, src=0, weights_only=True)
    out["broadcast"] = [listed[0]["x"].tolist(), listed[1]]
    refused: list[Any] = [NotAllowed() if rank == 0 else None]
    try:
        dist.broadcast_object_list(refused, src=0, weights_only=True)
        out["refused"] = rank == 0
    except Exception as exc:
        out["refused"] = type(exc).__name__
    if disagree:
        mine = rank != 1
        gathered: list[Any] = [None] * world_size
        try:
            dist.all_gather_object(gathered, rank, weights_only=mine)
            out["disagree"] = "no error"
        except Exception as exc:  # torch >= 2.14: its own error; compatshim: a RuntimeError
            out["disagree"] = f"{type(exc).__name__}: {exc}"
    out["used"] = next(r.used for r in compatshim.status() if r.name == "removed-names")
    return out
