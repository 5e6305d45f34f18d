"""Set-up shared by the checkpoint tests."""

from __future__ import annotations

from typing import Any, Iterator

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


@pytest.fixture
def torch_own(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Hardened mode in this process; yields torch's own ``load`` to compare with, weights-only
    (hardened, torch's full unpickler is refused even to the original function)."""
    import warnings

    torch = pytest.importorskip("torch")
    import compatshim
    from compatshim.patches import torch_load_safe_globals as patch

    name = "torch-load-safe-globals"
    compatshim.uninstall([name])
    original = torch.load
    monkeypatch.setenv("COMPATSHIM_SAFE_LOAD", "1")
    compatshim.install(include=[name])
    try:
        assert torch.load.__compatshim_hardened__ is True
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", patch.CheckpointRefusedWarning)
            yield lambda *args, **kwargs: original(*args, weights_only=True, **kwargs)
    finally:
        compatshim.uninstall([name])
