"""Pure restore planning: which saved entry goes to which current rank and device.

Nothing here touches a device, so the 7-GPUs-saved, 1-GPU-now case is tested
on any machine. The rules:

* same rank / device present in the save: restore it (bit-identical);
* rank or device the save lacks: ``"derive"`` gives it a deterministic derived
  state, ``"error"`` raises :class:`RNGStateError` naming both counts;
* saved entries with no current counterpart are skipped and reported.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .errors import RNGStateError

DevicePolicy = Literal["derive", "error"]
WorldSizePolicy = Literal["derive", "derive_all", "error"]
DEVICE_POLICIES = ("derive", "error")
WORLD_SIZE_POLICIES = ("derive", "derive_all", "error")


@dataclass(frozen=True)
class DevicePlan:
    """Current device index -> saved index to restore, or derived; saved indexes left over."""

    kind: str
    restore: tuple[int, ...]
    derive: tuple[int, ...]
    skip_saved: tuple[int, ...]


@dataclass(frozen=True)
class RankPlan:
    """Whether this rank restores a saved rank's state or derives a fresh one."""

    rank: int
    saved_rank: int | None  # the saved rank restored; None when derived
    reason: str


def plan_devices(kind: str, saved: int, current: int, policy: DevicePolicy) -> DevicePlan:
    if policy not in DEVICE_POLICIES:
        raise ValueError(f"on_device_mismatch must be one of {DEVICE_POLICIES}, got {policy!r}")
    if saved != current and policy == "error":
        raise RNGStateError(
            f"the state holds {saved} {kind} generator state(s) but this process has "
            f"{current} {kind} device(s); pass on_device_mismatch='derive' to restore the "
            f"{min(saved, current)} matching device(s) and derive the rest"
        )
    shared = min(saved, current)
    return DevicePlan(
        kind=kind,
        restore=tuple(range(shared)),
        derive=tuple(range(shared, current)),
        skip_saved=tuple(range(shared, saved)),
    )


def check_position(rank: int, world_size: int) -> None:
    """Checked before any saved state is picked: a rank the job cannot have restores nothing."""
    if not 0 <= rank < world_size:
        raise RNGStateError(
            f"rank {rank} is outside world size {world_size}; pass a rank in 0..{world_size - 1} "
            "(and world_size too where torch.distributed is not initialised)"
        )


def plan_rank(saved_world: int, rank: int, world_size: int, policy: WorldSizePolicy) -> RankPlan:
    if policy not in WORLD_SIZE_POLICIES:
        raise ValueError(
            f"on_world_size_mismatch must be one of {WORLD_SIZE_POLICIES}, got {policy!r}"
        )
    check_position(rank, world_size)
    if saved_world == world_size:
        return RankPlan(rank, rank, "same world size")
    if policy == "error":
        raise RNGStateError(
            f"the file holds RNG states of {saved_world} rank(s) but the job has {world_size}; "
            "pass on_world_size_mismatch='derive' to restore matching ranks and derive the rest"
        )
    change = f"world size changed {saved_world} -> {world_size}"
    if policy == "derive" and rank < saved_world:
        return RankPlan(rank, rank, f"{change}; rank {rank} exists in the file")
    return RankPlan(rank, None, f"{change}; rank {rank} derived")
