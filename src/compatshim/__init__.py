"""compatshim: keeps PyTorch distributed training scripts working across framework releases.

Importing this package is cheap: it imports no framework and no adapter until used.
"""

from __future__ import annotations

from . import _settings
from ._engine import registry as _registry
from ._engine import versions as _versions
from ._engine.registry import install, status, uninstall

__version__ = "0.1.0"  # the one version source: hatch reads it for pyproject.toml
_versions.running["compatshim"] = __version__  # ourselves, installed or not


def _catalogue() -> tuple[Patch, ...]:
    from .patches import CATALOGUE

    return CATALOGUE


_registry.catalogue = _catalogue  # the engine imports nothing above itself: it is told

if _settings.safe_load():  # set, but the start-up hook may not have run: arm here
    from ._engine.safe_load import arm_at_import

    arm_at_import()

__all__ = [
    "Finding",
    "__version__",
    "checkpoint",
    "clone_module",
    "data",
    "dist",
    "ema",
    "find_unpicklable",
    "install",
    "master",
    "optim",
    "rng",
    "status",
    "uninstall",
]

TYPE_CHECKING = False  # no ``typing`` import at run time: importing compatshim stays cheap
if TYPE_CHECKING:
    from typing import Any

    from . import checkpoint as checkpoint
    from . import data as data
    from . import dist as dist
    from . import ema as ema
    from . import master as master
    from . import optim as optim
    from . import rng as rng
    from ._engine.patch import Patch
    from .cloning import clone_module
    from .pickling import Finding, find_unpicklable

_LAZY = {
    "clone_module": ("compatshim.cloning", "clone_module"),
    "find_unpicklable": ("compatshim.pickling", "find_unpicklable"),
    "Finding": ("compatshim.pickling", "Finding"),
}
_SUBMODULES = {"checkpoint", "data", "dist", "ema", "master", "optim", "rng"}


def __getattr__(name: str) -> Any:
    from importlib import import_module

    if name in _LAZY:
        module_name, attr = _LAZY[name]
        value = getattr(import_module(module_name), attr)
    elif name in _SUBMODULES:
        value = import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value
