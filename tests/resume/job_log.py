"""What compatshim did inside a job process, for its ``RESULT`` line.

Every decision it logs, and whether it was imported at all (a job run
without ``COMPATSHIM_AUTO=1`` must show the plain outcome, compatshim absent).

``status()`` keeps only the last few decisions per patch, and a Lightning
resume makes more than that; the ``compatshim`` logger gets every one
(compatshim sends decisions made before ``logging`` was imported once it is).
Imported by the job scripts of this folder, which run as scripts.
"""

from __future__ import annotations

import logging
import sys

_LINES: list[str] = []


class _Keep(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        _LINES.append(record.getMessage())


def listen() -> None:
    """Start keeping the ``compatshim`` logger's lines (call first thing in a job)."""
    logger = logging.getLogger("compatshim")
    logger.setLevel(logging.DEBUG)
    logger.addHandler(_Keep())


def retries() -> list[str]:
    """The loads ``torch-load-safe-globals`` retried through compatshim's loader."""
    return [line for line in _LINES if line.startswith("torch-load-safe-globals: retried")]


def compatshim_imported() -> bool:
    return "compatshim" in sys.modules
