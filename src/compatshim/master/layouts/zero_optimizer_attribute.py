"""ColossalAI 0.4.1-0.5.0 ``LowLevelZeroOptimizer``: the map is an attribute of the optimizer.

What broke (Open-Sora issue 642): EMA code read
``optimizer._param_store.working_to_master_param[id(p)]``; 0.4.1 deleted
``_param_store`` and put the same dict on the optimizer as
``working_to_master_param``, with ``get_param_padding_size`` beside it. The
ZeRO group is per parameter, in ``optimizer.pid_to_bucket_store[id(p)]``
(0.5 may hold a tuple of groups, outermost first). Masters are this rank's
shard of the flattened, padded working param.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..shards import ShardPosition, store_shard_position
from ._layout import Layout

if TYPE_CHECKING:
    from torch import Tensor


def _has_optimizer_map(optimizer: Any) -> bool:
    return isinstance(getattr(optimizer, "working_to_master_param", None), dict) and callable(
        getattr(optimizer, "get_param_padding_size", None)
    )


def _position(optimizer: Any, param: Tensor, master: Tensor) -> ShardPosition:
    stores = getattr(optimizer, "pid_to_bucket_store", None)
    store = stores[id(param)] if stores is not None else optimizer._bucket_store
    padding = int(optimizer.get_param_padding_size(param))
    return store_shard_position(store, param, master, padding, store.torch_pg)


LAYOUT = Layout(
    name="zero-optimizer-attribute",
    releases="0.4.1-0.5.0",
    looks_for="optimizer.working_to_master_param + optimizer.get_param_padding_size",
    matches=_has_optimizer_map,
    precedence=10,
    source_marker="self.working_to_master_param = dict()",
    master_by_id=lambda optimizer: optimizer.working_to_master_param,
    working_by_master_id=lambda optimizer: getattr(optimizer, "master_to_working_param", None),
    shard_position=_position,
)
