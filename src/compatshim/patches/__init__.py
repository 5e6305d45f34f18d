"""The patch catalogue: one small module per upstream defect.

Each module defines ``PATCH``. To support a new release, edit that one module
(its specifier, probe or fix) and the pin set in ``matrix/``.
"""

from __future__ import annotations

from importlib import import_module

TYPE_CHECKING = False  # no ``typing`` import at run time (start-up path)
if TYPE_CHECKING:
    from .._registry import Patch

PATCH_MODULES = (
    "torch_processgroup_copy",
    "nuscenes_dict_views",
    "lightning_fabric_desync",
)


def all_patches() -> list[Patch]:
    patches = []
    for name in PATCH_MODULES:
        try:
            module = import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"{__name__}.{name}":
                continue  # catalogue entry not written yet
            raise
        patches.append(module.PATCH)
    return patches
