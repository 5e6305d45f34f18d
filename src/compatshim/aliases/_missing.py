"""The error an adapter module raises for a name outside its subset."""

from __future__ import annotations


def _caller() -> str:
    """``file:line`` of the first frame outside compatshim's package and importlib (a user's
    folder may be named after compatshim: only the package's own files are skipped)."""
    import sys

    from .._warn import internal_file

    frame = sys._getframe(2)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not internal_file(filename) and not filename.startswith("<frozen"):
            return f"{filename}:{frame.f_lineno}"
        frame = frame.f_back  # type: ignore[assignment]
    return "an unknown caller"


def not_provided(module: str, name: str, why: str) -> AttributeError:
    """An ``AttributeError`` naming the missing name and who asked (``hasattr`` stays False)."""
    caller = _caller()
    from compatshim._engine import decisions

    decisions.record("removed-names", "not provided", f"{module}.{name} asked by {caller}")
    return AttributeError(
        f"{module}.{name} is not provided: {why}, and compatshim's {module} gives only a "
        f"subset (asked by {caller})"
    )
