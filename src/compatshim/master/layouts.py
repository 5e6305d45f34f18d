"""The registry of known master-param layouts: one entry per way a release stores the map.

Each layout says which colossalai releases use it, where it looks, how it
recognises an optimizer, and how it reads the map and a shard's position. An
entry with ``unsupported`` recognises an optimizer only to explain why there is
no per-parameter master (so the error is precise instead of generic). Adding a
release with a new layout means adding one module with one ``Layout`` and
listing it in ``KNOWN_LAYOUTS``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from torch import Tensor

    from .shards import ShardPosition

# id(working param) -> master tensor; and id(master) -> working param
MasterById = Mapping[int, "Tensor"]
WorkingByMasterId = Mapping[int, "Tensor"]


@dataclass(frozen=True)
class Layout:
    """How one family of optimizers stores its working -> master map."""

    name: str
    versions: str
    looks_for: str
    matches: Callable[[Any], bool]
    master_by_id: Callable[[Any], MasterById] | None = None
    working_by_master_id: Callable[[Any], WorkingByMasterId | None] | None = None
    shard_position: Callable[[Any, Tensor, Tensor], ShardPosition] | None = None
    unsupported: str = ""

    def describe(self) -> str:
        """One line for error messages and ``compatshim doctor``."""
        return f"{self.name} (colossalai {self.versions}: {self.looks_for})"


def known_layouts() -> list[Layout]:
    """Every layout, most specific first (a subclass's layout before its base's)."""
    from . import gemini, hybrid, zero

    return [
        zero.OPTIMIZER_ATTRIBUTE,
        zero.PARAM_STORE,
        zero.FLAT_FP32_GROUPS,
        hybrid.AMP_MAP,
        gemini.CHUNKS,
    ]


def detect(optimizer: Any) -> Layout | None:
    """The first known layout that recognises ``optimizer`` itself (no unwrapping)."""
    for layout in known_layouts():
        try:
            if layout.matches(optimizer):
                return layout
        except Exception:  # a probe must never break on a foreign object
            continue
    return None
