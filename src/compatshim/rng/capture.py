"""``capture()``: every generator of this process plus what it was captured on."""

from __future__ import annotations

import platform
import random
import threading
from typing import Any

from .derive import capture_digest
from .devices import cuda_count, mps_available, numpy_available, xpu_count
from .state import NumpyMT, Parts, to_state

# One lock for capture and restore: both read or write process-global generators.
GENERATOR_LOCK = threading.RLock()


def distributed_position() -> tuple[int | None, int | None]:
    """(rank, world size) when torch.distributed is initialised, else (None, None)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return int(dist.get_rank()), int(dist.get_world_size())
    return None, None


def capture_parts() -> Parts:
    import torch

    with GENERATOR_LOCK:
        version, internal, gauss = random.getstate()
        parts = Parts(python=(version, tuple(internal), gauss))
        numpy_version = other = None
        if numpy_available():
            import numpy as np

            numpy_version = np.__version__
            # a dict whatever the bit generator: the legacy tuple is MT19937's alone (numpy
            # 1.25+ set_bit_generator), where other generators are not captured (skipped)
            found = np.random.get_state(legacy=False)
            if found["bit_generator"] == "MT19937":
                key, pos = found["state"]["key"], found["state"]["pos"]
                parts.numpy = NumpyMT(
                    tuple(int(k) for k in key),
                    int(pos),
                    int(found["has_gauss"]),
                    float(found["gauss"]),
                )
            else:
                other = str(found["bit_generator"])
        parts.torch_cpu = torch.get_rng_state()
        if cuda_count():
            parts.cuda = [s.cpu() for s in torch.cuda.get_rng_state_all()]
        if xpu_count():
            parts.xpu = [s.cpu() for s in torch.xpu.get_rng_state_all()]
        if mps_available():
            parts.mps = torch.mps.get_rng_state().cpu()
    rank, world_size = distributed_position()
    parts.meta = {
        "writer": "compatshim",
        "torch": str(torch.__version__),
        "numpy": numpy_version,
        "python": platform.python_version(),
        "cuda_device_count": len(parts.cuda),
        "xpu_device_count": len(parts.xpu),
        "rank": rank,
        "world_size": world_size,
    }
    if other is not None:  # restore names it among the skipped
        parts.meta["numpy_generator"] = other
    parts.meta["digest"] = capture_digest(parts)
    return parts


def capture() -> dict[str, Any]:
    """Snapshot Python ``random``, numpy's global state, torch CPU, CUDA, XPU and MPS generators.

    The result is a plain dict of tensors, ints and strings: it can be put in
    any checkpoint and loaded with ``torch.load(weights_only=True)`` on every
    torch 2.x, under numpy 1.x or 2.x.
    """
    return to_state(capture_parts())
