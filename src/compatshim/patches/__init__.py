"""The patch catalogue: one small module per upstream defect.

Each module defines ``PATCH``. To support a new release, edit that one module
(its specifier, probe or fix) and the pin set in ``matrix/``.
"""

from __future__ import annotations

from importlib import import_module

TYPE_CHECKING = False  # no ``typing`` import at run time (start-up path)
if TYPE_CHECKING:
    from .._registry import Patch

#: patch name -> (its module in this package, the modules whose import triggers it).
#: ``install()`` arms post-import hooks from this table alone, so ``import compatshim.auto``
#: imports no patch module (they need pickle, copy, typing...): a patch module is imported
#: when one of its targets is. Each module's ``PATCH`` must agree with its row here
#: (tests/core/test_registry.py checks).
CATALOGUE: dict[str, tuple[str, tuple[str, ...]]] = {
    "torch-processgroup-copy": ("torch_processgroup_copy", ("torch.distributed",)),
    "nuscenes-dict-views": (
        "nuscenes_dict_views",
        ("nuscenes.eval.detection.data_classes", "nuscenes.eval.panoptic.evaluate"),
    ),
    "lightning-fabric-desync": (
        "lightning_fabric_desync",
        ("lightning.fabric.fabric", "lightning_fabric.fabric"),
    ),
}


def load_patch(name: str) -> Patch:
    """Import the module of catalogue entry ``name`` and return its ``PATCH``."""
    module_name, _ = CATALOGUE[name]
    patch: Patch = import_module(f"{__name__}.{module_name}").PATCH
    return patch


def all_patches() -> list[Patch]:
    return [load_patch(name) for name in CATALOGUE]
