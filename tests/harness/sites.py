"""Every site folder this interpreter reads, for a child started with ``-S``.

``-S`` skips ``site``, so no ``.pth`` line runs there (which is what those tests want: no
start-up hook). The folders must then come on ``PYTHONPATH``, and they are more than
``site.getsitepackages()``: a venv over the system's site-packages, or the GPU leg's overlay,
adds the folders holding torch by ``.pth`` lines of its own.
"""

from __future__ import annotations

import os
import site
import sys
import sysconfig

SITE_SUFFIXES = ("site-packages", "dist-packages")


def site_folders() -> list[str]:
    """This interpreter's site folders, in the order it reads them, without repeats."""
    found = [
        *site.getsitepackages(),
        sysconfig.get_path("purelib"),
        sysconfig.get_path("platlib"),
        *(p for p in sys.path if p.endswith(SITE_SUFFIXES)),
    ]
    return [folder for folder in dict.fromkeys(found) if os.path.isdir(folder)]
