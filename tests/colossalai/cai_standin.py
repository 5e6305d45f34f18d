"""CPU stand-ins that let real ColossalAI ZeRO run on a CPU-only machine over gloo.

Stand-ins for *missing hardware* only: the optimizer, its sharding, its
bookkeeping and its collectives are ColossalAI's own, over a real gloo group.
What is replaced, and why:

- ``colossalai.accelerator`` (0.3.5+): ``LowLevelZeroOptimizer._sanity_checks``
  asserts the accelerator is named "cuda" or "npu". ``CpuAsCudaAccelerator`` is
  ColossalAI's own ``CpuAccelerator`` reporting the name "cuda", with no-op
  streams/events/synchronize and ``device_count() == 1`` (the fp16 mixin asks).
- 0.3.2-0.3.4 have no accelerator module; their ``colossalai.utils.device``
  helpers call ``torch.cuda`` directly. There the stand-in makes
  ``torch.cuda.is_available()`` true, gives ``torch.cuda`` no-op streams, maps
  ``torch.cuda.FloatTensor`` to CPU and runs a ``TorchFunctionMode`` that turns
  ``device="cuda"`` / ``.cuda()`` into CPU (``step()`` hard-codes them).
- ``Tensor.record_stream`` accepts the stand-in stream (ZeRO calls it when
  ``overlap_communication`` is on, the plugin's default).
- gloo implements neither ``reduce_scatter`` nor (before torch 2.6)
  ``all_gather_into_tensor``; ZeRO-2 needs the first. On gloo groups they are
  emulated with ``all_reduce`` / ``all_gather`` (same results, more traffic).
- colossalai 0.3.x on Python 3.11: ``_DistSpec`` defines ``__eq__`` without
  ``__hash__``, so a dataclass using it as a default fails at import
  ("mutable default"). A meta-path finder gives it the identity hash right
  after its module body runs, before the dataclass is built.

Everything here is installed per test process by ``install()``; nothing leaks
into the library.
"""

from __future__ import annotations

import contextlib
from typing import Any

_installed = False


