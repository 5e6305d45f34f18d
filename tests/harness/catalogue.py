"""One catalogue patch at a time, for its own tests: its ``compatshim.status()`` row, and
the patch uninstalled (or armed alone) for a test and uninstalled after, whatever the test
did meanwhile."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import compatshim


def status_row(name: str) -> Any:
    (row,) = [row for row in compatshim.status() if row.name == name]
    return row


@contextlib.contextmanager
def alone(name: str, *, armed: bool) -> Iterator[None]:
    compatshim.uninstall([name])
    try:
        if armed:
            assert compatshim.install(include=[name]) == [name]
        yield
    finally:
        compatshim.uninstall([name])


def a_library_wraps(owner: Any, name: str) -> Any:
    """What another library does after compatshim: wraps ``owner.name`` (``functools.wraps``,
    which copies compatshim's marks onto its wrapper) and sets its wrapper there."""
    import functools

    under = vars(owner)[name]

    @functools.wraps(under)
    def library(*args: Any, **kwargs: Any) -> Any:
        return under(*args, **kwargs)

    setattr(owner, name, library)
    return library
