"""The patch catalogue: one small module per upstream defect.

Each module ends with ``PATCH = Patch(...)``, the one place its name, targets
and versions are written; the module is named after the patch
(``torch-processgroup-copy`` lives in ``torch_processgroup_copy.py``). To support
a new release, edit that one module (its ``tested`` range, probe or fix) and
the pin set in ``matrix/``; to add a patch, add its module and one line here.

``install()`` imports every module listed here, on the start-up path of every
process that sets ``COMPATSHIM_AUTO=1``: a patch module's top level imports
nothing heavier than compatshim's own ``_patch``/``_patching`` (frameworks,
``pickle``, ``typing``... are imported inside its functions).
"""

from __future__ import annotations

TYPE_CHECKING = False  # no ``typing`` import at run time (start-up path)
if TYPE_CHECKING:
    from .._patch import Patch

CATALOGUE = (
    "torch_processgroup_copy",
    "nuscenes_dict_views",
    "lightning_fabric_desync",
    "torch_load_safe_globals",
    "numpy_core_names",
    "multiprocessing_pickle_paths",
    "removed_names",
)


def patch_name(module_name: str) -> str:
    return module_name.replace("_", "-")


def load_catalogue() -> list[tuple[str, Patch | None, str | None]]:
    """``(name, PATCH, None)`` per catalogue module; ``(name, None, why)`` for one that fails."""
    found: list[tuple[str, Patch | None, str | None]] = []
    for module_name in CATALOGUE:
        name = patch_name(module_name)
        try:
            # __import__ with a fromlist returns the submodule; importlib would cost an import
            # (and its ``warnings``) on the start-up path
            patch = __import__(f"{__name__}.{module_name}", fromlist=("PATCH",)).PATCH
            if patch.name != name:
                raise ValueError(f"module {module_name} declares a patch named {patch.name!r}")
        except Exception as exc:
            found.append((name, None, f"{type(exc).__name__}: {exc}"))
            continue
        found.append((name, patch, None))
    return found
