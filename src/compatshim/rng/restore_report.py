"""What a restore did, generator by generator: the answer to "is my resume exact?"."""

from __future__ import annotations

import hashlib
import typing  # noqa: F401  (before @dataclass: see compatshim._records)
from dataclasses import dataclass, field
from typing import Any

from . import devices


def _feed(digest: Any, value: Any) -> None:
    if hasattr(value, "cpu") and hasattr(value, "numpy"):  # a torch tensor
        digest.update(value.cpu().numpy().tobytes())
    elif hasattr(value, "tobytes"):  # a numpy array
        digest.update(value.tobytes())
    elif isinstance(value, (tuple, list)):
        for item in value:
            _feed(digest, item)
    else:
        digest.update(repr(value).encode())


def fingerprint(label: str) -> str:
    """A digest of the generator ``label``'s state now (``devices`` labels)."""
    digest = hashlib.blake2b(digest_size=16)
    _feed(digest, devices.accessors(label)[0]())
    return digest.hexdigest()


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

    ``exact`` describes the restore; :meth:`moved` says whether anything drew from the
    generators since (call it just before the first resumed step).
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
    # (label, fingerprint) of each generator set, read back just after the restore
    fingerprints: tuple[tuple[str, str], ...] = field(default=(), compare=False, repr=False)

    @property
    def exact(self) -> bool:
        return not self.derived and not self.skipped

    @property
    def mismatch(self) -> bool:
        """True when world size or devices differ from the save, or streams are not exact."""
        return bool(self.notes) or not self.exact

    def moved(self) -> tuple[str, ...]:
        """The generators this restore set whose state has changed since: something drew
        from them (or set them) between the restore and now. Called just before the first
        resumed step, a name here means that step will not continue the saved stream, e.g.
        ``torch_cpu`` after ``iter(loader)``, which draws the workers' base seed from it
        (``compatshim.data.resume`` builds the iterator without drawing)."""
        return tuple(label for label, mark in self.fingerprints if fingerprint(label) != mark)

    def summary(self) -> str:
        origin = f"{self.source} state"
        if self.saved_rank is not None:
            origin += f" of saved rank {self.saved_rank}"
        if self.saved_world_size is not None:
            origin += f"/{self.saved_world_size}"
        verb = "derived from" if self.derived and not self.restored else "restored"
        lines = [f"rank {self.rank}/{self.world_size}: {verb} {origin}"]
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
