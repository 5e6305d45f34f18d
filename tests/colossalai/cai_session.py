"""One 2-rank ColossalAI session that runs every check and returns a summary per rank.

``import colossalai`` takes 10-25 s, so the test modules share one real
2-process gloo group (``session_summary``) instead of one group per test.
Each check records plain data (max errors, exception texts) and the tests
assert on it. Model sizes are odd on purpose so every param gets padding.
"""

from __future__ import annotations

import copy
import os
from typing import Any

DECAY = 0.9
STEPS = 20
CONFIGS = [(1, "bf16"), (1, "fp16"), (2, "bf16"), (2, "fp16")]
DEVICE = "cpu"  # "cuda" in the GPU leg (real accelerator and NCCL, no stand-in)


def build_model() -> Any:
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Linear(5, 7)
            self.scale = nn.Parameter(torch.ones(7))  # LayerNorm has no CPU fp16 kernel
            self.head = nn.Linear(7, 3)
            self.pos_embed = nn.Parameter(torch.randn(1, 3))
            self.frozen = nn.Parameter(torch.randn(3), requires_grad=False)

        def forward(self, x: Any) -> Any:
            return self.head(torch.tanh(self.embed(x)) * self.scale) + self.pos_embed + self.frozen

    torch.manual_seed(0)
    return Net().to(DEVICE)


def _dtype(name: str) -> Any:
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[name]


def _batch(step: int, rank: int, dtype: Any) -> Any:
    import torch

    gen = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(4, 5, generator=gen).to(device=DEVICE, dtype=dtype)


def _error(fn: Any) -> str:
    try:
        fn()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return ""


def _trainable(model: Any) -> list[tuple[str, Any]]:
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


def _strip(name: str) -> str:
    return name[len("module.") :] if name.startswith("module.") else name


def _masters_vs_working(optimizer: Any, model: Any) -> dict[str, Any]:
    """All-gathered, unpadded masters against the working params (in fp32)."""
    from compatshim.master import gather_master_param, master_shard_position

    worst_fp32 = 0.0
    cast_mismatch = 0
    positions = []
    for name, p in _trainable(model):
        full = gather_master_param(optimizer, p)
        worst_fp32 = max(worst_fp32, float((full - p.float()).abs().max()))
        cast_mismatch += int(not bool((full.to(p.dtype) == p.data).all()))
        pos = master_shard_position(optimizer, p)
        positions.append((name, pos.offset, pos.length, pos.padding, pos.numel, pos.world_size))
    return {"max_abs_fp32": worst_fp32, "cast_mismatch": cast_mismatch, "positions": positions}


def _ema_vs_reference(ema: dict[str, Any], ref: dict[str, Any]) -> float:
    return max(float((ema[n].double() - ref[n]).abs().max()) for n in ref)


def _reference_step(ref: dict[str, Any], optimizer: Any, model: Any, exclude: set[str]) -> None:
    from compatshim.master import gather_master_param

    for name, p in _trainable(model):
        key = _strip(name)
        if key in exclude:
            continue
        ref[key].mul_(DECAY).add_(gather_master_param(optimizer, p).double(), alpha=1 - DECAY)


