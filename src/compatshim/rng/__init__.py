"""RNG state that survives changed device counts, world sizes, torch and numpy releases.

``capture()`` / ``restore(state)`` for one process, ``save(path)`` / ``load(path)``
for every rank of a job, ``read(path)`` for compatshim's files and those of
transformers, accelerate, Lightning and Sana-style checkpoints.

Guarantee: with the same world size and device count, every generator
continues bit-identically. Otherwise ranks and devices present in the save
get their saved state, and the others a deterministic state derived from the
saved material and their index (never another rank's or device's stream);
a file or state holding one rank's state (another framework's per-rank file,
one job-wide state as Sana keeps, or a ``capture()`` only rank 0 kept) is
restored on its own rank (rank 0 when unknown) and derived on the others.
Accelerator generators of a kind the save never held (a CPU-trained
checkpoint resumed on a GPU machine) are reported as new, not as an inexact
restore. The returned :class:`RestoreReport`
lists what was restored, derived and skipped, and one
:class:`RNGStateWarning` says so whenever the setup differs from the save.

Restores are atomic: every part is validated before any generator is set,
and a write that fails puts back the ones already made
(:class:`RNGStateError`). Files are read by ``compatshim.checkpoint.load``, which runs
no code from them unless ``trusted=True``; ``save`` writes atomically.

Importing this package imports neither torch nor numpy.
"""

from __future__ import annotations

from .capture import capture
from .doctor import doctor_rows
from .errors import RNGStateError, RNGStateWarning
from .files import load, read, save
from .restore import restore
from .restore_report import RestoreReport

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
