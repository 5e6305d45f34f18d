"""tox inline plugin: let uv see the same local wheel folder pip is configured with.

Machines here carry a CPU build of torch in a local folder that pip knows as
``find-links`` (``PIP_FIND_LINKS`` or pip.conf). uv reads neither, so pass it on
as ``UV_FIND_LINKS`` when the folder exists. Elsewhere nothing changes and uv
takes wheels from the package index.
"""

from __future__ import annotations

import configparser
import os
from pathlib import Path


def _pip_find_links() -> list[str]:
    found = os.environ.get("PIP_FIND_LINKS", "").split()
    for conf in (
        Path("/etc/pip.conf"),
        Path.home() / ".config/pip/pip.conf",
        Path.home() / ".pip/pip.conf",
    ):
        parser = configparser.ConfigParser()
        try:
            parser.read(conf)
        except configparser.Error:
            continue
        found += parser.get("global", "find-links", fallback="").split()
    return [link for link in dict.fromkeys(found) if Path(link).is_dir()]


if "UV_FIND_LINKS" not in os.environ:
    links = _pip_find_links()
    if links:
        os.environ["UV_FIND_LINKS"] = ",".join(links)
