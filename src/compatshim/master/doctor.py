"""``compatshim doctor`` rows for the master-param adapter, without importing colossalai.

Importing colossalai takes 10-25 s, so the layout is read from the installed
source of ``low_level_optim.py`` (distribution metadata locates it): a few
milliseconds. The markers are the attribute assignments each layout makes.
"""

from __future__ import annotations

from typing import Any

from .._versions import installed_version
from .layouts import known_layouts

# layout name -> text that only that layout's LowLevelZeroOptimizer source contains
_SOURCE_MARKERS = {
    "zero-optimizer-attribute": "self.working_to_master_param = dict()",
    "zero-param-store": "self._param_store = ParameterStore(",
    "zero-flat-fp32-groups": "_fp32_flat_param_groups_of_current_rank",
}
_SOURCE = "colossalai/zero/low_level/low_level_optim.py"


def _installed_source() -> str | None:
    from importlib import metadata
    from pathlib import Path

    try:
        path = metadata.distribution("colossalai").locate_file(_SOURCE)
        return Path(str(path)).read_text(encoding="utf-8")
    except Exception:
        return None


def detected_layout() -> str | None:
    """The ZeRO layout the installed colossalai source uses, or None if none matches."""
    source = _installed_source()
    if source is None:
        return None
    for name, marker in _SOURCE_MARKERS.items():
        if marker in source:
            return name
    return None


def rows() -> list[dict[str, Any]]:
    version = installed_version("colossalai")
    if version is None:
        return [
            {
                "name": "master: colossalai layout",
                "kind": "adapter",
                "applies": False,
                "present": None,
                "fixed": None,
                "detail": "colossalai not installed (plain optimizers: each param is its master)",
            }
        ]
    name = detected_layout()
    by_name = {layout.name: layout for layout in known_layouts()}
    layout = by_name.get(name) if name else None
    supported = layout is not None and not layout.unsupported
    if layout is None:
        detail = f"colossalai {version}: LowLevelZeroOptimizer source matches no known layout"
    else:
        detail = f"colossalai {version}: {layout.describe()}"
        if layout.unsupported:
            detail += " - not supported: " + layout.unsupported
    return [
        {
            "name": "master: colossalai layout",
            "kind": "adapter",
            "applies": True,
            "present": None,
            "fixed": supported,
            "detail": detail,
        }
    ]
