"""How a patch declares itself: what it targets, which releases, how to probe, apply and revert.

Each patch module under :mod:`compatshim.patches` ends with one ``PATCH = Patch(...)``;
that declaration is the only place the patch's name, targets and versions are
written. This module depends on nothing else in compatshim (the registry
imports the patches, never the other way round) and imports nothing at run
time, because ``install()`` imports every patch module on the start-up path.
"""

from __future__ import annotations

TYPE_CHECKING = False  # no ``typing`` import at run time (start-up path)
if TYPE_CHECKING:
    from types import ModuleType
    from typing import Callable

    from ._patching import Patcher

    Probe = Callable[[ModuleType], bool]
    Apply = Callable[[ModuleType, Patcher], None]


class Patch:
    """A declared fix for one upstream defect.

    ``probe(module)`` returns True while the defect is present in ``module``;
    ``apply(module, patcher)`` makes every change through ``patcher`` so that
    revert is exact. Both are called once per target module, after the module
    and its parent packages have finished importing.

    Versions say two different things, so they are two arguments:

    - ``requires``: the releases of ``distribution`` the patch's code is meant
      for (a PEP 440 specifier, "" for any). Older releases are left alone.
    - ``tested``: the releases the matrix ran it on. Outside it (a newer
      release) the probe alone decides, and ``status()`` says "untested".

    ``target_distributions`` names the distribution of a target that ships in
    another package (``lightning_fabric`` comes from ``lightning-fabric``,
    ``lightning.fabric`` from ``lightning``); it is gated by that one.
    """

    __slots__ = (
        "apply",
        "description",
        "distribution",
        "name",
        "probe",
        "requires",
        "target_distributions",
        "targets",
        "tested",
    )

    def __init__(
        self,
        *,
        name: str,
        distribution: str,
        requires: str,
        tested: str,
        targets: tuple[str, ...],
        probe: Probe,
        apply: Apply,
        description: str,
        target_distributions: dict[str, str] | None = None,
    ) -> None:
        if isinstance(targets, str) or not targets:
            raise TypeError(f"patch {name!r}: targets must be a non-empty tuple of module names")
        self.name = name
        self.distribution = distribution
        self.requires = requires
        self.tested = tested
        self.targets = tuple(targets)
        self.probe = probe
        self.apply = apply
        self.description = description
        self.target_distributions = dict(target_distributions or {})

    def distribution_for(self, target: str) -> str:
        return self.target_distributions.get(target, self.distribution)

    def distributions(self) -> list[str]:
        """Every distribution this patch can meet, its main one first."""
        return list(dict.fromkeys([self.distribution, *self.target_distributions.values()]))

    def __repr__(self) -> str:
        return f"<Patch {self.name} {self.distribution}{self.requires} tested {self.tested}>"
