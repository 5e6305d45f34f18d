"""ColossalAI 0.3.0-0.3.1 ``LowLevelZeroOptimizer``: flat fp32 groups, no per-parameter map.

Masters are one flat fp32 buffer per param group
(``_fp32_flat_param_groups_of_current_rank``). compatshim recognises the
layout only to raise an error that says so, instead of a generic one.
"""

from __future__ import annotations

from typing import Any

from ._layout import Layout


def _has_flat_groups(optimizer: Any) -> bool:
    return hasattr(optimizer, "_fp32_flat_param_groups_of_current_rank")


LAYOUT = Layout(
    name="zero-flat-fp32-groups",
    releases="0.3.0-0.3.1",
    looks_for="optimizer._fp32_flat_param_groups_of_current_rank",
    matches=_has_flat_groups,
    precedence=30,
    source_marker="_fp32_flat_param_groups_of_current_rank",
    unsupported=(
        "This LowLevelZeroOptimizer keeps masters as one flat fp32 buffer per param group "
        "with no per-parameter map (colossalai 0.3.0-0.3.1); compatshim does not derive "
        "per-parameter views from it. Upgrade to colossalai>=0.3.2."
    ),
)
