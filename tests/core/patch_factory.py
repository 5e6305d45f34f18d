"""Test patches for the registry's own tests: the packaging distribution is always installed."""

from __future__ import annotations

from types import ModuleType
from typing import Callable

from compatshim._engine.patch import Patch
from compatshim._engine.patching import Patcher


def make_patch(
    name: str,
    targets: tuple[str, ...],
    probe: Callable[[ModuleType], bool],
    apply: Callable[[ModuleType, Patcher], None],
    *,
    requires: str = ">=1",
    tested: str = ">=1",
    distribution: str = "packaging",
    target_distributions: dict[str, str] | None = None,
    confirm: Callable[[ModuleType], bool] | None = None,
) -> Patch:
    return Patch(
        name=name,
        distribution=distribution,
        requires=requires,
        tested=tested,
        targets=targets,
        probe=probe,
        apply=apply,
        confirm=confirm,
        description="test patch",
        target_distributions=target_distributions,
    )
