"""``pkg_resources`` for setuptools >= 82 (which removed it): the subset old frameworks use.

Loaded as ``pkg_resources`` by compatshim's alias finder, only where no real
``pkg_resources`` can be found; never imported under its own name. Backed by
``importlib.metadata`` and ``packaging``, with setuptools 81's semantics for
what it provides:

- ``declare_namespace(name)``: a no-op (Lightning <= 2.3.3 calls it for
  ``lightning.fabric`` and ``lightning.pytorch``, ordinary packages).
- ``require(*requirements)``: resolves the requirements and their
  dependencies (markers and extras evaluated, pre-releases accepted, as
  ``WorkingSet.resolve`` does) and returns the distributions; raises
  ``DistributionNotFound`` / ``VersionConflict`` like setuptools 81.
- ``get_distribution(name_or_requirement)``: the installed distribution as found (its
  dependencies are not resolved, as in setuptools 81): ``.project_name``, ``.key``,
  ``.version``, ``.parsed_version``, ``.location``, ``.requires(extras)``.
- ``iter_entry_points(group, name=None)``: ``.name``, ``.module_name``,
  ``.attrs``, ``.extras``, ``.dist``, ``.load()``, ``.resolve()``.
- ``parse_version`` (``packaging.version.Version``, as in setuptools 81),
  ``resource_filename`` / ``resource_string`` for packages on disk.
- ``ResolutionError``, ``DistributionNotFound``, ``VersionConflict``,
  ``ContextualVersionConflict``.

Any other name raises an ``AttributeError`` naming it and the caller
(``from pkg_resources import X`` turns it into Python's ImportError, whose
message shows this file's path).
"""

from __future__ import annotations

import os
import re
import sys
from importlib import metadata as _metadata
from typing import Any, Iterable, Iterator

from packaging.markers import UndefinedEnvironmentName
from packaging.requirements import InvalidRequirement
from packaging.requirements import Requirement as _Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

__all__ = [
    "ContextualVersionConflict",
    "Distribution",
    "DistributionNotFound",
    "EntryPoint",
    "ResolutionError",
    "VersionConflict",
    "declare_namespace",
    "get_distribution",
    "iter_entry_points",
    "parse_version",
    "require",
    "resource_filename",
    "resource_string",
]

parse_version = Version


class ResolutionError(Exception):
    """Abstract base for dependency resolution errors."""

    def __repr__(self) -> str:
        return self.__class__.__name__ + repr(self.args)


class VersionConflict(ResolutionError):
    """An installed version conflicts with the requested one: ``(dist, req)``."""

    _template = "{self.dist} is installed but {self.req} is required"

    @property
    def dist(self) -> Any:
        return self.args[0]

    @property
    def req(self) -> Any:
        return self.args[1]

    def report(self) -> str:
        return self._template.format(self=self)

    def with_context(self, required_by: set[str]) -> VersionConflict:
        if not required_by:
            return self
        return ContextualVersionConflict(*self.args, required_by)


class ContextualVersionConflict(VersionConflict):
    """A :class:`VersionConflict` with the set of requirers: ``(dist, req, required_by)``."""

    _template = VersionConflict._template + " by {self.required_by}"

    @property
    def required_by(self) -> set[str]:
        return self.args[2]  # type: ignore[no-any-return]


class DistributionNotFound(ResolutionError):
    """A requested distribution was not found: ``(req, requirers)``."""

    _template = (
        "The '{self.req}' distribution was not found and is required by {self.requirers_str}"
    )

    @property
    def req(self) -> Any:
        return self.args[0]

    @property
    def requirers(self) -> set[str] | None:
        return self.args[1]  # type: ignore[no-any-return]

    @property
    def requirers_str(self) -> str:
        if not self.requirers:
            return "the application"
        return ", ".join(self.requirers)

    def report(self) -> str:
        return self._template.format(self=self)

    def __str__(self) -> str:
        return self.report()


class Distribution:
    """An installed distribution, read from its metadata."""

    def __init__(self, dist: _metadata.Distribution) -> None:
        self._dist = dist
        # setuptools' safe_name: runs of other characters become "-" (typing_extensions)
        self.project_name: str = re.sub("[^A-Za-z0-9.]+", "-", dist.metadata["Name"] or "")
        self.key = self.project_name.lower()
        self.version: str = dist.version

    @property
    def parsed_version(self) -> Version:
        return Version(self.version)

    @property
    def location(self) -> str:
        return str(self._dist.locate_file(""))

    def requires(self, extras: Iterable[str] = ()) -> list[_Requirement]:
        """Dependencies whose markers hold here, with those of ``extras``."""
        wanted = ["", *extras]
        found: list[_Requirement] = []
        for line in self._dist.requires or ():
            req = _Requirement(line)
            if req.marker is None or any(_marker_holds(req, extra) for extra in wanted):
                req.marker = None
                found.append(req)
        return found

    def __contains__(self, req: _Requirement) -> bool:
        return _satisfies(self, req)

    def __str__(self) -> str:
        return f"{self.project_name} {self.version}"

    def __repr__(self) -> str:
        return f"{self} ({self.location})"


def _marker_holds(req: _Requirement, extra: str) -> bool:
    assert req.marker is not None
    try:
        return req.marker.evaluate({"extra": extra})
    except UndefinedEnvironmentName:
        return False


