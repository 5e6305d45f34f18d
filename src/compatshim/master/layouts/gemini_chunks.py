"""ColossalAI ``GeminiOptimizer``: masters live in chunks, there is no per-parameter map.

Gemini keeps fp32 masters inside chunk buffers (``param_to_range`` and the chunk
lookups changed in 0.3.4), and a rank's piece of a parameter can be empty.
There is no stable per-parameter map to return, so compatshim recognises the
optimizer only to raise an error that says so; gather the EMA source from
``booster.save_model``/``model.state_dict()`` (which Gemini assembles) instead.
"""

from __future__ import annotations

from typing import Any

from ._layout import Layout


def _is_gemini(optimizer: Any) -> bool:
    cls = type(optimizer)
    return cls.__module__.startswith("colossalai") and "Gemini" in cls.__name__


LAYOUT = Layout(
    name="gemini-chunks",
    releases="0.3.2-0.5.0",
    looks_for="GeminiOptimizer (chunked masters)",
    matches=_is_gemini,
    precedence=50,
    unsupported=(
        "GeminiOptimizer keeps fp32 masters inside chunks with no per-parameter map; "
        "compatshim.master does not support it. Use model.state_dict() (Gemini gathers it) "
        "as the EMA source, with optimizer=None."
    ),
)
