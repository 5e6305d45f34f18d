"""CPU stand-in for colossalai 0.3.2-0.3.4, which predate ``colossalai.accelerator``.

These releases call ``torch.cuda`` directly: ``LowLevelZeroOptimizer`` asserts
``torch.cuda.is_available()``, builds ``torch.cuda.Stream()``, uses
``torch.cuda.FloatTensor`` for norms, and ``step()`` hard-codes
``device="cuda"`` and ``.cuda()``. On a CPU-only machine this module makes
``torch.cuda`` answer like one idle device with no-op streams, and a
``TorchFunctionMode`` (entered for the rest of the process) rewrites every
"cuda" device argument and ``.cuda()`` call to CPU. Only the rank processes of
the colossalai tests install it, after importing colossalai (whose import-time
kernel probes must see the truth); the optimizer code itself runs unchanged.
"""

from __future__ import annotations

import contextlib
from typing import Any

from tests.colossalai.cai_standin import NullEvent, NullStream

_mode: Any = None


def _cpu(device: Any) -> Any:
    import torch

    if isinstance(device, torch.device) and device.type == "cuda":
        return torch.device("cpu")
    if isinstance(device, str) and device.startswith("cuda"):
        return "cpu"
    if isinstance(device, int):  # .to(0) / .cuda(0)
        return "cpu"
    return device


def _cuda_to_cpu_mode() -> Any:
    import torch
    from torch.overrides import TorchFunctionMode

    class CudaToCpu(TorchFunctionMode):  # type: ignore[misc]
        """Turns device="cuda" and .cuda() into CPU; everything else passes through."""

        def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            kwargs = dict(kwargs or {})
            if func is torch.Tensor.cuda:
                return args[0]
            if "device" in kwargs:
                kwargs["device"] = _cpu(kwargs["device"])
            if func is torch.Tensor.to and len(args) > 1:
                args = (args[0], _cpu(args[1]), *args[2:])
            return func(*args, **kwargs)

    return CudaToCpu()


def _float_tensor(data: Any) -> Any:
    import torch

    return torch.tensor(data, dtype=torch.float32)


def install() -> None:
    """Pretend one idle CUDA device whose tensors live on the CPU."""
    global _mode
    # import what the tests use while torch.cuda still tells the truth: at import time
    # these releases probe CUDA kernels and would try to initialise a driver
    import colossalai.booster.plugin
    import colossalai.zero  # noqa: F401
    import torch
    import torch._dynamo  # registers the real torch.cuda Stream/Event classes before the swap

    cuda = torch.cuda
    cuda.is_available = lambda: True
    cuda.device_count = lambda: 1
    cuda.current_device = lambda: 0
    cuda.set_device = lambda device=None: None
    cuda.synchronize = lambda device=None: None
    cuda.is_current_stream_capturing = lambda: False  # torch.optim asks when CUDA "exists"
    cuda.empty_cache = lambda: None
    cuda.Stream = NullStream  # type: ignore[assignment, misc]
    cuda.Event = NullEvent  # type: ignore[assignment, misc]
    cuda.current_stream = lambda device=None: NullStream()
    cuda.default_stream = lambda device=None: NullStream()
    cuda.stream = lambda stream=None: contextlib.nullcontext()
    cuda.FloatTensor = _float_tensor  # type: ignore[assignment]
    cuda.manual_seed = lambda seed: None  # torch.manual_seed calls these: no recursion
    cuda.manual_seed_all = lambda seed: None
    _mode = _cuda_to_cpu_mode()
    _mode.__enter__()