def check_zero(stage: int, dtype_name: str, rank: int) -> dict[str, Any]:
    """LowLevelZeroOptimizer directly: masters, 20 EMA steps (full and sharded), old line."""
    import torch
    from colossalai.zero import LowLevelZeroOptimizer

    import compatshim.ema as cema
    from compatshim.master import master_param, working_to_master

    dtype = _dtype(dtype_name)
    model = build_model()
    ema_full = copy.deepcopy(model).float()
    ema_sharded = copy.deepcopy(model).float()
    model = model.to(dtype)
    inner = torch.optim.AdamW(model.parameters(), lr=1e-2)
    optimizer = LowLevelZeroOptimizer(
        inner,
        initial_scale=2**8,
        partition_grad=(stage == 2),
        overlap_communication=(stage == 2),
        reduce_bucket_size=64,
    )
    out: dict[str, Any] = {"initial": _masters_vs_working(optimizer, model)}
    exclude = {"pos_embed"}
    # EMA init is the working params in fp32 (bf16/fp16 rounded), like Open-Sora's
    for ema in (ema_full, ema_sharded):
        ema.load_state_dict({k: v.float() for k, v in model.state_dict().items()})
    ref = {n: p.detach().double().clone() for n, p in _trainable(ema_full) if n not in exclude}
    cema.shard_ema(ema_sharded, model, optimizer, exclude=exclude)
    out["sharded_shapes"] = {n: tuple(p.shape) for n, p in ema_sharded.named_parameters()}
    for step in range(STEPS):
        loss = model(_batch(step, rank, dtype)).float().pow(2).mean()
        optimizer.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        cema.update_ema(ema_full, model, optimizer, decay=DECAY, exclude=exclude)
        cema.update_ema(ema_sharded, model, optimizer, decay=DECAY, exclude=exclude)
        _reference_step(ref, optimizer, model, exclude)
    out["trained"] = _masters_vs_working(optimizer, model)
    full_state = dict(ema_full.named_parameters())
    out["ema_full_err"] = _ema_vs_reference(full_state, ref)
    out["ema_sharded_err"] = _ema_vs_reference(
        cema.gather_sharded_ema(ema_sharded, model, optimizer, exclude=exclude), ref
    )
    out["master_device_error"] = _error(  # meta: an EMA beside CPU-offloaded masters
        lambda: cema.update_ema(
            copy.deepcopy(ema_full).to("meta"), model, optimizer, decay=DECAY, exclude=exclude
        )
    )
    out["pos_embed_init_kept"] = bool(
        torch.equal(ema_full.pos_embed.data, build_model().pos_embed.data.to(dtype).float())
    )
    p = next(p for _, p in _trainable(model))
    out["open_sora_line_error"] = _error(
        lambda: optimizer._param_store.working_to_master_param[id(p)]
    )
    out["get_working_to_master_map"] = hasattr(optimizer, "get_working_to_master_map")
    mapping = working_to_master(optimizer)
    out["map_len"] = len(mapping)
    out["map_keys_are_params"] = all(any(k is q for _, q in _trainable(model)) for k in mapping)
    out["id_key_same"] = mapping[id(p)] is mapping[p] is master_param(optimizer, p)
    out["master_dtype"] = str(master_param(optimizer, p).dtype)
    out["frozen_error"] = _error(lambda: master_param(optimizer, model.frozen))
    out["unknown_layout_error"] = _error(lambda: working_to_master(_future_release(optimizer)))
    return out


