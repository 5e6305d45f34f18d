"""Every scale test leaves no thread rank, process group or compatshim monitor behind."""

from __future__ import annotations

import sys
import threading
from typing import Iterator

import pytest


@pytest.fixture(autouse=True)
def _nothing_outlives_the_test() -> Iterator[None]:
    yield
    torch = sys.modules.get("torch")
    if torch is None:
        return
    from tests.scale.worlds import stop_compatshim_monitor

    stop_compatshim_monitor()
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    ranks = [t.name for t in threading.enumerate() if t.name.startswith("rank") and t.is_alive()]
    assert not ranks, f"thread ranks outlived the test: {ranks}"
