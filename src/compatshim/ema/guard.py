"""Is a cached EMA plan still valid? A proof that costs one C-level pass, not a walk.

A plan goes stale when a parameter is replaced, resized, frozen or unfrozen,
or the optimizer changes. Each has a cheap witness:

- replaced (``module.w = Parameter(...)``, ``register_parameter``, a new
  submodule): torch's global registration hooks bump one counter
  (``registration_epoch``); any registration anywhere rebuilds the plan;
- ``p.data = other``, ``.to()``, ``swap_tensors``: the plan holds the
  Parameter objects themselves, never ``.data`` aliases, so the update always
  reads the storage the param has now; a shape, dtype or device the EMA cannot
  take fails the foreach and the caller re-pairs (see ``update_ema``). Cached
  ``.data`` aliases would be no faster (``dispatch``) and could not be proven
  current without a walk: a swap keeps the version counter and runs no hook;
- frozen / unfrozen: ``requires_grad`` of every watched param, read by one
  ``map`` over a cached list and compared with the cached flags;
- optimizer: identity, and the identity and length of each group's param list;
- buffers (``buffers="average"`` / ``"copy"``): ``module.to()``, ``.cuda()``,
  ``.half()`` put a new tensor into ``module._buffers`` without any hook, so
  each paired buffer's slot is read and compared by identity with the tensor
  the plan holds (``buffers_current``: one C-level pass, on both models); a
  module that replaces a paired buffer every step re-pairs every step (torch's
  own modules update buffers in place). Buffer registrations are not hooked:
  modules that reassign a non-persistent cache in ``forward`` would re-pair
  every step for nothing.

The buffer pass stays one read per slot: no O(1) witness covers what it
catches. ``Module._apply`` (``.to()``, ``.half()``, ``.cuda()``) and direct
writes (``module._buffers[k] = t``, as ``accelerate``'s
``set_module_tensor_to_device`` and ``torch.func.functional_call`` do) run no
hook and change no counter; a registration hook would see only ``setattr``.
Reading per owning dict (``values()``, ``itemgetter``) or comparing ``id``
lists measured slower; comparing the lists with ``==`` would call a tensor's
``__eq__`` on the first replaced slot, and an equal one-element buffer would
pass. What it costs, at 24 BatchNorm layers and their EMA (144 slots) on the
shared 2-core EPYC: 5 us alone with warm caches (35 ns a slot); in bench_ema at
load 6, ``update_ema`` measured 1.20x-1.22x the bare foreach with it and
1.07x-1.08x with it stubbed out (four runs each). The ``requires_grad`` pass,
stubbed the same way at 120 parameters (three runs each): 1.12x-1.16x with it,
0.98x-1.00x without.

While ``torch.__future__.set_overwrite_module_params_on_conversion(True)`` is in
force, ``.to()`` puts new Parameter objects into ``module._parameters`` with no
hook: the plan is rebuilt on every call then (a flag read per call otherwise).

Not seen (documented): parameters removed or replaced by writing
``module._parameters`` directly (torch's hooks do not run; FSDP2 does this and
is handled by the slow check), a
``.data`` of another shape that broadcasts onto the EMA's (a (4, 4) weight set
to a (4,) tensor), and a buffer registered under a new name on a module that
was already paired (a new submodule is seen).
"""

from __future__ import annotations

import operator
import threading
import weakref
from typing import Any, Callable

REQUIRES_GRAD = operator.attrgetter("requires_grad")

EPOCH = [0]  # read directly on the hot path
_hooked = False
_hook_lock = threading.Lock()


def _bump(*_args: Any) -> None:
    EPOCH[0] += 1


def registration_epoch() -> int:
    """Counter of parameter/submodule registrations since the hooks were installed."""
    global _hooked
    if not _hooked:
        with _hook_lock:
            if not _hooked:
                import torch.nn.modules.module as module_mod

                module_mod.register_module_parameter_registration_hook(_bump)
                module_mod.register_module_module_registration_hook(_bump)
                _hooked = True
    return EPOCH[0]


def buffers_current(slots: list[dict[str, Any]], keys: list[str], held: list[Any]) -> bool:
    """True while ``slots[i][keys[i]] is held[i]`` for every i (C-level: no Python loop)."""
    return all(map(operator.is_, map(dict.get, slots, keys), held))


def ref(obj: Any) -> Callable[[], Any]:
    """A weak reference when the object allows one, else a strong one (same call shape)."""
    if obj is None:
        return _none
    try:
        return weakref.ref(obj)
    except TypeError:
        return lambda: obj


def _none() -> None:
    return None


def group_signature(optimizer: Any) -> Any:
    """Identity and size of the optimizer's param groups (a param added changes it)."""
    if optimizer is None:
        return None
    groups = getattr(optimizer, "param_groups", None)
    if not isinstance(groups, list):
        return None
    return (id(groups), [(id(p), len(p)) for p in [g.get("params", ()) for g in groups]])