def check_zero_batchnorm(rank: int) -> dict[str, Any]:
    """A bf16 BatchNorm model under LowLevelZero stage 2: fp32 EMA (full and sharded) with the
    default buffer policy; params from the masters, buffers from this rank's model, vs fp64."""
    import torch
    from colossalai.zero import LowLevelZeroOptimizer
    from torch import nn

    import compatshim.ema as cema
    from compatshim.master import gather_master_param

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 7), nn.BatchNorm1d(7), nn.Tanh(), nn.Linear(7, 3))
    model = model.to(DEVICE)
    ema_full = copy.deepcopy(model).float()
    ema_sharded = copy.deepcopy(model).float()
    model = model.to(torch.bfloat16)
    optimizer = LowLevelZeroOptimizer(
        torch.optim.AdamW(model.parameters(), lr=1e-2),
        initial_scale=2**8,
        partition_grad=True,
        overlap_communication=True,
        reduce_bucket_size=64,
    )
    for ema in (ema_full, ema_sharded):
        ema.load_state_dict({k: v.float() for k, v in model.state_dict().items()})
    ref = {n: p.detach().double().clone() for n, p in _trainable(ema_full)}
    ref_buffers = {n: b.double() for n, b in ema_full.named_buffers() if b.is_floating_point()}
    cema.shard_ema(ema_sharded, model, optimizer)
    for step in range(5):
        loss = model(_batch(step, rank, torch.bfloat16)).float().pow(2).mean()
        optimizer.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        cema.update_ema(ema_full, model, optimizer, decay=DECAY)
        cema.update_ema(ema_sharded, model, optimizer, decay=DECAY)
        for name, p in _trainable(model):
            master = gather_master_param(optimizer, p).double()
            ref[name].mul_(DECAY).add_(master, alpha=1 - DECAY)
        for name, value in ref_buffers.items():
            value.mul_(DECAY).add_(model.get_buffer(name).double(), alpha=1 - DECAY)
    gathered = cema.gather_sharded_ema(ema_sharded, model, optimizer)
    return {
        "ema_full_err": _ema_vs_reference(dict(ema_full.named_parameters()), ref),
        "ema_sharded_err": _ema_vs_reference(gathered, ref),
        "buffers_full_err": _ema_vs_reference(dict(ema_full.named_buffers()), ref_buffers),
        "buffers_sharded_err": _ema_vs_reference(gathered, ref_buffers),
        "buffer_dtypes": sorted({str(b.dtype) for b in ema_full.buffers()}),
        "counters": [int(ema_full[1].num_batches_tracked), int(gathered["1.num_batches_tracked"])],
        "moved": not torch.equal(ema_full[1].running_mean, torch.zeros(7, device=DEVICE)),
    }


def _future_release(optimizer: Any) -> Any:
    """The real optimizer's state under a class that keeps its map somewhere new.

    Stands for a future release that moved the map again: same type name,
    same attributes minus every map compatshim knows.
    """
    hidden = {"_param_store", "working_to_master_param", "working_to_master_map"}
    future = type("LowLevelZeroOptimizer", (), {"__module__": "colossalai.zero.future"})
    obj = future.__new__(future)
    obj.__dict__.update({k: v for k, v in optimizer.__dict__.items() if k not in hidden})
    return obj


