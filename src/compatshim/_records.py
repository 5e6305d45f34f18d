"""The two records compatshim reports with: one per patch (``status()``), one per doctor check.

Every module that reports builds these, and every consumer (``compatshim doctor``,
its ``--json``, tests) reads them; a new field is added here once. Both are plain
dataclasses so that they cost nothing to import on the start-up path, and both
turn into JSON-ready dicts with :meth:`as_dict`.
"""

from __future__ import annotations

# ``typing`` is imported first, at run time: ``@dataclass`` reads ``sys.modules["typing"]``
# without the import lock, so a thread that builds these records while another thread
# is in its first ``import typing`` (``status()`` during the first ``import torch``) saw
# a half-initialised module and raised AttributeError (no ``ClassVar``). The import
# statement waits for that import to finish. Not on the start-up path: ``status()`` and
# doctor import this module, and ``importlib.metadata`` imports ``typing`` anyway.
import typing
from dataclasses import asdict, dataclass, field

if typing.TYPE_CHECKING:
    from typing import Any, Literal

    CheckKind = Literal["patch", "adapter", "hazard"]
    Defect = Literal["present", "absent", "not probed"]
    Position = Literal["unsupported", "tested", "untested"]


@dataclass
class PatchStatus:
    """What the registry knows about one patch in this process (a row of ``status()``).

    ``range_position``: ``"unsupported"`` below the patch's ``requires`` (left
    alone), ``"tested"`` inside its tested range, ``"untested"`` outside it
    (the probe decides), None when the distribution is not installed or its
    version cannot be read (then the probe decides, and ``version_note`` says why).
    """

    name: str
    description: str
    distribution: str
    installed_version: str | None
    requires: str
    tested: str
    range_position: Position | None
    armed: bool
    disabled: bool
    targets: list[str]
    targets_imported: list[str]
    defect: Defect
    applied: bool
    applied_targets: list[str]
    fixed: bool | None
    error: str | None = None
    version_note: str | None = None
    decisions: list[str] = field(default_factory=list)
    #: entries of the patch this process actually used (aliases read or imported), in order
    used: list[str] = field(default_factory=list)

    def __getitem__(self, key: str) -> Any:
        """``row["name"]``: rows were plain dicts before 0.2, and scripts read them that way."""
        if key == "in_range":
            return self.in_range
        if key in self.__dataclass_fields__:
            return getattr(self, key)
        raise KeyError(key)

    def __contains__(self, key: object) -> bool:
        return key == "in_range" or key in self.__dataclass_fields__

    def get(self, key: str, default: Any = None) -> Any:
        try:
            return self[key]
        except KeyError:
            return default

    @property
    def in_range(self) -> bool:
        return self.range_position == "tested"

    @property
    def applies(self) -> bool:
        """Installed and not older than what the patch supports."""
        return self.installed_version is not None and self.range_position != "unsupported"

    def as_dict(self) -> dict[str, Any]:
        found = asdict(self)
        found["in_range"] = self.in_range
        return found


@dataclass
class DoctorRow:
    """One line of ``compatshim doctor``: a patch, an adapter, or a hazard it checks.

    ``applies``: relevant to this install. ``present``: the breakage is there
    (None: not probed or not a yes/no question). ``fixed``: compatshim can fix
    it here, with its patches armed (None: nothing to fix; the doctor's JSON also
    calls it ``fixable``). ``in_force``: the fix is armed in the process asked
    (None: not a patch, or nothing to arm).
    """

    name: str
    kind: CheckKind
    applies: bool
    present: bool | None
    fixed: bool | None
    detail: str
    provider: str = ""
    seconds: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    in_force: bool | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DoctorRow:
        known = {name for name in cls.__dataclass_fields__}
        extra = {k: v for k, v in data.items() if k not in known}
        row = cls(**{k: v for k, v in data.items() if k in known})
        row.extra.update(extra)
        return row
