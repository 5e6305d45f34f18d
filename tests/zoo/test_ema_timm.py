"""``compatshim.ema.update_ema`` against timm's own ``ModelEmaV3`` on a BatchNorm model.

The test lives with the other buffer-policy tests (``tests/core/test_ema_buffers.py``),
where the core envs skip it for want of timm; it is collected here too so that the
zoo-mm envs (timm 0.9.16 and 1.0.31) run it on every CI pass.
"""

from __future__ import annotations

import pytest

pytest.importorskip("timm")

from tests.core.test_ema_buffers import test_matches_timm_model_ema_v3

__all__ = ["test_matches_timm_model_ema_v3"]
