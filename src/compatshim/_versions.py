"""Installed versions read from distribution metadata, never by importing the package."""

from __future__ import annotations

_cache: dict[str, str | None] = {}


def _normalise(name: str) -> str:
    return name.lower().replace("-", "_").replace(".", "_")


def _from_dist_info(distribution: str) -> str | None:
    """The version in a ``<name>-<version>.dist-info`` folder on ``sys.path``, if any.

    Hooks run in the middle of a framework's own import, where importing
    ``importlib.metadata`` costs ~10 ms; the folder name carries the same fact.
    """
    import os
    import sys

    wanted = _normalise(distribution)
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for name in names:
            if name.endswith(".dist-info"):
                project, _, version = name[: -len(".dist-info")].partition("-")
                if version and _normalise(project) == wanted:
                    return version
    return None


def installed_version(distribution: str) -> str | None:
    """The installed version of ``distribution``, or None when it is not installed."""
    if distribution not in _cache:
        version = _from_dist_info(distribution)
        if version is None:  # egg-info, zipped or unusual layouts
            from importlib import metadata

            try:
                version = metadata.version(distribution)
            except metadata.PackageNotFoundError:
                version = None
        _cache[distribution] = version
    return _cache[distribution]


def range_position(version: str, specifier: str) -> str:
    """Where ``version`` falls against ``specifier``: "in", "below" or "above".

    "below" means older than a lower bound (the patch's code is not meant for
    it); "above" means newer than the tested range, where the probe decides.
    """
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    spec = SpecifierSet(specifier)
    parsed = Version(version)
    if spec.contains(parsed, prereleases=True):
        return "in"
    for item in spec:
        if item.operator in (">=", ">", "~=", "==") and not item.contains(parsed, prereleases=True):
            bound = Version(item.version.rstrip(".*"))
            if parsed < bound:
                return "below"
    return "above"
