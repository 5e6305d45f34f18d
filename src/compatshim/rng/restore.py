"""``restore()``: plan every write first (pure, validated), then apply all or nothing."""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from .._text import short
from .._warn import warn as warn_at_caller
from . import devices
from .arguments import check_bool, check_policies, check_state, checked_position
from .capture import GENERATOR_LOCK, distributed_position
from .derive import derived_cuda, derived_parts, derived_seed, material_digest, one_capture
from .errors import RNGStateError, RNGStateWarning
from .plan import DevicePolicy, WorldSizePolicy, check_position, plan_devices, plan_rank
from .restore_report import RestoreReport, fingerprint
from .state import (
    FILE_FORMAT,
    STATE_FORMAT,
    Parts,
    SavedFile,
    captured_position,
    is_file,
    is_state,
    parse_file,
    parse_state,
)


@dataclass(frozen=True)
class Environment:
    """What the current process has: the only inputs planning takes from the machine."""

    rank: int = 0
    world_size: int = 1
    cuda: int = 0
    xpu: int = 0
    mps: bool = False
    numpy: bool = True

    @classmethod
    def current(cls, rank: int | None = None, world_size: int | None = None) -> Environment:
        dist_rank, dist_world = distributed_position()
        return cls(
            rank=rank if rank is not None else (dist_rank or 0),
            world_size=world_size if world_size is not None else (dist_world or 1),
            cuda=devices.cuda_count(),
            xpu=devices.xpu_count(),
            mps=devices.mps_available(),
            numpy=devices.numpy_available(),
        )


@dataclass
class RestorePlan:
    """Writes in order (label, value), and the report that applying them earns."""

    writes: list[tuple[str, Any]] = field(default_factory=list)
    report: RestoreReport | None = None


# (parts, source, saved rank, saved world size, notes, derivation digest)
Selected = tuple[Parts, str, Optional[int], Optional[int], list[str], Optional[bytes]]


def _saved(obj: Any) -> SavedFile:
    """``obj`` parsed as a file: a captured state is one rank's file, as ``to_file`` makes it."""
    if is_state(obj):  # parsed once, not through to_file's dict round trip
        parts = parse_state(obj)
        return SavedFile("compatshim", None, captured_position(parts)[0], [parts])
    if isinstance(obj, Mapping) and "format" in obj and not is_file(obj):
        raise RNGStateError(
            f"format is {short(obj['format'])}; expected {STATE_FORMAT!r} (from capture) "
            f"or {FILE_FORMAT!r} (from read)"
        )
    if not is_file(obj):
        from .formats import to_file

        obj = to_file(obj)
    return parse_file(obj)


def _select(obj: Any, env: Environment, policy: WorldSizePolicy) -> Selected:
    """This rank's parts: (parts, source, saved rank, saved world, notes, derivation digest).

    The one place a saved rank is chosen, for ``restore`` of a state and ``load`` of a file.
    """
    saved = _saved(obj)
    check_position(env.rank, env.world_size)
    source, all_parts, saved_rank = saved.source, saved.ranks, saved.saved_rank
    saved_world = saved.world_size
    if saved_world is None and saved_rank is not None:
        return _one_rank(saved, saved_rank, env, policy)
    if saved_world is None:  # one state for the whole job (Sana keeps rank 0's)
        saved_world = 1  # rank 0 restores it
    rank_plan = plan_rank(saved_world, env.rank, env.world_size, policy)
    notes = [rank_plan.reason] if saved_world != env.world_size else []
    if rank_plan.saved_rank is not None:
        return (
            all_parts[rank_plan.saved_rank],
            source,
            rank_plan.saved_rank,
            saved_world,
            notes,
            None,
        )
    digest = material_digest_all(all_parts)
    parts = derived_parts(digest, f"rank:{env.rank}", all_parts[0], env.cuda)
    return parts, source, None, saved_world, notes, digest


