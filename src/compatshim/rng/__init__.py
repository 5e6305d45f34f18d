"""RNG state that survives changed device counts, world sizes, torch and numpy releases.

``capture()`` / ``restore(state)`` for one process, ``save(path)`` / ``load(path)``
for every rank of a job, ``read(path)`` for compatshim's files and those of
transformers, accelerate, Lightning and Sana-style checkpoints.

Guarantee: with the same world size and device count, every generator
continues bit-identically. Otherwise ranks and devices present in the save
get their saved state, and the others a deterministic state derived from the
saved material and their index (never another rank's or device's stream);
the returned :class:`RestoreReport` lists what was restored, derived and
skipped, and one :class:`RNGStateWarning` says so.

Importing this package imports neither torch nor numpy.
"""

from __future__ import annotations

from .capture import capture
from .doctor import doctor_rows
from .errors import RNGStateError, RNGStateWarning
from .files import load, read, save
from .report import RestoreReport
from .restore import restore

__all__ = [
    "RNGStateError",
    "RNGStateWarning",
    "RestoreReport",
    "capture",
    "doctor_rows",
    "load",
    "read",
    "restore",
    "save",
]