class NullStream:
    """A stream that is always done: CPU work is synchronous."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.device = "cpu"

    def wait_stream(self, stream: Any) -> None:
        return None

    def wait_event(self, event: Any) -> None:
        return None

    def record_event(self, event: Any = None) -> NullEvent:
        return NullEvent()

    def synchronize(self) -> None:
        return None

    def query(self) -> bool:
        return True


class NullEvent:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def record(self, stream: Any = None) -> None:
        return None

    def wait(self, stream: Any = None) -> None:
        return None

    def synchronize(self) -> None:
        return None

    def query(self) -> bool:
        return True

    def elapsed_time(self, other: Any) -> float:
        return 0.0


class DoneWork:
    """What an ``async_op=True`` collective returns when the emulation already finished."""

    def wait(self, *args: Any, **kwargs: Any) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True


class _AfterExec:
    """A meta-path finder that calls ``fix(module)`` right after ``module``'s own body ran.

    compatshim's ``when_imported`` waits until the parent packages have finished
    too (a hook must not meet a half-built framework); this fix has to land
    *before* the rest of ``colossalai`` builds a dataclass with ``_DistSpec``.
    """

    def __init__(self, names: tuple[str, ...], fix: Any) -> None:
        self.names = names
        self.fix = fix

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in self.names:
            return None
        import importlib.machinery

        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        run_body = spec.loader.exec_module  # this spec's own loader object

        def exec_module(module: Any) -> None:
            run_body(module)
            self.fix(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def hook_distspec_hash() -> None:
    """Give ``_DistSpec`` an identity hash as soon as its module is imported (0.3.x, py3.11)."""
    import sys

    def fix(module: Any) -> None:
        cls = getattr(module, "_DistSpec", None)
        if cls is not None and cls.__hash__ is None:
            cls.__hash__ = object.__hash__

    # the module moved to colossalai.legacy in 0.3.x; hook both spellings
    names = ("colossalai.tensor.distspec", "colossalai.legacy.tensor.distspec")
    for name in names:
        if name in sys.modules:
            fix(sys.modules[name])
    sys.meta_path.insert(0, _AfterExec(names, fix))


def _is_gloo(group: Any) -> bool:
    import torch.distributed as dist

    return str(dist.get_backend(group)) == "gloo"


def emulate_gloo_collectives() -> None:
    """reduce_scatter / reduce_scatter_tensor / all_gather_into_tensor on gloo groups."""
    import torch
    import torch.distributed as dist

    real_rs = dist.reduce_scatter
    real_rst = dist.reduce_scatter_tensor
    real_agt = dist.all_gather_into_tensor

    def reduce_scatter(output, input_list, op=dist.ReduceOp.SUM, group=None, async_op=False):  # type: ignore[no-untyped-def]
        if not _is_gloo(group):
            return real_rs(output, input_list, op=op, group=group, async_op=async_op)
        flat = torch.cat([t.reshape(-1) for t in input_list])
        dist.all_reduce(flat, op=op, group=group)
        rank = dist.get_rank(group)
        output.copy_(flat.split(input_list[0].numel())[rank].view_as(output))
        return DoneWork() if async_op else None

    def reduce_scatter_tensor(output, input, op=dist.ReduceOp.SUM, group=None, async_op=False):  # type: ignore[no-untyped-def]
        if not _is_gloo(group):
            return real_rst(output, input, op=op, group=group, async_op=async_op)
        flat = input.reshape(-1).clone()
        dist.all_reduce(flat, op=op, group=group)
        rank = dist.get_rank(group)
        output.copy_(flat.split(output.numel())[rank].view_as(output))
        return DoneWork() if async_op else None

    def all_gather_into_tensor(output, input, group=None, async_op=False):  # type: ignore[no-untyped-def]
        if not _is_gloo(group):
            return real_agt(output, input, group=group, async_op=async_op)
        size = dist.get_world_size(group)
        parts = [torch.empty_like(input.reshape(-1)) for _ in range(size)]
        dist.all_gather(parts, input.reshape(-1).contiguous(), group=group)
        output.copy_(torch.cat(parts).view_as(output))
        return DoneWork() if async_op else None

    dist.reduce_scatter = reduce_scatter
    dist.reduce_scatter_tensor = reduce_scatter_tensor
    dist.all_gather_into_tensor = all_gather_into_tensor
    # older releases reach these through the c10d module too
    import torch.distributed.distributed_c10d as c10d

    c10d.reduce_scatter = reduce_scatter
    c10d.reduce_scatter_tensor = reduce_scatter_tensor
    c10d.all_gather_into_tensor = all_gather_into_tensor


def accept_null_stream_in_record_stream() -> None:
    import torch

    real = torch.Tensor.record_stream

    def record_stream(self: Any, stream: Any) -> None:
        if isinstance(stream, NullStream):
            return None
        return real(self, stream)  # type: ignore[no-any-return]

    torch.Tensor.record_stream = record_stream  # type: ignore[method-assign]


def set_cpu_accelerator() -> bool:
    """0.3.5+: install ``CpuAsCudaAccelerator``. False when the release has no accelerator."""
    try:
        from colossalai.accelerator import CpuAccelerator, set_accelerator
    except ImportError:
        return False

    class CpuAsCudaAccelerator(CpuAccelerator):  # type: ignore[misc]
        """ColossalAI's CPU accelerator under the name ZeRO's sanity check requires."""

        def __init__(self) -> None:
            super().__init__()
            self._name = "cuda"

        def device_count(self) -> int:
            return 1

        def current_device(self) -> int:
            return 0

        def set_device(self, device: Any = None) -> None:
            return None

        def synchronize(self, device: Any = None) -> None:
            return None

        def Stream(self, *args: Any, **kwargs: Any) -> NullStream:
            return NullStream()

        def Event(self, *args: Any, **kwargs: Any) -> NullEvent:
            return NullEvent()

        def current_stream(self, device: Any = None) -> NullStream:
            return NullStream()

        def default_stream(self, device: Any = None) -> NullStream:
            return NullStream()

        def set_stream(self, stream: Any) -> None:
            return None

        def stream(self, stream: Any) -> contextlib.nullcontext[None]:
            return contextlib.nullcontext()

        def empty_cache(self) -> None:
            return None

        def manual_seed(self, seed: int) -> None:
            import torch

            torch.manual_seed(seed)

        def manual_seed_all(self, seed: int) -> None:
            self.manual_seed(seed)

    set_accelerator(CpuAsCudaAccelerator())
    return True


def install() -> None:
    """Install every stand-in this process needs (idempotent). Call before building ZeRO."""
    global _installed
    if _installed:
        return
    _installed = True
    hook_distspec_hash()
    accept_null_stream_in_record_stream()
    emulate_gloo_collectives()
    if not set_cpu_accelerator():
        from tests.colossalai import cai_standin_old

        cai_standin_old.install()
