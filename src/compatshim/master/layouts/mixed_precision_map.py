"""ColossalAI mixed-precision optimizers outside ZeRO (HybridParallel / MixedPrecision, stage 0).

``HybridParallelPlugin(zero_stage=0, precision="fp16"|"bf16")`` returns a
``MixedPrecisionOptimizer`` subclass whose ``working_to_master_map`` is keyed by
the working Parameter object (not its id) and holds *full-size* fp32 masters.
With zero_stage 1/2 the plugin's optimizer subclasses ``LowLevelZeroOptimizer``
and the ZeRO layouts (tried first) apply.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..shards import ShardPosition, whole_param_position
from ._layout import Layout

if TYPE_CHECKING:
    from torch import Tensor


def _has_amp_map(optimizer: Any) -> bool:
    return isinstance(getattr(optimizer, "working_to_master_map", None), dict)


def _master_by_id(optimizer: Any) -> dict[int, Tensor]:
    return {id(working): master for working, master in optimizer.working_to_master_map.items()}


def _working_by_master_id(optimizer: Any) -> dict[int, Tensor]:
    return {id(master): working for working, master in optimizer.working_to_master_map.items()}


def _position(optimizer: Any, param: Tensor, master: Tensor) -> ShardPosition:
    if master.numel() != param.numel():  # a map of shards is not this layout: never guess
        raise ValueError(
            f"compatshim.master: {type(optimizer).__name__}.working_to_master_map holds a "
            f"{master.numel()}-element master for a {param.numel()}-element param; the "
            "mixed-precision-map layout holds full-size masters only"
        )
    return whole_param_position(param.numel())


LAYOUT = Layout(
    name="mixed-precision-map",
    releases="0.3.2-0.5.0",
    looks_for="optimizer.working_to_master_map (keyed by Parameter, full-size masters)",
    matches=_has_amp_map,
    precedence=40,
    master_by_id=_master_by_id,
    working_by_master_id=_working_by_master_id,
    shard_position=_position,
)
