"""Set-up shared by the checkpoint tests."""

from __future__ import annotations

from typing import Iterator

import pytest


@pytest.fixture
def process_allow_cleared(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No process-wide allow source (env, file, earlier ``allow()``) before or after a test."""
    from compatshim.checkpoint import process_allow

    for name in ("COMPATSHIM_ALLOW", "COMPATSHIM_ALLOW_FILE"):
        monkeypatch.delenv(name, raising=False)
    process_allow._reset()
    yield
    process_allow._reset()
