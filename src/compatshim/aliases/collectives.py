"""Bounded adapters for ``torch.distributed`` names that older releases spell differently.

Imported only by the ``removed-names`` alias of ``torch.distributed`` (torch is
already imported then); see :mod:`compatshim.aliases.table` for the releases.
"""

from __future__ import annotations

from typing import Any

__all__ = ["gather_single"]


def gather_single(
    tensor: Any,
    gather_tensor: Any = None,
    dst: int | None = None,
    group: Any = None,
    async_op: bool = False,
    group_dst: int | None = None,
) -> Any:
    """torch 2.14's ``gather_single`` on torch < 2.14: ``gather`` into views of one tensor.

    Same arguments and checks as torch 2.14 (``gather_tensor`` only on the
    destination, contiguous, ``world_size * tensor.numel()`` elements, either
    flat or stacked); the ranks' contributions land in ``gather_tensor`` in
    rank order. It runs ``torch.distributed.gather`` with a list of views of
    ``gather_tensor``, so the data moves as ``gather`` moves it.
    """
    import torch.distributed as dist

    if dst is not None and group_dst is not None:
        raise ValueError("Cannot specify both dst and group_dst")
    kwargs: dict[str, Any] = {"group": group, "async_op": async_op}
    if group_dst is not None:
        kwargs["group_dst"] = group_dst
        destination = group_dst
    else:
        kwargs["dst"] = 0 if dst is None else dst
        destination = kwargs["dst"] if group is None else dist.get_group_rank(group, kwargs["dst"])
    gather_list = None
    if dist.get_rank(group) == destination:
        if gather_tensor is None:
            raise ValueError("gather_tensor must be specified on the destination rank")
        if not gather_tensor.is_contiguous():
            raise ValueError("gather_tensor must be contiguous")
        world = dist.get_world_size(group)
        if gather_tensor.numel() != world * tensor.numel():
            raise ValueError(
                f"gather_tensor has {gather_tensor.numel()} elements; expected "
                f"world_size * tensor.numel() = {world * tensor.numel()}"
            )
        if gather_tensor.dtype != tensor.dtype:
            raise ValueError(
                f"gather_tensor dtype {gather_tensor.dtype} differs from tensor dtype "
                f"{tensor.dtype}"
            )
        gather_list = list(gather_tensor.view(world, *tensor.shape).unbind(0))
    return dist.gather(tensor, gather_list, **kwargs)
