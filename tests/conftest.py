"""Shared pytest set-up: hardware markers skip with a reason where the hardware is missing.

``COMPATSHIM_TEST_STANDIN_CUDA=N`` rehearses a GPU machine on CPU (``tests/harness/cuda_standin``):
``torch.cuda`` reports N GPUs with CUDA generator states, here and in every child interpreter.
"""

from __future__ import annotations

import os
import sys

import pytest


def pytest_configure(config: pytest.Config) -> None:
    from tests.harness import cuda_standin

    devices = cuda_standin.count()
    if not devices:
        return
    cuda_standin.install(devices)
    site = cuda_standin.site_dir()  # children: harness.dist.python_env copies sys.path
    sys.path.insert(0, site)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (site, os.environ.get("PYTHONPATH", "")) if p
    )


def _cuda_count() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from tests.harness import cuda_standin

    needs_gpu = [
        i for i in items if i.get_closest_marker("gpu") or i.get_closest_marker("multigpu")
    ]
    if not needs_gpu:
        return
    count = _cuda_count()
    for item in needs_gpu:
        if cuda_standin.count():
            reason = f"needs a real CUDA GPU; {cuda_standin.VARIABLE} stands in for one"
            item.add_marker(pytest.mark.skip(reason=reason))
        elif item.get_closest_marker("multigpu") and count < 2:
            item.add_marker(
                pytest.mark.skip(reason=f"needs 2+ CUDA GPUs, this machine has {count}")
            )
        elif item.get_closest_marker("gpu") and count < 1:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU, none visible"))
