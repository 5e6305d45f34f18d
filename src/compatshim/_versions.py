"""Installed versions read from distribution metadata, never by importing the package."""

from __future__ import annotations

_cache: dict[str, str | None] = {}


def installed_version(distribution: str) -> str | None:
    """The installed version of ``distribution``, or None when it is not installed."""
    if distribution not in _cache:
        from importlib import metadata

        try:
            _cache[distribution] = metadata.version(distribution)
        except metadata.PackageNotFoundError:
            _cache[distribution] = None
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
