"""ColossalAI ``LowLevelZeroOptimizer`` (ZeRO-1/2): the map moved between releases.

What breaks: Open-Sora's EMA reads
``optimizer._param_store.working_to_master_param[id(p)]``; 0.4.1 deleted
``_param_store`` and put the same dict on the optimizer (Open-Sora issue 642).

Layouts (verified on the installed sdists):
- 0.3.2-0.4.0: ``optimizer._param_store.working_to_master_param``; the store
  knows the padding (``get_param_padding_size``), ``local_rank`` and
  ``world_size``; the group is ``store.torch_pg`` from 0.3.5, ``optimizer.dp_pg``
  before. 0.3.3+ also offer
  ``get_working_to_master_map()`` returning the same dict.
- 0.4.1-0.5.0: ``optimizer.working_to_master_param`` and
  ``optimizer.get_param_padding_size``; the group is per parameter in
  ``optimizer.pid_to_bucket_store[id(p)]`` (0.5 may hold a tuple of groups).
- 0.3.0-0.3.1: flat fp32 groups and no map: recognised only to say so.

Masters are this rank's shard of the flattened, padded working param; the
store's group numbers are checked against the tensors' sizes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .layouts import Layout
from .shards import ShardPosition, whole_param_position, zero_shard_position

if TYPE_CHECKING:
    from torch import Tensor


def _store_position(
    store: Any, param: Tensor, master: Tensor, padding: int, group: Any
) -> ShardPosition:
    numel = param.numel()
    if master.numel() == numel and padding == 0 and int(store.world_size) == 1:
        return whole_param_position(numel)
    return zero_shard_position(
        numel=numel,
        master_numel=master.numel(),
        padding=padding,
        rank=int(store.local_rank),
        world_size=int(store.world_size),
        group=group,
    )


# -- 0.3.2 - 0.4.0: the map lives in the ParameterStore --------------------------------------


def _has_param_store_map(optimizer: Any) -> bool:
    store = getattr(optimizer, "_param_store", None)
    return isinstance(getattr(store, "working_to_master_param", None), dict)


def _param_store_position(optimizer: Any, param: Tensor, master: Tensor) -> ShardPosition:
    store = optimizer._param_store
    # 0.3.5+ stores know their group; 0.3.2-0.3.4 keep it on the optimizer (None = world)
    group = store.torch_pg if hasattr(store, "torch_pg") else optimizer.dp_pg
    return _store_position(store, param, master, int(store.get_param_padding_size(param)), group)


PARAM_STORE = Layout(
    name="zero-param-store",
    versions="0.3.2-0.4.0",
    looks_for="optimizer._param_store.working_to_master_param",
    matches=_has_param_store_map,
    master_by_id=lambda optimizer: optimizer._param_store.working_to_master_param,
    working_by_master_id=lambda optimizer: optimizer._param_store.master_to_working_param,
    shard_position=_param_store_position,
)


# -- 0.4.1 - 0.5.0: the map is an attribute of the optimizer ---------------------------------


def _has_optimizer_map(optimizer: Any) -> bool:
    return isinstance(getattr(optimizer, "working_to_master_param", None), dict) and callable(
        getattr(optimizer, "get_param_padding_size", None)
    )


def _optimizer_position(optimizer: Any, param: Tensor, master: Tensor) -> ShardPosition:
    stores = getattr(optimizer, "pid_to_bucket_store", None)
    store = stores[id(param)] if stores is not None else optimizer._bucket_store
    padding = int(optimizer.get_param_padding_size(param))
    return _store_position(store, param, master, padding, store.torch_pg)


OPTIMIZER_ATTRIBUTE = Layout(
    name="zero-optimizer-attribute",
    versions="0.4.1-0.5.0",
    looks_for="optimizer.working_to_master_param + optimizer.get_param_padding_size",
    matches=_has_optimizer_map,
    master_by_id=lambda optimizer: optimizer.working_to_master_param,
    working_by_master_id=lambda optimizer: getattr(optimizer, "master_to_working_param", None),
    shard_position=_optimizer_position,
)


# -- 0.3.0 - 0.3.1: flat fp32 groups, no per-parameter map -----------------------------------

FLAT_FP32_GROUPS = Layout(
    name="zero-flat-fp32-groups",
    versions="0.3.0-0.3.1",
    looks_for="optimizer._fp32_flat_param_groups_of_current_rank",
    matches=lambda optimizer: hasattr(optimizer, "_fp32_flat_param_groups_of_current_rank"),
    unsupported=(
        "This LowLevelZeroOptimizer keeps masters as one flat fp32 buffer per param group "
        "with no per-parameter map (colossalai 0.3.0-0.3.1); compatshim does not derive "
        "per-parameter views from it. Upgrade to colossalai>=0.3.2."
    ),
)
