"""``save`` / ``read`` / ``load``: RNG files for every rank, written atomically, read safely.

One file holds every rank's state: rank 0 gathers them and writes it, so a
resume under any world size finds all saved ranks in one place. The file is
written to a temporary name in the same folder, fsynced, then renamed over
``path``: a crash mid-save leaves the previous file (or none), never a torn one.
All ranks must see ``path`` (a shared filesystem), as with any checkpoint.
"""

from __future__ import annotations

import errno
import os
import pickle
import re
import uuid
import zipfile
from pathlib import Path
from typing import Any, Callable, Mapping, Union

from .._text import short
from .arguments import check_bool, check_policies, checked_path, checked_position
from .capture import capture, distributed_position
from .errors import RNGStateError
from .formats import merge_ranks, to_file
from .plan import DevicePolicy, WorldSizePolicy
from .restore import restore
from .restore_report import RestoreReport
from .state import MAX_RANK_DIGITS, is_state, make_file

PathLike = Union[str, "os.PathLike[str]"]
_ZIP_MAGIC = b"PK\x03\x04"
_PER_RANK = (
    ("transformers", re.compile(r"rng_state_(\d+)\.pth$")),
    ("accelerate", re.compile(r"random_states_(\d+)\.pkl$")),
)
_TORCH_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C


def _about(path: PathLike, exc: OSError, hint: str = "") -> OSError:
    """``exc`` (raised about the temporary file) as the same OS error about the user's ``path``."""
    strerror = (exc.strerror or type(exc).__name__) + hint
    return type(exc)(exc.errno, strerror, os.fspath(path))


