"""Patch ``torch-gloo-reduce-scatter-op``: gloo's ``reduce_scatter_tensor`` honours its ReduceOp.

What breaks
    On a gloo group, ``torch.distributed.reduce_scatter_tensor`` (and the
    deprecated ``_reduce_scatter_base``, which calls it) ignores ``op`` and
    always sums (PyTorch issue 162338, "Incorrect AVG reduction for GLOO").
    FSDP2 (``fully_shard``, on CPU/gloo from torch 2.7) reduce-scatters its
    fp32/bf16 gradients with ``ReduceOp.AVG``, so every FSDP2 CPU run trains
    on N times the mean gradient; nothing fails, the numbers are wrong.

Which versions
    torch 2.2 (gloo gains ``reduce_scatter_tensor``) up to 2.8; 2.9.0
    averages. Declared ``>=2.2,<2.9``; tested on 2.8 (defect present) and
    2.15 (out of range, left alone).

How it is detected
    By the declared range, plus a structural check: ``torch.distributed`` has
    gloo and a ``reduce_scatter_tensor`` that is not this patch's wrapper. A
    live probe cannot run where patches are decided: making even a private
    gloo group prints gloo's "connected to 1 peer ranks" lines on **stdout**,
    unconditionally, which would corrupt the stdout of any program importing
    ``torch.distributed`` (the doctor's JSON, for one). The range is checked
    live instead by the tests, on each tested release, with
    :func:`loopback_sums` (a private two-rank gloo group in two threads of this
    process, an in-memory ``HashStore``, loopback sockets; nothing registered
    with torch.distributed). Guessing costs nothing in correctness: SUM then a
    divide by the group size is the mean whether or not gloo honours AVG, so
    the fix never gives a wrong tensor even on a release that averages.

The fix
    ``reduce_scatter_tensor`` in ``torch.distributed`` (the name FSDP2 calls)
    and ``torch.distributed.distributed_c10d`` (the name ``_reduce_scatter_base``
    calls) is wrapped. On a group whose backend for the tensors' device is
    gloo, and only then:

    - ``SUM``: torch's call, unchanged.
    - ``AVG``: torch's call with ``SUM``, then the output is divided in place
      by the group size (floating point only; an integer AVG is an error).
      With ``async_op=True`` the returned work divides when ``wait()`` is called.
    - ``PRODUCT``, ``MIN``, ``MAX``, ``BAND``, ``BOR``, ``BXOR``: an
      ``all_reduce`` with that op on a copy of the input, then this rank's
      chunk is copied to the output (N times the output's memory).
    - anything else (``PREMUL_SUM``): :class:`GlooReduceScatterOpError`;
      gloo would silently sum it.

    Never a wrong tensor. Not covered: ``reduce_scatter_tensor_coalesced`` on
    the group object, ``torch.distributed._functional_collectives`` and
    calling ``ProcessGroupGloo._reduce_scatter_base`` directly.

The revert
    Both module attributes get torch's function back (Patcher), unless a
    library wrapped one after compatshim: that library's wrapper stays, and
    compatshim's under it passes every call on.
"""

from __future__ import annotations

import threading

from .._engine.patching import in_force, mark, ours, wrapping

TYPE_CHECKING = False  # no ``typing`` import: this module loads inside its target's import
if TYPE_CHECKING:
    from types import ModuleType
    from typing import Any, Callable

    from .._engine.patching import Patcher

_NAME = "torch-gloo-reduce-scatter-op"
_ELEMENTWISE = ("PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR")
_lock = threading.Lock()


class GlooReduceScatterOpError(ValueError):
    """A reduce-scatter op that gloo would silently replace by SUM, and compatshim cannot redo."""


class _FinishingWork:
    """torch's work, whose ``wait()`` also finishes the result (divide, or copy a chunk)."""

    def __init__(self, work: Any, finish: Callable[[], None]) -> None:
        self._work = work
        self._finish: Callable[[], None] | None = finish

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        done = self._work.wait(*args, **kwargs)
        with _lock:
            finish, self._finish = self._finish, None
        if finish is not None:
            finish()
        return done

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)


def _op_name(dist: ModuleType, op: Any) -> str:
    """``"SUM"``, ``"AVG"``, ...: the op's type, for a ``RedOpType`` or a ``ReduceOp``."""
    for name in ("SUM", "AVG", *_ELEMENTWISE):
        if op == getattr(dist.ReduceOp, name, None):
            return name
    return str(op)


def _on_gloo(dist: ModuleType, group: Any, device: Any) -> bool:
    """Whether ``group`` runs collectives on ``device`` with gloo (False when it cannot tell)."""
    if group is not None and not isinstance(group, dist.ProcessGroup):
        return False  # a group name or a device mesh: left to torch
    try:
        pg = group if group is not None else dist.distributed_c10d._get_default_group()
        return isinstance(pg._get_backend(device), dist.ProcessGroupGloo)
    except (AttributeError, RuntimeError, ValueError):
        return bool(dist.get_backend(group) == "gloo")


