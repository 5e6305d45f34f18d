"""What one master-param layout declares: where a family of optimizers keeps its map.

A layout is one module in this package that defines ``LAYOUT = Layout(...)``.
Everything that knows about layouts reads these fields: the resolver tries
``matches`` in ``precedence`` order, the error message lists ``describe()``,
and ``compatshim doctor`` looks for ``source_marker`` in the installed
ColossalAI source.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from torch import Tensor

    from ..shards import ShardPosition

# id(working param) -> master tensor; and id(master) -> working param
MasterById = Mapping[int, "Tensor"]
WorkingByMasterId = Mapping[int, "Tensor"]


@dataclass(frozen=True)
class Layout:
    """How one family of optimizers stores its working -> master map.

    ``releases``: the colossalai releases that use it (as tested, ``"0.4.1-0.5.0"``).
    ``precedence``: lower is tried first, so a layout that recognises a subclass
    goes before the one that recognises its base. ``source_marker``: text that
    only this layout's ``colossalai/zero/low_level/low_level_optim.py`` contains
    (None for layouts that live elsewhere). A layout with ``unsupported``
    recognises an optimizer only to say why it has no per-parameter master;
    every other layout reads the map and a shard's position.
    """

    name: str
    releases: str
    looks_for: str
    matches: Callable[[Any], bool]
    precedence: int
    source_marker: str | None = None
    master_by_id: Callable[[Any], MasterById] | None = None
    working_by_master_id: Callable[[Any], WorkingByMasterId | None] | None = None
    shard_position: Callable[[Any, Tensor, Tensor], ShardPosition] | None = None
    unsupported: str = ""

    def __post_init__(self) -> None:
        if not self.unsupported and (self.master_by_id is None or self.shard_position is None):
            raise TypeError(
                f"layout {self.name!r}: a supported layout reads the map and shard positions "
                "(master_by_id, shard_position), or says why not (unsupported)"
            )

    def describe(self) -> str:
        """One line for error messages and ``compatshim doctor``."""
        return f"{self.name} (colossalai {self.releases}: {self.looks_for})"