def atomic_write(path: PathLike, write: Callable[[Any], None]) -> None:
    """Call ``write(file)`` on a temporary file beside ``path``, then rename it into place.

    An OS error names ``path``, never the temporary file, and leaves no temporary file.
    """
    target = Path(path)
    if target.is_dir():  # before anything is written: os.replace would refuse it at the end
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), os.fspath(path))
    temporary = target.parent / f".{target.name}.{uuid.uuid4().hex}.tmp"
    # os.open with 0o666 lets the umask decide the mode, as for any file the user writes.
    try:
        handle = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except OSError as exc:
        missing = isinstance(exc, FileNotFoundError) and not target.parent.is_dir()
        hint = f" (no folder {target.parent})" if missing else ""
        raise _about(path, exc, hint) from None
    try:
        with os.fdopen(handle, "wb") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())
        try:
            os.replace(temporary, target)
        except OSError as exc:
            raise _about(path, exc) from None
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    try:
        directory = os.open(target.parent, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(directory)
    except OSError:
        pass
    finally:
        os.close(directory)


def _gather(state: dict[str, Any], target: Path) -> list[tuple[dict[str, Any], str]] | None:
    """Every rank's (state, path) on rank 0 (None elsewhere); ``[(state, path)]`` outside
    distributed runs."""
    rank, world_size = distributed_position()
    if rank is None or world_size is None or world_size == 1:
        return [(state, str(target))]
    import torch.distributed as dist

    gathered: list[Any] | None = [None] * world_size if rank == 0 else None
    dist.gather_object((state, str(target)), gathered, dst=0)
    return gathered


def _paths_differ(gathered: list[tuple[dict[str, Any], str]]) -> str:
    """Why rank 0 must not write, when the ranks named different files ('' when one)."""
    paths = [path for _, path in gathered]
    if len(set(paths)) == 1:
        return ""
    shown = "; ".join(f"rank {rank}: {path}" for rank, path in enumerate(paths[:4]))
    return (
        f"ranks passed different paths ({shown}{'; ...' if len(paths) > 4 else ''}): save() "
        "is collective and rank 0 writes every rank's state into one file; pass the same path "
        "on every rank (load(path) gives each rank its own state), nothing was written"
    )


def save(path: PathLike, *, state: Mapping[str, Any] | None = None) -> Path:
    """Write this process's RNG state, or every rank's when distributed, to ``path``.

    Collective when ``torch.distributed`` is initialised: every rank must call it;
    rank 0 writes the file and all ranks return after it is in place, or raise
    :class:`RNGStateError` naming rank 0's error where it could not write (rank 0
    raises its own); ranks passing different paths all raise it, and nothing is written.
    (Under NCCL, the object collectives need each rank's
    ``torch.cuda.set_device`` first, as any NCCL object collective does.)
    """
    import torch

    target = checked_path(path)
    if state is not None and not isinstance(state, Mapping):
        raise TypeError(
            "state: expected a state dict from compatshim.rng.capture() or None, "
            f"got {short(state)}"
        )
    own = dict(state) if state is not None else capture()
    if not is_state(own):
        raise RNGStateError("save(state=...) takes a state from compatshim.rng.capture()")
    gathered = _gather(own, target)
    rank, world_size = distributed_position()
    collective = rank is not None and world_size is not None and world_size > 1
    failure: BaseException | None = None
    if gathered is not None:
        states = [state for state, _ in gathered]
        payload = make_file(states, source="compatshim", world_size=len(states))
        differ = _paths_differ(gathered)
        try:
            if differ:
                raise RNGStateError(differ)
            atomic_write(target, lambda file: torch.save(payload, file))
        except Exception as exc:  # told to every rank below, then raised here
            if not collective:
                raise
            failure = exc
    if collective:  # rank 0's outcome, not a bare barrier the others would wait at
        import torch.distributed as dist

        told = f"{type(failure).__name__}: {failure}" if failure is not None else None
        outcome = [(isinstance(failure, RNGStateError), told)]
        dist.broadcast_object_list(outcome, src=0)
        if failure is not None:
            raise failure
        ours, why = outcome[0]
        if ours:  # compatshim's own refusal on rank 0: the same words here
            raise RNGStateError(str(why).removeprefix("RNGStateError: "))
        if why is not None:
            raise RNGStateError(f"rank 0 could not write {target}: {why}")
    return target


def _load_object(path: Path, trusted: bool) -> Any:
    """The file's object: compatshim.checkpoint's weights-only loader unless ``trusted``."""
    with path.open("rb") as file:
        is_zip = file.read(4) == _ZIP_MAGIC
        is_torch_file = is_zip or _is_legacy_torch(file)
    found = _load_unchecked(path, trusted, is_torch_file)
    if is_zip:  # after the loader accepted it: its checks (no compressed or overlapping
        _check_crcs(path)  # records) come before zipfile reads any record
    return found


def _load_unchecked(path: Path, trusted: bool, is_torch_file: bool) -> Any:
    from ..checkpoint import CheckpointError, UnsafeCheckpointError
    from ..checkpoint import load as load_checkpoint

    if trusted:
        try:
            if is_torch_file:
                return load_checkpoint(path, map_location="cpu", trusted=True)
            with path.open("rb") as file:
                return pickle.load(file)
        except Exception as exc:
            raise RNGStateError(f"could not read {path}: {type(exc).__name__}: {exc}") from None
    try:
        return load_checkpoint(path, map_location="cpu")
    except UnsafeCheckpointError as exc:
        raise RNGStateError(f"refused to load {exc}") from None
    except CheckpointError as exc:
        raise RNGStateError(f"{path} is not a readable RNG file: {exc}") from None


def _check_crcs(path: Path) -> None:
    """Every zip record against its CRC32, which neither torch's reader nor
    compatshim.checkpoint.load checks: a flipped bit in a saved key would otherwise be
    restored as if saved, and reported exact. One more pass over the file's bytes."""
    try:
        with zipfile.ZipFile(path) as archive:
            damaged = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
        raise RNGStateError(f"{path} is not a readable RNG file: {exc}") from None
    if damaged is not None:
        raise RNGStateError(
            f"{path} is damaged: zip record {short(damaged)} fails its CRC32 check (the bytes "
            "changed after torch.save wrote them); restore from another copy of the checkpoint"
        )


def _is_legacy_torch(file: Any) -> bool:
    file.seek(0)
    head = file.read(32)
    return head[:2] == b"\x80\x02" and _TORCH_LEGACY_MAGIC.to_bytes(10, "little") in head


def _rank_number(digits: str, name: str) -> int:
    if len(digits) > MAX_RANK_DIGITS:
        raise RNGStateError(f"{name}: rank number {digits[:20]} is not a plausible rank")
    return int(digits)


def _rank_from_name(name: str) -> tuple[str, int] | None:
    for source, pattern in _PER_RANK:
        match = pattern.search(name)
        if match:
            return source, _rank_number(match.group(1), name)
    return None


def _first_missing(indexed: dict[int, Path], limit: int = 10) -> list[int]:
    """Up to ``limit`` rank numbers absent below the highest one (no range is materialised)."""
    missing: list[int] = []
    rank = 0
    while len(missing) < limit and rank < max(indexed):
        if rank not in indexed:
            missing.append(rank)
        rank += 1
    return missing


def _read_directory(folder: Path, trusted: bool) -> dict[str, Any]:
    for source, pattern in _PER_RANK:
        indexed: dict[int, Path] = {}
        for child in sorted(folder.iterdir()):
            match = pattern.fullmatch(child.name)
            if not match:
                continue
            rank = _rank_number(match.group(1), str(child))
            if rank in indexed:  # rng_state_0.pth and rng_state_00.pth: neither framework pads
                raise RNGStateError(
                    f"{folder}: two files for rank {rank}: {short(indexed[rank].name, 80)} and "
                    f"{short(child.name, 80)}; transformers and accelerate write one, unpadded "
                    "(rng_state_0.pth): remove the one that is not this checkpoint's"
                )
            indexed[rank] = child
        if not indexed:
            continue
        if max(indexed) + 1 != len(indexed):
            missing = _first_missing(indexed)
            raise RNGStateError(
                f"{folder}: {source} rank files missing for ranks {missing}"
                + (" and more" if len(missing) == 10 else "")
                + f" (highest rank file: {max(indexed)}, {len(indexed)} files)"
            )
        files = [read(indexed[r], trusted=trusted) for r in sorted(indexed)]
        return merge_ranks(files, source, [indexed[r].name for r in sorted(indexed)])
    single = folder / "rng_state.pth"
    if single.is_file():  # read() says its world size: 1 unless a file of every rank
        return read(single, trusted=trusted)
    raise RNGStateError(
        f"{folder} has no RNG files: looked for rng_state_N.pth / rng_state.pth (transformers) "
        "and random_states_N.pkl (accelerate); pass a file path for other layouts"
    )


def read(path: PathLike, trusted: bool = False) -> dict[str, Any]:
    """Read an RNG file of any supported format into a compatshim file dict; restores nothing.

    ``path`` is a compatshim file, a transformers / accelerate / Lightning / Sana
    file or checkpoint, or a checkpoint folder of per-rank files. Without
    ``trusted=True`` the file is read by ``compatshim.checkpoint.load`` (weights-only,
    runs no code from it); ``trusted=True`` allows a full unpickle (only for files
    you trust completely).
    """
    target = checked_path(path)
    check_bool("trusted", trusted)
    if target.is_dir():
        return _read_directory(target, trusted)
    if not target.is_file():
        raise RNGStateError(f"no RNG file at {target}")
    obj = _load_object(target, trusted)
    per_rank = _rank_from_name(target.name)
    found = to_file(obj, saved_rank=per_rank[1] if per_rank else None, what=str(target))
    if per_rank is None and target.name == "rng_state.pth" and found.get("world_size") is None:
        # transformers writes rng_state.pth only for a single process
        return make_file(found["ranks"], source=found["source"], world_size=1)
    return found


def load(
    path: PathLike,
    *,
    trusted: bool = False,
    rank: int | None = None,
    world_size: int | None = None,
    on_device_mismatch: DevicePolicy = "derive",
    on_world_size_mismatch: WorldSizePolicy = "derive",
    warn: bool = True,
) -> RestoreReport:
    """``read(path)`` then ``restore`` for this rank; returns what was restored and derived.

    Every argument is checked before the file is read.
    """
    checked_path(path)
    check_bool("trusted", trusted)
    checked_position(rank, world_size)
    check_policies(on_device_mismatch, on_world_size_mismatch)
    check_bool("warn", warn)
    return restore(
        read(path, trusted=trusted),
        rank=rank,
        world_size=world_size,
        on_device_mismatch=on_device_mismatch,
        on_world_size_mismatch=on_world_size_mismatch,
        warn=warn,
    )