def _satisfies(dist: Distribution, req: _Requirement) -> bool:
    try:
        return req.specifier.contains(Version(dist.version), prereleases=True)
    except InvalidVersion:
        return False


def _find(name: str) -> Distribution | None:
    try:
        return Distribution(_metadata.distribution(name))
    except _metadata.PackageNotFoundError:
        return None


def _requirements(specs: Iterable[Any]) -> Iterator[_Requirement]:
    """``parse_requirements``: strings (one per line, ``#`` comments) or requirement objects."""
    if isinstance(specs, str):
        specs = [specs]
    for spec in specs:
        if not isinstance(spec, str):
            yield _Requirement(str(spec))
            continue
        for line in spec.splitlines():
            line = line.split(" #", 1)[0].strip()
            if line and not line.startswith("#"):
                yield _Requirement(line)


def require(*requirements: Any) -> list[Distribution]:
    """Resolve ``requirements`` and their dependencies; the distributions, first found first."""
    pending = [(req, "") for spec in requirements for req in _requirements(spec)]
    pending.reverse()
    best: dict[str, Distribution] = {}
    required_by: dict[str, set[str]] = {}
    resolved: list[Distribution] = []
    seen: set[tuple[str, str]] = set()
    while pending:
        req, requirer = pending.pop()
        if (str(req), requirer) in seen:
            continue
        seen.add((str(req), requirer))
        if req.marker is not None and not _marker_holds(req, ""):
            continue
        key = canonicalize_name(req.name)
        dist = best.get(key)
        if dist is None:
            dist = _find(req.name)
            if dist is None:
                raise DistributionNotFound(req, required_by.get(key))
            best[key] = dist
            resolved.append(dist)
        if not _satisfies(dist, req):
            raise VersionConflict(dist, req).with_context(required_by.get(key, set()))
        for dependency in reversed(dist.requires(req.extras)):
            required_by.setdefault(canonicalize_name(dependency.name), set()).add(dist.project_name)
            pending.append((dependency, dist.project_name))
    return resolved


def get_distribution(dist: Any) -> Distribution:
    """The installed distribution for a name or requirement string."""
    if isinstance(dist, Distribution):
        return dist
    if not isinstance(dist, str):
        raise TypeError("Expected str, Requirement, or Distribution", dist)
    try:
        req = _Requirement(dist)
    except InvalidRequirement as exc:
        raise ValueError(f"Invalid requirement {dist!r}: {exc}") from None
    found = _find(req.name)
    if found is None:
        return require(str(req))[0]  # raises DistributionNotFound, as setuptools 81
    if req.specifier and not _satisfies(found, req):
        raise VersionConflict(found, req)
    return found  # as found (working_set.find): its own dependencies are not resolved


class EntryPoint:
    """An entry point as ``pkg_resources`` shaped it."""

    def __init__(self, entry: _metadata.EntryPoint, dist: Distribution | None) -> None:
        self._entry = entry
        self.name: str = entry.name
        module, _, attrs = entry.value.partition(":")
        self.module_name = module.strip()
        self.attrs = tuple(a.strip() for a in attrs.split("[")[0].split(".") if a.strip())
        extras = entry.value.partition("[")[2].rstrip("]")
        self.extras = tuple(e.strip() for e in extras.split(",") if e.strip())
        self.dist = dist

    def resolve(self) -> Any:
        return self._entry.load()

    def load(self, require: bool = True, *args: Any, **kwargs: Any) -> Any:
        return self._entry.load()

    def __str__(self) -> str:
        return f"{self.name} = {self._entry.value}"

    def __repr__(self) -> str:
        return f"EntryPoint.parse({str(self)!r})"


def iter_entry_points(group: str, name: str | None = None) -> Iterator[EntryPoint]:
    """Entry points of ``group`` (only those called ``name`` when given), per distribution."""
    for found in _metadata.distributions():
        for entry in found.entry_points:
            if entry.group == group and (name is None or entry.name == name):
                yield EntryPoint(entry, Distribution(found))


def declare_namespace(packageName: str) -> None:
    """No-op: the packages that still call it are ordinary (or PEP 420) packages."""


def _resource_path(package: str, resource_name: str) -> str:
    if not isinstance(package, str):
        raise TypeError(
            f"compatshim's pkg_resources takes a package name, not {type(package).__name__}"
        )
    module = sys.modules.get(package)
    if module is None:
        __import__(package)
        module = sys.modules[package]
    filename = getattr(module, "__file__", None)
    if filename is None:
        raise NotImplementedError(f"{package} has no __file__: its resources are not on disk")
    if os.path.isabs(resource_name) or ".." in resource_name.split("/"):
        raise ValueError(f"resource name must be relative, within the package: {resource_name!r}")
    return os.path.join(os.path.dirname(filename), *resource_name.split("/"))


def resource_filename(package_or_requirement: str, resource_name: str) -> str:
    """The path of ``resource_name`` inside the package (packages on disk only)."""
    return _resource_path(package_or_requirement, resource_name)


def resource_string(package_or_requirement: str, resource_name: str) -> bytes:
    with open(_resource_path(package_or_requirement, resource_name), "rb") as handle:
        return handle.read()


def __getattr__(name: str) -> Any:
    from compatshim.aliases._missing import not_provided

    raise not_provided("pkg_resources", name, "setuptools 82 removed pkg_resources")
