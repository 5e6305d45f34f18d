"""Every ``python`` code block of docs/ema.md runs as written (each in a namespace of its own)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("torch")

DOC = Path(__file__).resolve().parents[2] / "docs" / "ema.md"
BLOCKS = re.findall(r"^```python\n(.*?)^```$", DOC.read_text(encoding="utf-8"), re.S | re.M)


def test_the_page_has_code_blocks() -> None:
    assert len(BLOCKS) >= 4


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_code_block_runs(index: int) -> None:
    name = f"{DOC}:block{index}"
    exec(compile(BLOCKS[index], name, "exec"), {"__name__": "__doc_block__", "__file__": name})
