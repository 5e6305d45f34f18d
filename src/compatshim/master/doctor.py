"""``compatshim doctor`` rows for the master-param adapter, without importing colossalai.

Importing colossalai takes 10-25 s, so the layout is read from the installed
source of ``low_level_optim.py`` (distribution metadata locates it): a few
milliseconds. Each layout declares its own ``source_marker`` (the text only
its release's source contains); this module only reads them.
"""

from __future__ import annotations

import importlib.util
from importlib import metadata
from pathlib import Path

from .._engine.versions import installed_version
from .._records import DoctorRow
from .layouts import LAYOUTS, Layout

ROW_NAME = "master: colossalai layout"
_SOURCE = "colossalai/zero/low_level/low_level_optim.py"


def _installed_source() -> str | None:
    """The source beside the metadata, else beside the package Python would import.

    An editable install (``pip install -e`` of a ColossalAI clone) keeps its
    dist-info in site-packages and its source in the clone; ``find_spec`` of the
    top-level package locates the clone without importing colossalai.
    """
    try:
        path = Path(str(metadata.distribution("colossalai").locate_file(_SOURCE)))
        if not path.is_file():
            spec = importlib.util.find_spec("colossalai")
            locations = list(spec.submodule_search_locations or []) if spec else []
            path = Path(locations[0]).parent / _SOURCE
        return path.read_text(encoding="utf-8")
    except Exception:  # not installed, moved, unreadable: "matches no known layout"
        return None


def layout_in_source(source: str) -> Layout | None:
    """The layout whose ``source_marker`` ``source`` contains, or None."""
    for layout in LAYOUTS:
        if layout.source_marker is not None and layout.source_marker in source:
            return layout
    return None


def detected_layout() -> Layout | None:
    """The ZeRO layout the installed colossalai source uses, or None if none matches."""
    source = _installed_source()
    return None if source is None else layout_in_source(source)


def doctor_rows() -> list[DoctorRow]:
    """One row: the installed colossalai and the layout compatshim reads its masters with."""
    version = installed_version("colossalai")
    if version is None:
        return [
            DoctorRow(
                name=ROW_NAME,
                kind="adapter",
                applies=False,
                present=None,
                fixed=None,
                detail="colossalai not installed (plain optimizers: each param is its master)",
            )
        ]
    layout = detected_layout()
    if layout is None:
        detail = f"colossalai {version}: LowLevelZeroOptimizer source matches no known layout"
    else:
        detail = f"colossalai {version}: {layout.describe()}"
        if layout.unsupported:
            detail += " - not supported: " + layout.unsupported
    return [
        DoctorRow(
            name=ROW_NAME,
            kind="adapter",
            applies=True,
            present=None,
            fixed=layout is not None and not layout.unsupported,
            detail=detail,
        )
    ]
