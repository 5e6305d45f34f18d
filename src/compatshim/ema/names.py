"""One name normaliser: EMA and source params pair by name whatever wraps either model.

Wrappers insert a segment into every parameter name: ``torch.compile``
(``_orig_mod.``), DDP / DataParallel (``module.``), FSDP1
(``_fsdp_wrapped_module.``), the activation-checkpoint wrapper
(``_checkpoint_wrapped_module.``). An exact name wins; otherwise both sides
are compared with those segments removed, anywhere in the dotted path. Two
EMA names that normalise alike are ambiguous and raise, never guess.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from collections.abc import Mapping

WRAPPER_SEGMENTS = frozenset(
    {"_orig_mod", "module", "_fsdp_wrapped_module", "_checkpoint_wrapped_module"}
)

T = TypeVar("T")


class EmaMismatchError(ValueError):
    """The EMA model and the model do not line up (missing name or incompatible shape)."""


class EmaWarning(UserWarning):
    """``update_ema`` was asked for something that does nothing (an ``exclude`` that matches
    no parameter or buffer): said at the caller's line, never silent."""


def canonical(name: str) -> str:
    """``_orig_mod.module.blocks.0._checkpoint_wrapped_module.w`` -> ``blocks.0.w``."""
    parts = name.split(".")
    kept = [part for part in parts if part not in WRAPPER_SEGMENTS]
    return name if len(kept) == len(parts) else ".".join(kept)


class NameIndex:
    """Find the EMA entry for a source name: exactly, else by canonical name."""

    def __init__(self, ema_entries: Mapping[str, T], kind: str = "parameter") -> None:
        self.exact = ema_entries
        self.kind = kind  # "parameter" or "buffer", for the messages
        self.by_canonical: dict[str, list[str]] | None = None

    def lookup(self, name: str) -> str:
        if name in self.exact:
            return name
        if self.by_canonical is None:
            self.by_canonical = {}
            for ema_name in self.exact:
                self.by_canonical.setdefault(canonical(ema_name), []).append(ema_name)
        key = canonical(name)
        found = self.by_canonical.get(key, [])
        if len(found) == 1:
            return found[0]
        if found:
            raise EmaMismatchError(
                f"compatshim.ema: model {self.kind} {name!r} matches several EMA {self.kind}s "
                f"once wrapper prefixes are removed: {sorted(found)}; name them apart"
            )
        hint = ""
        if key.endswith("_flat_param"):
            hint = " (FSDP1 flattens parameters unless wrapped with use_orig_params=True)"
        remedy = "copy the EMA from the same model or exclude the name"
        if self.kind == "buffer":
            remedy += " (or pass buffers='skip' to leave every buffer alone)"
        raise EmaMismatchError(
            f"compatshim.ema: EMA model has no {self.kind} {name!r} (model has it; looked for "
            f"{key!r} without wrapper prefixes {sorted(WRAPPER_SEGMENTS)}){hint}; {remedy}"
        )
