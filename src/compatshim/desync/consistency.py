"""``check_module_consistency``: compare what each rank built before a wrapper depends on it.

DDP (and Fabric, ColossalAI) assume every rank holds the same parameters. When
shapes differ DDP fails with a message about "parameter sizes"; when one rank
never wraps, it hangs. Here every rank publishes (name, shape, dtype,
requires_grad) of each parameter and buffer through a sync point, and the
first difference is named with the ranks on each side.
"""

from __future__ import annotations

from typing import Any

from .._text import short
from .desync_report import rank_list
from .sync import meet

Entry = list[Any]  # [kind, name, shape, dtype, requires_grad]


def module_summary(module: Any) -> list[Entry]:
    """Parameters then buffers, in registration order, as JSON-friendly lists."""
    entries: list[Entry] = []
    for name, param in module.named_parameters():
        entries.append(
            ["parameter", name, list(param.shape), str(param.dtype), bool(param.requires_grad)]
        )
    for name, buffer in module.named_buffers():
        entries.append(["buffer", name, list(buffer.shape), str(buffer.dtype), False])
    return entries


def _describe(entry: Entry | None) -> str:
    if entry is None:
        return "nothing"
    kind, name, shape, dtype, grad = entry
    extra = ", requires_grad" if grad else ""
    return f"{kind} {name!r} shape {tuple(shape)} {dtype}{extra}"


def first_difference(summaries: dict[int, Any]) -> list[str]:
    """One line naming the first entry where ranks disagree, and which ranks hold what."""
    ranks = sorted(summaries)
    reference = summaries[ranks[0]] or []
    longest = max(len(s or []) for s in summaries.values())
    for index in range(longest):
        seen: dict[str, list[int]] = {}
        for rank in ranks:
            summary = summaries[rank] or []
            entry = summary[index] if index < len(summary) else None
            seen.setdefault(_describe(entry), []).append(rank)
        if len(seen) > 1:
            sides = "; ".join(f"ranks {rank_list(who)} have {what}" for what, who in seen.items())
            return [f"modules differ at entry #{index}: {sides}"]
    counts = {rank: len(summaries[rank] or []) for rank in ranks}
    if len(set(counts.values())) > 1 or (not reference and longest):
        return [f"modules hold different numbers of parameters and buffers: {counts}"]
    return []


def check_module_consistency(
    module: Any,
    timeout: float | None = None,
    *,
    tag: str = "check_module_consistency",
    store: Any = None,
    rank: int | None = None,
    world_size: int | None = None,
) -> None:
    """Raise DesyncError unless every rank's ``module`` has the same parameter names, shapes,
    dtypes and ``requires_grad`` (and buffers), or when a rank never arrives within ``timeout``.

    Call it on every rank before wrapping the module in DDP or a framework strategy.
    Without a process group it returns after one warning per process, as ``sync_point`` does.
    """
    if not all(callable(getattr(module, m, None)) for m in ("named_parameters", "named_buffers")):
        raise TypeError(f"module: expected a torch.nn.Module, got {short(module)}")
    meet(
        tag,
        timeout,
        payload=module_summary(module),
        compare=first_difference,
        store=store,
        rank=rank,
        world_size=world_size,
        caller="check_module_consistency",
    )
