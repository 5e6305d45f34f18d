"""Errors and warnings of ``compatshim.rng``: one error type so callers catch one thing."""

from __future__ import annotations


class RNGStateError(ValueError):
    """An RNG state or file that cannot be restored as asked; nothing was changed."""


class RNGStateWarning(UserWarning):
    """A restore that went on but did not reproduce the saved streams exactly."""
