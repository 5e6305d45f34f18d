"""Which dtypes this torch's ``torch.save`` takes: 2.3 and 2.4 (and 2.5 for ``uint32``) have
``torch.uint16``/``uint32`` but refuse to save them ("dtype torch.uint32 is not recognized")."""

from __future__ import annotations

import io


def saves(name: str) -> bool:
    """Whether ``torch.<name>`` exists and ``torch.save`` writes a tensor of it."""
    import torch

    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        return False
    try:
        torch.save(torch.zeros(1, dtype=dtype), io.BytesIO())
    except (KeyError, RuntimeError, TypeError):
        return False
    return True