def check_plain(rank: int) -> dict[str, Any]:
    """A plain torch optimizer: every param is its own master; EMA from working params."""
    import torch

    import compatshim.ema as cema
    from compatshim.master import master_param, master_shard_position, working_to_master

    model = build_model()
    ema = copy.deepcopy(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    ref = {n: p.detach().double().clone() for n, p in _trainable(ema)}
    for step in range(STEPS):
        loss = model(_batch(step, rank, torch.float32)).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        cema.update_ema(ema, model, optimizer, decay=DECAY)
        for n, p in _trainable(model):
            ref[n].mul_(DECAY).add_(p.detach().double(), alpha=1 - DECAY)
    mapping = working_to_master(optimizer)
    return {
        "identity": all(mapping[p] is p for p in model.parameters()),
        "master_is_param": master_param(optimizer, model.head.weight) is model.head.weight,
        "whole": master_shard_position(optimizer, model.head.weight).is_whole,
        "ema_err": _ema_vs_reference(dict(ema.named_parameters()), ref),
    }


def _train_with_ema(
    booster: Any, model: Any, optimizer: Any, ema: Any, base: Any, ema_source: Any, rank: int
) -> dict[str, Any]:
    """5 bf16 steps through ``booster`` with an EMA of ``ema_source`` against a fp64 reference.

    ``ema`` (copied before boosting) starts from ``base``, the unwrapped model;
    ``ema_source`` is what ``update_ema`` is handed (the boosted wrapper or ``base``).
    """
    import torch

    import compatshim.ema as cema
    from compatshim.master import layout_name

    ema.load_state_dict({k: v.float() for k, v in base.state_dict().items()})
    ref = {n: p.detach().double().clone() for n, p in _trainable(ema)}
    for step in range(5):
        loss = model(_batch(step, rank, torch.bfloat16)).float().pow(2).mean()
        booster.backward(loss, optimizer)
        optimizer.step()
        optimizer.zero_grad()
        cema.update_ema(ema, ema_source, optimizer, decay=DECAY)
        _reference_step(ref, optimizer, ema_source, set())
    return {
        "optimizer_type": type(optimizer).__name__,
        "layout": layout_name(optimizer),
        "masters": _masters_vs_working(optimizer, ema_source),
        "ema_err": _ema_vs_reference(dict(ema.named_parameters()), ref),
    }


def check_booster(rank: int) -> dict[str, Any]:
    """``Booster(plugin=LowLevelZeroPlugin(stage=2)).boost(...)`` and EMA on what it returns."""
    import torch
    from colossalai.booster import Booster
    from colossalai.booster.plugin import LowLevelZeroPlugin

    model = build_model()
    ema = copy.deepcopy(model).float()
    inner = torch.optim.AdamW(model.parameters(), lr=1e-2)
    plugin = LowLevelZeroPlugin(stage=2, precision="bf16", initial_scale=2**8)
    booster = Booster(plugin=plugin)
    boosted_model, optimizer, *_ = booster.boost(model, inner)
    base = boosted_model.module if hasattr(boosted_model, "module") else boosted_model
    return _train_with_ema(booster, boosted_model, optimizer, ema, base, boosted_model, rank)


def _no_shard_policy() -> Any:
    """A shardformer policy that changes nothing (our toy model has no built-in policy)."""
    from colossalai.shardformer.policies.base_policy import Policy

    class NoShard(Policy):  # type: ignore[misc]
        def config_sanity_check(self) -> None:
            return None

        def preprocess(self) -> Any:
            return self.model

        def module_policy(self) -> dict[Any, Any]:
            return {}

        def postprocess(self) -> Any:
            return self.model

    return NoShard()


def check_hybrid(zero_stage: int, rank: int) -> dict[str, Any]:
    """HybridParallelPlugin (tp=pp=1) in bf16: stage 0 has a Parameter-keyed map of full
    masters, stage 1 subclasses the ZeRO optimizer. Records why when a release cannot."""
    import torch
    from colossalai.booster import Booster
    from colossalai.booster.plugin import HybridParallelPlugin

    try:
        plugin = HybridParallelPlugin(
            tp_size=1,
            pp_size=1,
            zero_stage=zero_stage,
            precision="bf16",
            custom_policy=_no_shard_policy(),
        )
    except Exception as exc:  # e.g. a release without custom_policy
        return {"unavailable": f"{type(exc).__name__}: {exc}"}
    model = build_model()
    ema = copy.deepcopy(model).float()
    booster = Booster(plugin=plugin)
    boosted_model, optimizer, *_ = booster.boost(model, torch.optim.AdamW(model.parameters()))
    base = boosted_model.unwrap() if hasattr(boosted_model, "unwrap") else boosted_model.module
    return _train_with_ema(booster, boosted_model, optimizer, ema, base, base, rank)


def run_session(
    rank: int, world_size: int, configs: list[tuple[int, str]], device: str = "cpu"
) -> dict[str, Any]:
    """Everything the colossalai tests assert on, computed on one rank.

    ``device="cpu"`` installs the CPU stand-ins; ``"cuda"`` is the GPU leg.
    """
    global DEVICE
    DEVICE = device
    if device == "cpu":
        from tests.colossalai.cai_standin import install

        install()
    else:
        import torch

        torch.cuda.set_device(rank)
    import colossalai

    summary: dict[str, Any] = {"version": colossalai.__version__, "zero": {}}
    for stage, dtype_name in configs:
        summary["zero"][f"stage{stage}-{dtype_name}"] = check_zero(stage, dtype_name, rank)
    summary["plain"] = check_plain(rank)
    summary["batchnorm"] = check_zero_batchnorm(rank)
    summary["booster"] = check_booster(rank)
    summary["hybrid"] = {stage: check_hybrid(stage, rank) for stage in (0, 1)}
    summary["pid"] = os.getpid()
    return summary