def _average(output: Any, size: int, work: Any) -> Any:
    """Divide ``output`` by ``size`` now (work None) or when ``work`` is waited on."""

    def finish() -> None:
        output.div_(size)

    if work is None:
        finish()
        return None
    return _FinishingWork(work, finish)


def _check_average(output: Any) -> None:
    if not (output.is_floating_point() or output.is_complex()):
        raise GlooReduceScatterOpError(
            f"compatshim {_NAME}: reduce_scatter_tensor with ReduceOp.AVG on a gloo group needs "
            f"a floating-point output (got {output.dtype}); gloo would sum instead of averaging"
        )


def _wrap(real: Callable[..., Any], dist: ModuleType, patcher: Patcher) -> Callable[..., Any]:
    def reduce_scatter_tensor(
        output: Any, input: Any, op: Any = None, group: Any = None, async_op: bool = False
    ) -> Any:
        if op is None:
            op = dist.ReduceOp.SUM
        name = _op_name(dist, op)
        if name == "SUM" or not patcher.live or not _on_gloo(dist, group, input.device):
            return real(output, input, op=op, group=group, async_op=async_op)
        size = dist.get_world_size(group)
        if name == "AVG":
            _check_average(output)
            work = real(output, input, op=dist.ReduceOp.SUM, group=group, async_op=async_op)
            return _average(output, size, work)
        if name in _ELEMENTWISE:
            full = input.clone()
            work = dist.all_reduce(full, op=op, group=group, async_op=async_op)
            rank = dist.get_rank(group)

            def finish() -> None:
                output.copy_(full.reshape(size, -1)[rank].reshape(output.shape))

            if work is None:
                finish()
                return None
            return _FinishingWork(work, finish)
        raise GlooReduceScatterOpError(
            f"compatshim {_NAME}: gloo's reduce_scatter_tensor would sum instead of applying "
            f"{op!r}; compatshim redoes SUM, AVG, {', '.join(_ELEMENTWISE)} only"
        )

    reduce_scatter_tensor.__doc__ = real.__doc__
    return ours(mark(reduce_scatter_tensor, __wrapped__=real), real, patcher)


def loopback_sums(dist: ModuleType, *, through_fix: bool = False) -> bool:
    """Whether gloo's reduce-scatter sums when asked to average, on a private 2-rank group.

    ``through_fix``: reduce with SUM and average as the fix does, instead of asking for
    AVG. Prints gloo's connection lines on stdout: for tests, never at import.
    """
    return _verdict(_loopback_average(dist, through_fix))


def _loopback_average(dist: ModuleType, through_fix: bool) -> list[float]:
    """Each rank's AVG reduce-scatter of ``[r + 1, r + 1]`` on a private 2-rank gloo group."""
    from datetime import timedelta

    import torch

    store = dist.HashStore()
    got: list[Any] = [None, None]

    def rank(r: int) -> None:
        try:
            options = dist.ProcessGroupGloo._Options()
            options._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
            options._timeout = timedelta(seconds=30)
            pg = dist.ProcessGroupGloo(dist.PrefixStore(_NAME, store), r, 2, options)
            out = torch.zeros(1)
            settings = dist.ReduceScatterOptions()
            settings.reduceOp = dist.ReduceOp.SUM if through_fix else dist.ReduceOp.AVG
            pg._reduce_scatter_base(out, torch.full((2,), float(r + 1)), settings).wait()
            if through_fix:
                _average(out, 2, None)
            got[r] = float(out)
        except Exception as exc:  # reported by the caller
            got[r] = exc

    threads = [threading.Thread(target=rank, args=(r,), daemon=True) for r in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    for value in got:
        if not isinstance(value, float):
            raise RuntimeError(f"compatshim {_NAME}: the loopback gloo probe failed: {value!r}")
    return [float(value) for value in got]


def _verdict(values: list[float]) -> bool:
    """True when the ranks got the sum (3.0), False for the mean (1.5); else an error."""
    if values == [1.5, 1.5]:
        return False
    if values == [3.0, 3.0]:
        return True
    raise RuntimeError(f"compatshim {_NAME}: AVG reduce-scatter of 1 and 2 gave {values}")


def probe(module: ModuleType) -> bool:
    """True while gloo's ``reduce_scatter_tensor`` is torch's own (the range says it sums)."""
    if not module.is_available() or not hasattr(module, "ProcessGroupGloo"):
        return False
    return not (
        in_force(vars(module).get("reduce_scatter_tensor"))
        and in_force(vars(module.distributed_c10d).get("reduce_scatter_tensor"))
    )


def apply(module: ModuleType, patcher: Patcher) -> None:
    c10d = module.distributed_c10d
    for owner in (module, c10d):
        original = wrapping(vars(owner)["reduce_scatter_tensor"])
        if original is not None:  # None: ours, in force
            patcher.setattr(owner, "reduce_scatter_tensor", _wrap(original, module, patcher))
