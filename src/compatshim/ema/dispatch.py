"""When the EMA foreach may skip torch's autograd kernel: only where that kernel does nothing.

The plan passes the Parameters themselves (``guard``: a ``p.data = ...`` swap
is then read live), and an in-place foreach on tensors that require grad pays
torch's autograd kernel per tensor even under ``no_grad`` (about 0.2x of the
bare call on ``.data`` at 120 tiny tensors on torch 2.15). Under ``no_grad``
that kernel records nothing and checks nothing (its in-place checks act only
with grad mode on), then redispatches under the same guard used here, so
everything below it (``ADInplaceOrView``, which bumps every ``_version``,
dispatch modes, the kernels) sees the same state. What is left is forward AD:
a tensor with a tangent gets its tangent stepped too. So the foreach runs
under ``_AutoDispatchBelowAutograd`` only when no tangent can exist and no
Python code can run inside the guard:

- no forward-AD level is entered (``forward_ad._current_level``, kept by
  ``enter_dual_level``/``exit_dual_level``, which ``fwAD.dual_level`` and
  ``torch.func.jvp`` use; tangents die with their level; a level entered
  through ``torch._C`` directly is not seen);
- no functorch transform is active (``jvp``, ``grad``, ``vmap`` layers);
- no torch-function mode is active, and every tensor of the plan was a plain
  ``Tensor`` or ``Parameter`` when it was paired (no ``__torch_function__``;
  a later ``__class__`` change, e.g. by ``swap_tensors``, is not seen).

Otherwise the normal path runs: the same result at the autograd kernel's cost.
A torch without one of these entry points never takes the short path.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


class BelowAutograd:
    """The guard and the check that it changes nothing observable (see the module)."""

    def __init__(self, torch: Any) -> None:
        self.guard: Any = None  # the context manager type, when this torch has it
        c = torch._C
        names = (
            "_AutoDispatchBelowAutograd",
            "_are_functorch_transforms_active",
            "_is_torch_function_mode_enabled",
        )
        if not all(hasattr(c, name) for name in names):
            return
        try:
            from torch.autograd import forward_ad
        except ImportError:  # pragma: no cover - every torch compatshim supports has it
            return
        if not isinstance(getattr(forward_ad, "_current_level", None), int):
            return
        self._forward_ad = forward_ad
        self._functorch = c._are_functorch_transforms_active
        self._mode = c._is_torch_function_mode_enabled
        self._plain = (torch.Tensor, torch.nn.Parameter)
        self.guard = c._AutoDispatchBelowAutograd

    def plain(self, tensors: Iterable[Any]) -> bool:
        """True when none of ``tensors`` can run Python code from the dispatcher's front."""
        return self.guard is not None and all(type(t) in self._plain for t in tensors)

    def allowed(self) -> bool:
        """True when skipping the autograd kernel is exact now (call under ``no_grad``)."""
        return self._forward_ad._current_level < 0 and not self._functorch() and not self._mode()
