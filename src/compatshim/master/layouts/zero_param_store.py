"""ColossalAI 0.3.2-0.4.0 ``LowLevelZeroOptimizer``: the map lives in the ``ParameterStore``.

``optimizer._param_store.working_to_master_param`` (and
``master_to_working_param``); 0.3.3+ also offer ``get_working_to_master_map()``
returning the same dict. The store knows the padding
(``get_param_padding_size``), ``local_rank`` and ``world_size``; the ZeRO
group is ``store.torch_pg`` from 0.3.5, ``optimizer.dp_pg`` before (None
means the world). Masters are this rank's shard of the flattened, padded
working param.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..shards import ShardPosition, store_shard_position
from ._layout import Layout

if TYPE_CHECKING:
    from torch import Tensor


def _has_param_store_map(optimizer: Any) -> bool:
    store = getattr(optimizer, "_param_store", None)
    return isinstance(getattr(store, "working_to_master_param", None), dict)


def _position(optimizer: Any, param: Tensor, master: Tensor) -> ShardPosition:
    store = optimizer._param_store
    group = store.torch_pg if hasattr(store, "torch_pg") else optimizer.dp_pg
    padding = int(store.get_param_padding_size(param))
    return store_shard_position(store, param, master, padding, group)


LAYOUT = Layout(
    name="zero-param-store",
    releases="0.3.2-0.4.0",
    looks_for="optimizer._param_store.working_to_master_param",
    matches=_has_param_store_map,
    precedence=20,
    source_marker="self._param_store = ParameterStore(",
    master_by_id=lambda optimizer: optimizer._param_store.working_to_master_param,
    working_by_master_id=lambda optimizer: optimizer._param_store.master_to_working_param,
    shard_position=_position,
)
