"""A hardware stand-in: this CPU machine answers ``torch.cuda``'s questions as a GPU machine does.

``COMPATSHIM_TEST_STANDIN_CUDA=N`` (set by hand: ``N`` GPUs) makes, in the test process
(``tests/conftest.py``) and in every child interpreter the tests start (the ``sitecustomize``
beside this file is put on ``PYTHONPATH``), ``torch.cuda.is_available()`` true,
``device_count()`` N (fewer where ``CUDA_VISIBLE_DEVICES`` hides some, as CUDA does), and
CUDA generator state real torch-layout states (16 bytes: Philox seed,
offset) held per device: ``get_rng_state``/``set_rng_state`` (and ``_all``), ``manual_seed``
(and ``_all``), ``initial_seed``. Nothing else: a tensor sent to ``"cuda"`` still fails, so
code that picks CUDA by accident (an ``accelerator="auto"``, a ``.cuda()``) fails loudly here
instead of passing, which is what a rehearsal of "as on a GPU machine" is for.

What it covers: every decision taken from the GPU count and the CUDA generator states
(``compatshim.rng`` capture, restore, files and reports; a framework that only asks whether
CUDA is there). What it does not: kernels, NCCL, memory, anything a device runs.
"""

from __future__ import annotations

import os
import struct
from typing import Any

VARIABLE = "COMPATSHIM_TEST_STANDIN_CUDA"
DEFAULT_SEED = 67280421310721  # torch's default CUDA seed


def count() -> int:
    """The number of stand-in GPUs asked for (0: the stand-in is off)."""
    value = os.environ.get(VARIABLE, "").strip()
    return int(value) if value.isdigit() else 0


def visible(devices: int) -> int:
    """How many of ``devices`` this process sees: ``CUDA_VISIBLE_DEVICES`` hides some, as CUDA."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is None:
        return devices
    return min(devices, len([d for d in listed.split(",") if d.strip() not in ("", "-1")]))


def install(devices: int) -> None:
    """Answer for ``devices`` GPUs in this process (torch imported here)."""
    import torch

    cuda: Any = torch.cuda
    devices = visible(devices)
    if getattr(cuda, "_compatshim_standin", None) == devices:
        return
    states = {d: _state(DEFAULT_SEED) for d in range(devices)}

    def index(device: Any = None) -> int:
        if device is None or device == "cuda":
            return 0
        if isinstance(device, torch.device):
            return device.index or 0
        if isinstance(device, str):
            return int(device.partition(":")[2] or 0)
        return int(device)

    def get_rng_state(device: Any = "cuda") -> torch.Tensor:
        return states[index(device)].clone()

    def set_rng_state(new_state: torch.Tensor, device: Any = "cuda") -> None:
        if new_state.dtype != torch.uint8 or new_state.numel() != 16:
            raise RuntimeError(f"RNG state must be 16 uint8 bytes, got {new_state.numel()}")
        states[index(device)] = new_state.detach().clone().cpu()

    def manual_seed(seed: int) -> None:
        states[0] = _state(int(seed))

    def manual_seed_all(seed: int) -> None:
        for device in states:
            states[device] = _state(int(seed))

    replacements = {
        "is_available": lambda: devices > 0,
        "device_count": lambda: devices,
        "get_rng_state": get_rng_state,
        "set_rng_state": set_rng_state,
        "get_rng_state_all": lambda: [states[d].clone() for d in sorted(states)],
        "set_rng_state_all": lambda values: [set_rng_state(v, d) for d, v in enumerate(values)],
        "manual_seed": manual_seed,
        "manual_seed_all": manual_seed_all,
        "initial_seed": lambda: struct.unpack("<Q", bytes(states[0][:8].tolist()))[0],
    }
    for name, function in replacements.items():
        setattr(cuda, name, function)
        if hasattr(cuda.random, name):
            setattr(cuda.random, name, function)
    cuda._compatshim_standin = devices


def _state(seed: int) -> Any:
    import torch

    return torch.tensor(list(struct.pack("<QQ", seed, 0)), dtype=torch.uint8)


def site_dir() -> str:
    """The folder whose ``sitecustomize`` installs the stand-in in child interpreters."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "cuda_standin_site")
