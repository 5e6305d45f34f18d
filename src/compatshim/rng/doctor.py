"""``doctor_rows()``: the RNG adapter and which RNG hazards apply to this install.

Cheap: versions come from installed metadata; no framework is imported.
"""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

from .._engine.versions import installed_version, version_at_least
from .._records import DoctorRow

# accelerate's load_accelerator_state wraps its whole RNG restore in ``except Exception`` and
# logs this at INFO, so a resume that restores no generator looks like one that restored all
ACCELERATE_SWALLOW = "Could not load random states"


def accelerate_swallows_rng_errors() -> bool | None:
    """Whether the installed accelerate's ``checkpointing.py`` holds the swallowing handler.

    Read as text from the installed files (accelerate is never imported); None where
    accelerate is not installed or its file cannot be read.
    """
    try:
        source = metadata.distribution("accelerate").locate_file("accelerate/checkpointing.py")
        text = Path(str(source)).read_text(encoding="utf-8")
    except (metadata.PackageNotFoundError, OSError, UnicodeDecodeError):
        return None
    return "except Exception" in text and ACCELERATE_SWALLOW in text


def accelerate_row() -> DoctorRow | None:
    version = installed_version("accelerate")
    if version is None:
        return None
    swallows = accelerate_swallows_rng_errors()
    return DoctorRow(
        name="rng.accelerate-swallowed-restore",
        kind="hazard",
        applies=True,
        present=swallows,
        fixed=None,  # compatshim does not patch accelerate: reported, never fails the verdict
        detail=(
            f"accelerate {version}: Accelerator.load_state swallows every RNG restore failure "
            f"(logged at INFO: {ACCELERATE_SWALLOW!r}; e.g. a checkpoint from more GPUs, or one "
            "without CUDA states resumed on a GPU machine), so the run goes on with fresh "
            "streams; call compatshim.rng.load(checkpoint_dir) after load_state: it restores "
            "accelerate's random_states_N.pkl and reports (or warns about) what it could not"
            if swallows
            else f"accelerate {version}: no swallowing RNG handler found in "
            "accelerate/checkpointing.py"
        ),
    )


def doctor_rows() -> list[DoctorRow]:
    accelerate = accelerate_row()
    return _torch_rows() + ([accelerate] if accelerate is not None else [])


def _torch_rows() -> list[DoctorRow]:
    torch = installed_version("torch")
    numpy = installed_version("numpy")
    versions = f"torch {torch or 'not installed'}, numpy {numpy or 'not installed'}"
    has_torch = torch is not None
    return [
        DoctorRow(
            name="rng",
            kind="adapter",
            applies=has_torch,
            present=None,
            fixed=None,
            detail=(
                f"compatshim.rng capture/restore/save/load/read ({versions}); reads compatshim, "
                "transformers, accelerate, Lightning and Sana-style RNG files through "
                "compatshim.checkpoint's loader, which runs no code from them"
            ),
        ),
        DoctorRow(
            name="rng.device-count-change",
            kind="hazard",
            applies=has_torch,
            present=has_torch,
            fixed=True if has_torch else None,
            detail=(
                "torch.cuda.set_rng_state_all raises IndexError when a checkpoint holds more "
                "CUDA states than there are GPUs (every torch 2.x); compatshim.rng.restore "
                "restores the matching devices and derives the rest"
            ),
        ),
        DoctorRow(  # numpy state needs numpy to load at all: without it, nothing to refuse
            name="rng.weights-only-numpy",
            kind="hazard",
            applies=has_torch and numpy is not None,
            present=version_at_least(torch, "2.6") if numpy is not None else None,
            fixed=True if has_torch and numpy is not None else None,
            detail=(
                f"torch {torch}: torch.load defaults to weights_only=True from 2.6 and refuses "
                "the numpy RNG state other frameworks store; compatshim files hold plain "
                "tensors, and compatshim.rng.read loads the others with compatshim.checkpoint"
                if has_torch and numpy is not None
                else f"{versions}: no numpy RNG state can be loaded here, by torch or compatshim"
            ),
        ),
        DoctorRow(
            name="rng.numpy-core-rename",
            kind="hazard",
            applies=numpy is not None,
            present=numpy is not None,
            fixed=True if numpy is not None else None,
            detail=(
                f"numpy {numpy}: numpy 2 pickles name numpy._core, numpy 1.x ones numpy.core; "
                "compatshim.rng.read loads both names into the running numpy's objects"
                if numpy is not None
                else "numpy not installed"
            ),
        ),
        DoctorRow(
            name="rng.cuda-state-torch2.0",
            kind="hazard",
            applies=has_torch,
            present=None,
            fixed=True if has_torch else None,
            detail=(
                "CUDA generator states written by torch 2.0 are 816 bytes, 16 from 2.1 on; "
                "compatshim.rng converts them on read"
            ),
        ),
    ]
