"""Find the object that holds the map behind what the user holds, and its layout.

Users hold the optimizer ``booster.boost`` returned, an ``OptimizerWrapper``, a
``LowLevelZeroOptimizer`` or a plain torch optimizer. Only thin wrappers with
no masters of their own are unwrapped (``.optim``); an optimizer that looks
like ColossalAI's but matches no known layout raises instead of being treated
as plain, because its inner ``.optim`` holds masters, not working params. The
same goes for 0.3.x's ``ColossalaiOptimizer`` subclasses: they subclass
``torch.optim.Optimizer``, but their masters may live apart from
``param_groups`` (legacy ZeRO's ``ShardedOptimizerV2``, naive AMP).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import UnknownLayoutError
from .layouts import LAYOUTS, Layout, detect

# ColossalAI wrappers that add no master copy: their ``.optim`` is what counts.
THIN_WRAPPERS = frozenset(
    {"OptimizerWrapper", "HybridParallelNaiveOptimizer", "ColossalaiOptimizer"}
)
PLAIN = "plain-torch-optimizer"


@dataclass(frozen=True)
class Resolved:
    """The object holding the map and its layout (``None`` for a plain torch optimizer)."""

    holder: Any
    layout: Layout | None


def _is_colossalai_wrapper(obj: Any) -> bool:
    """A ColossalAI class holding another optimizer in ``.optim`` (it may keep masters)."""
    from_colossalai = any(cls.__module__.startswith("colossalai") for cls in type(obj).__mro__)
    return from_colossalai and getattr(obj, "optim", None) is not None


def _is_plain_torch_optimizer(obj: Any) -> bool:
    import torch

    return isinstance(obj, torch.optim.Optimizer) and not _is_colossalai_wrapper(obj)


def _looked_for() -> list[str]:
    return [layout.looks_for for layout in LAYOUTS] + [
        "torch.optim.Optimizer (no master copy)",
        "a thin wrapper's .optim (" + ", ".join(sorted(THIN_WRAPPERS)) + ")",
    ]


def _known() -> list[str]:
    return [layout.describe() for layout in LAYOUTS] + [
        f"{PLAIN} (any torch.optim.Optimizer: each param is its own master)"
    ]


def resolve(optimizer: Any) -> Resolved:
    """The layout of ``optimizer``, unwrapping thin wrappers; raises ``UnknownLayoutError``."""
    seen: list[Any] = []
    current = optimizer
    while current is not None and all(current is not s for s in seen):
        seen.append(current)
        layout = detect(current)
        if layout is not None:
            if layout.unsupported:
                raise UnknownLayoutError(optimizer, _looked_for(), _known(), layout.unsupported)
            return Resolved(current, layout)
        if _is_plain_torch_optimizer(current):
            return Resolved(current, None)
        if type(current).__name__ in THIN_WRAPPERS and hasattr(current, "optim"):
            current = current.optim
            continue
        break
    raise UnknownLayoutError(optimizer, _looked_for(), _known())


def layout_name(optimizer: Any) -> str:
    """The name of the layout ``optimizer`` resolves to (for messages and doctor)."""
    resolved = resolve(optimizer)
    return resolved.layout.name if resolved.layout is not None else PLAIN
