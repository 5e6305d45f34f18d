"""Checks of the public functions' arguments, run before any file is read or generator set.

A wrong type is a TypeError naming the argument (``trusted="no"`` must not be truthy
enough to unpickle a file; ``rank="0"`` must not surface as a comparison error
deep in planning); a value of the right type but out of range is a ValueError.
"""

from __future__ import annotations

import os
from numbers import Integral
from pathlib import Path
from typing import Any, Mapping

from .._text import short
from .plan import DEVICE_POLICIES, WORLD_SIZE_POLICIES


def check_bool(name: str, value: Any) -> None:
    """``value`` is exactly True or False: a switch such as ``trusted`` is never read by truth."""
    if value is not True and value is not False:
        raise TypeError(f"{name}: expected True or False, got {short(value)}")


def checked_path(path: Any) -> Path:
    """``path`` (a str or os.PathLike) as a Path; ``Path(None)`` would name no argument."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path: expected a file path (str or os.PathLike), got {short(path)}")
    target = os.fspath(path)
    if not isinstance(target, str):
        raise TypeError(f"path: expected a str path, got {short(target)}")
    if not target:
        raise ValueError("path: expected a file path, got ''")
    return Path(target)


def check_state(state: Any) -> None:
    """``restore``'s state is a mapping: a path (``load``'s argument) or a tensor is named as
    a wrong argument, not reported as a file with no RNG state in it."""
    if not isinstance(state, Mapping):
        hint = (
            "; to restore from a file, call compatshim.rng.load(path)"
            if isinstance(state, (str, os.PathLike))
            else ""
        )
        raise TypeError(
            "state: expected an RNG state dict (from capture() or read(), or another "
            f"framework's RNG dict), got {short(state)}{hint}"
        )


def checked_position(rank: Any, world_size: Any) -> tuple[int | None, int | None]:
    """(rank, world_size) as ints or None; a bool is not a rank."""
    checked: list[int | None] = []
    for name, value in (("rank", rank), ("world_size", world_size)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, Integral)):
            raise TypeError(f"{name}: expected an int or None, got {short(value)}")
        checked.append(None if value is None else int(value))
    if checked[0] is not None and checked[0] < 0:
        raise ValueError(f"rank: expected a non-negative int or None, got {checked[0]}")
    if checked[1] is not None and checked[1] < 1:
        raise ValueError(f"world_size: expected a positive int or None, got {checked[1]}")
    return checked[0], checked[1]


def check_policies(on_device_mismatch: Any, on_world_size_mismatch: Any) -> None:
    """Both policies up front: planning reads each only on the paths that need it."""
    for name, value, allowed in (
        ("on_device_mismatch", on_device_mismatch, DEVICE_POLICIES),
        ("on_world_size_mismatch", on_world_size_mismatch, WORLD_SIZE_POLICIES),
    ):
        if not isinstance(value, str) or value not in allowed:
            raise ValueError(f"{name} must be one of {allowed}, got {short(value)}")
