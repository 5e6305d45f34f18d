"""The generators of this process, read and written one at a time by label.

Labels are ``python``, ``numpy``, ``torch_cpu``, ``cuda:N``, ``xpu:N`` and
``mps``. Keeping every framework call here lets ``restore`` snapshot exactly
what it is about to overwrite, and put it back if a later write fails.
"""

from __future__ import annotations

import importlib.util
import random
from typing import Any, Callable

Getter = Callable[[], Any]
Setter = Callable[[Any], None]


def numpy_available() -> bool:
    return importlib.util.find_spec("numpy") is not None


def cuda_count() -> int:
    import torch

    return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0


def xpu_count() -> int:
    import torch

    xpu = getattr(torch, "xpu", None)
    return int(xpu.device_count()) if xpu is not None and xpu.is_available() else 0


def mps_available() -> bool:
    import torch

    backend = getattr(torch.backends, "mps", None)
    return bool(backend is not None and backend.is_available())


def accessors(label: str) -> tuple[Getter, Setter]:
    """(get, set) for the generator named by ``label``."""
    import torch

    if label == "python":
        return random.getstate, random.setstate
    if label == "numpy":
        import numpy as np

        return np.random.get_state, np.random.set_state
    if label == "torch_cpu":
        return torch.get_rng_state, torch.set_rng_state
    if label == "mps":
        return torch.mps.get_rng_state, torch.mps.set_rng_state
    kind, _, index = label.partition(":")
    module = {"cuda": torch.cuda, "xpu": getattr(torch, "xpu", None)}.get(kind)
    if module is None or not index.isdigit():
        raise KeyError(label)
    device = int(index)
    return (
        lambda: module.get_rng_state(device),
        lambda value: module.set_rng_state(value, device),
    )