def _one_rank(
    saved: SavedFile, saved_rank: int, env: Environment, policy: WorldSizePolicy
) -> Selected:
    """Rank ``saved_rank``'s state alone (a per-rank file, or a ``capture()`` that only rank 0
    kept): restored on that rank, derived on the others, never another rank's stream."""
    parts = saved.ranks[0]
    saved_world = captured_position(parts)[1]  # capture() records it; other writers do not
    notes: list[str] = []
    if saved_world is not None and saved_world != env.world_size:
        if policy == "error":
            raise RNGStateError(
                f"the state was captured in a job of {saved_world} rank(s) but this job has "
                f"{env.world_size}; pass on_world_size_mismatch='derive' to restore it on "
                f"rank {saved_rank} and derive the others"
            )
        notes.append(f"world size changed {saved_world} -> {env.world_size}")
    whole = one_capture(parts)
    held = (
        f"the checkpoint holds saved rank {saved_rank}'s state"
        if whole
        else "the state's generators come from more than one capture(), as when every rank "
        "saves capture() under one key of a torch.distributed.checkpoint (it keeps one rank's "
        "copy of each value; save RNG with compatshim.rng.save instead)"
    )
    replayed = f"rank {saved_rank}'s stream" if whole else "parts of other ranks' streams"
    own = whole and (env.world_size == 1 or saved_rank == env.rank)
    if own and not (notes and policy == "derive_all"):
        return parts, saved.source, saved_rank, saved_world, notes, None
    if policy == "error":
        raise RNGStateError(
            f"{held} and this is rank {env.rank} (restoring it would replay {replayed}); "
            "pass on_world_size_mismatch='derive' to derive this rank's state from it"
        )
    notes.append(f"{held}; rank {env.rank} derived")
    digest = material_digest_all(saved.ranks)
    derived = derived_parts(digest, f"rank:{env.rank}", parts, env.cuda)
    return derived, saved.source, None, saved_world, notes, digest


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def material_digest_all(all_parts: list[Parts]) -> bytes:
    import hashlib

    digest = hashlib.blake2b(digest_size=32)
    for parts in all_parts:
        digest.update(material_digest(parts))
    return digest.digest()


def build_plan(
    obj: Any,
    env: Environment,
    *,
    on_device_mismatch: DevicePolicy = "derive",
    on_world_size_mismatch: WorldSizePolicy = "derive",
) -> RestorePlan:
    """Validate ``obj`` and decide every write for ``env``; touches no generator."""
    parts, source, saved_rank, saved_world, notes, rank_digest = _select(
        obj, env, on_world_size_mismatch
    )
    derived_rank = rank_digest is not None
    plan = RestorePlan()
    restored: list[str] = []
    derived: list[str] = []
    skipped: list[str] = []
    target = derived if derived_rank else restored

    def put(label: str, value: Any) -> None:
        plan.writes.append((label, value))
        target.append(label)

    if parts.python is not None:
        put("python", parts.python)
    else:
        skipped.append("python (not in the state)")
    if parts.numpy is None:
        other = parts.meta.get("numpy_generator")
        if env.numpy and isinstance(other, str):
            skipped.append(f"numpy (bit generator {short(other)}: only MT19937 is restored)")
        elif env.numpy:
            skipped.append("numpy (not in the state)")
    elif not env.numpy:
        skipped.append("numpy (not installed here)")
    else:
        put("numpy", parts.numpy)
    if parts.torch_cpu is not None:
        put("torch_cpu", parts.torch_cpu)
    else:
        skipped.append("torch_cpu (not in the state)")

    new: list[str] = []
    if not parts.cuda and env.cuda:
        # the file never held a CUDA generator (a CPU run): nothing saved is lost, so these are
        # new streams, seeded from the saved material, and the restore stays exact
        digest = rank_digest or material_digest(parts)
        for index in range(env.cuda):
            plan.writes.append(
                (f"cuda:{index}", derived_cuda(derived_seed(digest, f"cuda:{index}")))
            )
            new.append(f"cuda:{index}")
    else:
        cuda = plan_devices("cuda", len(parts.cuda), env.cuda, on_device_mismatch)
        for index in cuda.restore:
            put(f"cuda:{index}", parts.cuda[index])
        device_digest = (rank_digest or material_digest(parts)) if cuda.derive else b""
        for index in cuda.derive:
            seed = derived_seed(device_digest, f"cuda:{index}")
            plan.writes.append((f"cuda:{index}", derived_cuda(seed)))
            derived.append(f"cuda:{index}")
        skipped += [f"cuda:{i} (saved; no such device here)" for i in cuda.skip_saved]
        if len(parts.cuda) != env.cuda:
            notes.append(f"CUDA device count changed {len(parts.cuda)} -> {env.cuda}")

    if not parts.xpu and env.xpu:  # never held; xpu layouts are backend-defined: left as they are
        new += [f"xpu:{i} (left as it is)" for i in range(env.xpu)]
    else:
        xpu = plan_devices("xpu", len(parts.xpu), env.xpu, on_device_mismatch)
        for index in xpu.restore:
            put(f"xpu:{index}", parts.xpu[index])
        skipped += [f"xpu:{i} (no saved state; xpu states are not derived)" for i in xpu.derive]
        skipped += [f"xpu:{i} (saved; no such device here)" for i in xpu.skip_saved]
    if parts.mps is not None and env.mps:
        put("mps", parts.mps)
    elif parts.mps is not None:
        skipped.append("mps (saved; no MPS device here)")
    elif env.mps:
        new.append("mps (left as it is)")

    plan.report = RestoreReport(
        source=source,
        rank=env.rank,
        world_size=env.world_size,
        saved_rank=saved_rank,
        saved_world_size=saved_world,
        restored=tuple(restored),
        derived=tuple(derived),
        skipped=tuple(skipped),
        notes=tuple(notes),
        new=tuple(new),
    )
    return plan


