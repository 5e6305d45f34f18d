"""FSDP2 (``fully_shard``) where this torch has it, and whether it runs on CPU ranks."""

from __future__ import annotations

from typing import Any

import torch


def fully_shard_api() -> Any:
    """``fully_shard`` where the release has it (public in 2.6+, _composable in 2.4-2.5)."""
    try:
        from torch.distributed.fsdp import fully_shard  # type: ignore[attr-defined]
    except ImportError:
        try:
            from torch.distributed._composable.fsdp import fully_shard
        except ImportError:
            return None
    return fully_shard


def fsdp2_cpu_problem() -> str | None:
    """Why FSDP2 cannot run on CPU ranks here, or None.

    torch 2.4's ``fully_shard`` makes ``torch.cuda.Stream`` objects at its first
    forward (no CPU path); later releases take streams from the device handle, but
    2.5-2.6's ``torch.cpu.Stream`` has no ``record_event``, which they call.
    """
    import importlib
    import inspect

    if fully_shard_api() is None:
        return f"torch {torch.__version__} has no fully_shard (FSDP2; 2.4+)"
    for name in (
        "torch.distributed.fsdp._fully_shard._fsdp_param_group",
        "torch.distributed._composable.fsdp._fsdp_param_group",
    ):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if "torch.cuda.Stream(" in inspect.getsource(module):
            return (
                f"torch {torch.__version__}'s fully_shard creates torch.cuda.Stream at its "
                "first forward: it needs CUDA, no CPU ranks"
            )
        collectives = importlib.import_module(
            name.replace("_fsdp_param_group", "_fsdp_collectives")
        )
        if ".record_event(" in inspect.getsource(collectives) and not hasattr(
            torch.cpu.Stream, "record_event"
        ):
            return (
                f"torch {torch.__version__}'s fully_shard calls Stream.record_event, which "
                "torch.cpu.Stream lacks: it needs CUDA, no CPU ranks"
            )
        return None
    return f"torch {torch.__version__}: fully_shard's param-group module not found"
