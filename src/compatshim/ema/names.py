"""One name normaliser: EMA and source params pair by name whatever wraps either model.

Wrappers insert a segment into every parameter name: ``torch.compile``
(``_orig_mod.``), DDP / DataParallel (``module.``), FSDP1
(``_fsdp_wrapped_module.``), the activation-checkpoint wrapper
(``_checkpoint_wrapped_module.``). An exact name wins; otherwise both sides
are compared with those segments removed, anywhere in the dotted path
(``plan.NameIndex`` pairs by it; two EMA names that normalise alike raise there).
"""

from __future__ import annotations

WRAPPER_SEGMENTS = frozenset(
    {"_orig_mod", "module", "_fsdp_wrapped_module", "_checkpoint_wrapped_module"}
)


def canonical(name: str) -> str:
    """``_orig_mod.module.blocks.0._checkpoint_wrapped_module.w`` -> ``blocks.0.w``."""
    parts = name.split(".")
    kept = [part for part in parts if part not in WRAPPER_SEGMENTS]
    return name if len(kept) == len(parts) else ".".join(kept)
