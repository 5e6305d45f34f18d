"""What a restore did, generator by generator: the answer to "is my resume exact?"."""

from __future__ import annotations

import typing  # noqa: F401  (before @dataclass: see compatshim._records)
from dataclasses import dataclass


@dataclass(frozen=True)
class RestoreReport:
    """Returned by ``restore`` and ``load``.

    ``restored`` generators continue the saved streams bit for bit; ``derived``
    ones got a deterministic state derived from the saved material; ``skipped``
    ones were left as they were (with the reason in brackets). ``new`` ones are
    generators of a kind the state never held (CUDA, XPU or MPS on a machine
    that has them, after a run that had none, such as a CPU-trained checkpoint
    resumed on a GPU machine): no saved stream was lost, so they do not make the
    restore inexact; CUDA ones are seeded from the saved material (the same
    checkpoint always gives the same streams), XPU and MPS ones are left as they
    are. ``exact`` is True only when nothing was derived or skipped.
    """

    source: str
    rank: int
    world_size: int
    saved_rank: int | None
    saved_world_size: int | None
    restored: tuple[str, ...]
    derived: tuple[str, ...]
    skipped: tuple[str, ...]
    notes: tuple[str, ...] = ()
    new: tuple[str, ...] = ()

    @property
    def exact(self) -> bool:
        return not self.derived and not self.skipped

    @property
    def mismatch(self) -> bool:
        """True when world size or devices differ from the save, or streams are not exact."""
        return bool(self.notes) or not self.exact

    def summary(self) -> str:
        origin = f"{self.source} state"
        if self.saved_rank is not None:
            origin += f" of saved rank {self.saved_rank}"
        if self.saved_world_size is not None:
            origin += f"/{self.saved_world_size}"
        lines = [f"rank {self.rank}/{self.world_size}: restored {origin}"]
        lines += [f"  {note}" for note in self.notes]
        for title, items in (
            ("restored", self.restored),
            ("derived", self.derived),
            ("skipped", self.skipped),
            ("new (the state held none)", self.new),
        ):
            if items:
                lines.append(f"  {title}: {', '.join(items)}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()
