"""The two errors ``compatshim.checkpoint`` raises, whatever the bytes of the file.

Callers catch :class:`CheckpointError` for both; :class:`UnsafeCheckpointError`
is also a ``pickle.UnpicklingError``, the type ``torch.load(weights_only=True)``
raises for a refused global, so code written against torch keeps working.
"""

from __future__ import annotations

import pickle


class CheckpointError(Exception):
    """A damaged, truncated or unsupported file; the message names the file and the problem."""


class UnsafeCheckpointError(CheckpointError, pickle.UnpicklingError):
    """The file needs something compatshim refuses to run; the message names every refusal.

    ``refused`` lists the ``module.name`` globals (or operations) that were refused.
    """

    def __init__(self, message: str, refused: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.refused = refused