def _value_for(label: str, value: Any) -> Any:
    if label == "numpy":
        return value.as_numpy_tuple()
    return value


def apply_plan(plan: RestorePlan) -> None:
    """Apply every write; if one fails, put back the ones already made and raise."""
    with GENERATOR_LOCK:
        undo: list[tuple[Any, Any]] = []
        for label, value in plan.writes:
            try:
                get, set_ = devices.accessors(label)
                previous = get()
                set_(_value_for(label, value))
            except Exception as exc:
                for setter, old in reversed(undo):
                    with contextlib.suppress(Exception):  # best effort: report the first failure
                        setter(old)
                raise RNGStateError(
                    f"restoring {label} failed ({type(exc).__name__}: {exc}); "
                    "the generators set before it were put back"
                ) from exc
            undo.append((set_, previous))


def restore(
    state: Mapping[str, Any],
    *,
    rank: int | None = None,
    world_size: int | None = None,
    on_device_mismatch: DevicePolicy = "derive",
    on_world_size_mismatch: WorldSizePolicy = "derive",
    warn: bool = True,
) -> RestoreReport:
    """Restore ``state`` (from ``capture``, ``read``, or another framework's RNG dict).

    Same world size and device count: every generator continues bit-identically.
    Accelerator generators of a kind the state never held (a CPU run resumed on a
    GPU machine) are reported as ``new``: seeded from the saved material, no
    warning, and the restore stays ``exact``. Otherwise (``"derive"``, the default)
    ranks and devices present in the save get their saved state and the others a
    deterministic state derived from the saved material and their index, never
    another rank's or device's stream;
    ``"error"`` raises :class:`RNGStateError` with both counts instead;
    ``on_world_size_mismatch="derive_all"`` derives every rank after a resize.
    Everything is validated before any generator is set: on bad input nothing
    changes. One :class:`RNGStateWarning` is issued on any mismatch.
    """
    check_state(state)
    rank, world_size = checked_position(rank, world_size)
    check_policies(on_device_mismatch, on_world_size_mismatch)
    check_bool("warn", warn)
    plan = build_plan(
        state,
        Environment.current(rank, world_size),
        on_device_mismatch=on_device_mismatch,
        on_world_size_mismatch=on_world_size_mismatch,
    )
    apply_plan(plan)
    assert plan.report is not None
    marks = tuple((label, fingerprint(label)) for label, _ in plan.writes)
    plan.report = dataclasses.replace(plan.report, fingerprints=marks)
    if warn and plan.report.mismatch:
        warn_at_caller(  # the user's line, through rng.load too
            "compatshim.rng: the saved and current setup differ\n" + plan.report.summary(),
            RNGStateWarning,
        )
    return plan.report
