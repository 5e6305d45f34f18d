"""``doctor_rows()``: the RNG adapter and which RNG hazards apply to this install.

Cheap: versions come from installed metadata; no framework is imported.
"""

from __future__ import annotations

from typing import Any

from .._versions import installed_version


def _at_least(version: str | None, minimum: str) -> bool:
    if version is None:
        return False
    from packaging.version import Version

    return Version(version) >= Version(minimum)


def doctor_rows() -> list[dict[str, Any]]:
    torch = installed_version("torch")
    numpy = installed_version("numpy")
    versions = f"torch {torch or 'not installed'}, numpy {numpy or 'not installed'}"
    return [
        {
            "name": "rng",
            "kind": "adapter",
            "applies": torch is not None,
            "present": None,
            "fixed": None,
            "detail": (
                f"compatshim.rng capture/restore/save/load/read ({versions}); reads compatshim, "
                "transformers, accelerate, Lightning and Sana-style RNG files without running code"
            ),
        },
        {
            "name": "rng.device-count-change",
            "kind": "hazard",
            "applies": torch is not None,
            "present": torch is not None,
            "fixed": True,
            "detail": (
                "torch.cuda.set_rng_state_all raises IndexError when a checkpoint holds more "
                "CUDA states than there are GPUs (every torch 2.x); compatshim.rng.restore "
                "restores the matching devices and derives the rest"
            ),
        },
        {
            "name": "rng.weights-only-numpy",
            "kind": "hazard",
            "applies": torch is not None,
            "present": _at_least(torch, "2.6"),
            "fixed": True,
            "detail": (
                f"torch {torch}: torch.load defaults to weights_only=True from 2.6 and refuses "
                "numpy RNG state other frameworks store; compatshim files hold plain tensors, "
                "and compatshim.rng.read loads the others through a restricted unpickler"
            ),
        },
        {
            "name": "rng.numpy-core-rename",
            "kind": "hazard",
            "applies": numpy is not None,
            "present": numpy is not None,
            "fixed": True,
            "detail": (
                f"numpy {numpy}: numpy 2 pickles name numpy._core, numpy 1.x ones numpy.core; "
                "compatshim.rng.read decodes both without rebuilding numpy objects"
            ),
        },
        {
            "name": "rng.cuda-state-torch2.0",
            "kind": "hazard",
            "applies": torch is not None,
            "present": None,
            "fixed": True,
            "detail": (
                "CUDA generator states written by torch 2.0 are 816 bytes, 16 from 2.1 on; "
                "compatshim.rng converts them on read"
            ),
        },
    ]
