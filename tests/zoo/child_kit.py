"""What the zoo's framework jobs share: a poisoned payload and exact digests of saved state.

The jobs run in fresh interpreters: ``timm_job.py`` and ``mmengine_job.py`` from
this folder, the tests' inline scripts through :func:`write_child`, which puts a
copy of this file beside the script (``run_child`` starts a script with its own
folder first on ``sys.path``, as ``python script.py`` does).
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from typing import Any


class Payload:
    """Unpickles as ``os.system("touch MARKER")``: what a poisoned checkpoint does."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def digest(value: Any) -> Any:
    """Tensors as ``[dtype, shape, sha256 of their bytes]``, through dicts, lists and tuples."""
    import torch

    if isinstance(value, torch.Tensor):
        data = value.detach().cpu().contiguous().numpy().tobytes()
        return [str(value.dtype), list(value.shape), hashlib.sha256(data).hexdigest()]
    if isinstance(value, dict):
        return {str(k): digest(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [digest(v) for v in value]
    return value


def write_child(folder: Path, name: str, source: str) -> Path:
    """``source`` as ``folder/name``, with this module beside it for ``import child_kit``."""
    shutil.copyfile(__file__, folder / "child_kit.py")
    script = folder / name
    script.write_text(source)
    return script


# The three ways a user runs a framework (``run_child`` arms and hardens unless told not to).
MODES = {
    "plain": {"COMPATSHIM_AUTO": "0", "COMPATSHIM_SAFE_LOAD": "0"},
    "armed": {"COMPATSHIM_SAFE_LOAD": "0"},
    "hardened": {},
}


def run_modes(folder: Path, name: str, source: str) -> dict[str, Any]:
    """The ``RESULT`` of ``source`` run in each of :data:`MODES`, in ``folder/<mode>``."""
    from tests.checkpoint.test_hardened import run_child

    script = write_child(folder, name, source)
    found = {}
    for mode, env in MODES.items():
        (folder / mode).mkdir()
        found[mode] = run_child(script, str(folder / mode), **env)
    return found
