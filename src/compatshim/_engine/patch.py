"""How a patch declares itself: what it targets, which releases, where its probe and fix live.

The built-in declarations are the rows of :data:`compatshim.patches.CATALOGUE`;
each row names its fix module, which is imported only when a target module is
imported (or the doctor asks), so start-up cost does not grow with the
catalogue. This module imports nothing at run time: it is on the start-up path.
"""

from __future__ import annotations

TYPE_CHECKING = False  # no ``typing`` import at run time (start-up path)
if TYPE_CHECKING:
    from types import ModuleType
    from typing import Callable

    from .patching import Patcher

    Probe = Callable[[ModuleType], bool]
    Apply = Callable[[ModuleType, Patcher], None]
    Confirm = Callable[[ModuleType], bool]


class Patch:
    """A declared fix for one upstream defect.

    ``probe`` and ``apply`` are either given (a patch registered by hand) or
    read from ``fix_module`` on first use: ``compatshim.patches.<name>`` with
    dashes as underscores, which defines both at module level.
    ``probe(module)`` returns True while the defect is present in ``module``;
    ``apply(module, patcher)`` makes every change through ``patcher`` so that
    revert is exact. Both are called once per target module, after the module
    and its parent packages have finished importing.

    After ``apply`` the registry confirms the fix by probing again. A fix module
    whose probe is costly through the fix (it would import much of compatshim
    inside the user's import) may also define ``confirm(module)``: a cheap check
    that its changes are in place, run at once instead; the probe then confirms
    the fix end to end the first time ``status()`` (or the doctor) asks, and
    that is what ``status().fixed`` reports.

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
        "_apply",
        "_confirm",
        "_loaded",
        "_probe",
        "description",
        "distribution",
        "fix_module",
        "name",
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
        description: str,
        probe: Probe | None = None,
        apply: Apply | None = None,
        confirm: Confirm | None = None,
        target_distributions: dict[str, str] | None = None,
    ) -> None:
        if isinstance(targets, str) or not targets:
            raise TypeError(f"patch {name!r}: targets must be a non-empty tuple of module names")
        self.name = name
        self.distribution = distribution
        self.requires = requires
        self.tested = tested
        self.targets = tuple(targets)
        self._probe = probe
        self._apply = apply
        self._confirm = confirm
        self._loaded = probe is not None and apply is not None  # given: no fix module to read
        self.fix_module = "compatshim.patches." + name.replace("-", "_")
        self.description = description
        self.target_distributions = dict(target_distributions or {})

    @property
    def probe(self) -> Probe:
        if self._probe is None:
            self._load_fix()
        assert self._probe is not None
        return self._probe

    @property
    def apply(self) -> Apply:
        if self._apply is None:
            self._load_fix()
        assert self._apply is not None
        return self._apply

    @property
    def confirm(self) -> Confirm | None:
        """The fix module's cheap post-apply check, or None: the probe confirms at once."""
        if not self._loaded:
            self._load_fix()
        return self._confirm

    def _load_fix(self) -> None:
        """Import the fix module (inside a hook, whose errors the registry reports)."""
        # __import__ with a fromlist returns the submodule without importing importlib
        module = __import__(self.fix_module, fromlist=("probe", "apply"))
        self._probe, self._apply = module.probe, module.apply
        self._confirm = getattr(module, "confirm", None)
        self._loaded = True

    def distribution_for(self, target: str) -> str:
        return self.target_distributions.get(target, self.distribution)

    def distributions(self) -> list[str]:
        """Every distribution this patch can meet, its main one first."""
        return list(dict.fromkeys([self.distribution, *self.target_distributions.values()]))

    def __repr__(self) -> str:
        return f"<Patch {self.name} {self.distribution}{self.requires} tested {self.tested}>"
