"""Shared pytest set-up: hardware markers skip with a reason where the hardware is missing."""

from __future__ import annotations

import pytest


def _cuda_count() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    needs_gpu = [
        i for i in items if i.get_closest_marker("gpu") or i.get_closest_marker("multigpu")
    ]
    if not needs_gpu:
        return
    count = _cuda_count()
    for item in needs_gpu:
        if item.get_closest_marker("multigpu") and count < 2:
            item.add_marker(
                pytest.mark.skip(reason=f"needs 2+ CUDA GPUs, this machine has {count}")
            )
        elif item.get_closest_marker("gpu") and count < 1:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU, none visible"))
