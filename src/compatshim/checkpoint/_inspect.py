"""``inspect``: what a checkpoint needs and holds, and what ``load`` does with it.

Two reads of the file. First the report, torch-free: the same format reader as ``load``
(``_container``: the same checks of the zip directory, storage ids, legacy layout and
safetensors header), the pickle run symbolically (``_container.ScanMachine``), every global
judged by ``load``'s own gate (``_gate.judge``, without a call's ``allow=``): the allowlist,
the deny list, then the process-wide entries (``compatshim.checkpoint.allow``,
``COMPATSHIM_ALLOW``, ``COMPATSHIM_ALLOW_FILE``, the ``compatshim.allow`` entry points).
A file this read finds dangerous (a denied global, a structure ``load`` refuses whatever is
allowed) is judged here: ``load`` refuses it and nothing can allow it.

Then the verdict: ``load``'s own machine reads the file (the same allowlist, deny list and
budget as ``checkpoint.load``; torch, numpy and omegaconf are imported where the file needs
them) with every storage on ``meta``, so no tensor data is read (a zip file's storages are
made on ``meta``, a safetensors file is mapped, never read; a legacy-format file's storages
are read, as ``load`` reads them, then dropped). What it does is the severity: it loads
(loadable), it refuses only globals an allow entry admits (needs-allow, each named), it
refuses anything else (dangerous: a denied object, a structure refusal, what it builds
being hostile), or the file is no checkpoint it can read (unreadable: raised; a file over the
work budget too, as docs/inspect.md says: no writer makes one, and nothing of it runs).
A DCP folder: its ``.metadata`` as torch reads it hardened, then each non-tensor item of
its ``.distcp`` files as hardened DCP reads it (``torch.load`` of the item's bytes), each
by ``load``'s machine; the folder gets the worst severity.
"""

from __future__ import annotations

import heapq
import io
import json
import os
import shlex
import sys
import zipfile
import zlib
from dataclasses import asdict, dataclass, field, replace
from typing import IO, Any, Iterable, Iterator

from .._settings import SettingError
from .._text import short
from . import _dcp_folder, _limits, _omegaconf, _safetensors, process_allow
from ._container import (
    LEGACY_MAGIC,
    ScanMachine,
    ScanResult,
    ZipDirectory,
    describe_source,
    open_regular,
    plain_text,
    read,
    read_legacy,
    read_record,
    read_zip_directory,
    sniff,
)
from ._dcp_folder import DcpInfo
from ._dtypes import BY_TORCH
from ._expand import transformed
from ._gate import ALLOWLIST, Verdict, judge, not_rebuilt
from ._machine import Source
from ._names import RESOLVER, parse
from .allowlist import numpy_core
from .errors import CheckpointError, UndecodableTextError, UnsafeCheckpointError

MAX_GLOBALS = 200  # globals a report lists by name; the rest are counted (see _uses)

# What a file is to its user, worst last; ``compatshim inspect``/``scan`` exit with its code
# (scan: the worst file's, so the highest). docs/inspect.md says what each means.
LOADABLE, NEEDS_ALLOW, UNREADABLE, DANGEROUS = (
    "loadable",  # load (or, for a DCP folder, torch.distributed.checkpoint) reads it
    "needs-allow",  # load refuses only globals an allow entry admits: named, with the line
    "unreadable",  # damaged, not a checkpoint, a folder without .metadata, an OS error
    "dangerous",  # load refuses what nothing can allow: treat the file as an attack
)
SEVERITIES = (LOADABLE, NEEDS_ALLOW, UNREADABLE, DANGEROUS)
EXIT_CODES = {LOADABLE: 0, NEEDS_ALLOW: 1, UNREADABLE: 2, DANGEROUS: 3}


def worst(*severities: str) -> str:
    """The severity with the highest exit code."""
    return max(severities, key=EXIT_CODES.__getitem__)


def allow_code(name: str, split: tuple[str, str] | None = None) -> str | None:
    """The one line that admits ``name`` for one call; None where no plain line is offered.

    ``split``: the ``(module, name)`` the pickle writes (default: at the last dot). Offered
    for a global whose name holds no dot, every part a Python identifier; a nested class
    is advised as its object (a dotted string names it too, read through ``vars()``, but
    the object says which one without doubt).
    """
    module, attr = split if split is not None else name.rpartition(".")[::2]
    if not module or "." in attr or f"{module}.{attr}" != name:
        return None
    if not all(part.isidentifier() for part in name.split(".")):
        return None
    return f"compatshim.checkpoint.load(path, allow=[{json.dumps(name)}])"


def process_lines(name: str, split: tuple[str, str] | None = None) -> tuple[str, ...]:
    """The lines that admit ``name`` for every load in the process (torch.load too), one a
    source: code, ``COMPATSHIM_ALLOW``, ``COMPATSHIM_ALLOW_FILE``, an entry point. Empty
    where a string cannot name it; the environment, file and entry point forms only for
    names those sources accept (ASCII ``module.name``)."""
    if allow_code(name, split) is None:
        return ()
    from .. import _settings

    quoted = json.dumps(name)
    lines = [f'compatshim.checkpoint.allow({quoted}, reason="...")']
    try:
        parse(name, "name", strict=True)
    except _settings.SettingError:
        return tuple(lines)
    return (
        *lines,
        f"{_settings.ALLOW}={name}",
        f"{name}  # reason   (a line of the file {_settings.ALLOW_FILE} names)",
        f"[{process_allow.GROUP}] entry point returning [{quoted}]",
    )


@dataclass(frozen=True)
class GlobalUse:
    """One ``module.name`` the pickle refers to; ``entry`` is the allowlist entry covering it.

    For a global not covered: ``dangerous`` says why it is denied (``deny.py``: no allow
    source can admit it) or reached through getattr, else ``allow``
    is the code that would admit it for one call (None for a name that is not a dotted
    Python name, which nothing can define) and ``allow_everywhere`` the lines that admit
    it for every load in the process, one a source. ``allowed_by`` names the
    process-wide entry (source and reason) that admits a global the allowlist does not
    cover here, as it admits it for ``load``.
    """

    name: str
    count: int
    entry: str | None
    kind: str | None
    note: str | None = None
    dangerous: str | None = None
    allow: str | None = None
    allowed_by: str | None = None
    allow_everywhere: tuple[str, ...] = ()

    @property
    def covered(self) -> bool:
        return (self.entry is not None and self.note is None) or self.allowed_by is not None


@dataclass(frozen=True)
class Writer:
    """What the file tells about the software that wrote it."""

    pickle_protocol: int | None = None
    archive_version: str | None = None
    format_version: str | None = None
    byteorder: str | None = None
    storage_alignment: str | None = None
    numpy_major: int | None = None
    torch: str | None = None


@dataclass(frozen=True)
class NamedTensor:
    """A tensor a safetensors header lists; dtype is torch's name where torch has one."""

    name: str
    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class CheckpointInfo:
    """What :func:`inspect` found; ``as_dict()`` for JSON."""

    path: str
    container: str
    globals: tuple[GlobalUse, ...]
    tensors: int
    storages: int
    tensor_bytes: int
    dtypes: dict[str, int]
    writer: Writer
    refusals: tuple[str, ...] = field(default_factory=tuple)
    named_tensors: tuple[NamedTensor, ...] = field(default_factory=tuple)  # safetensors only
    metadata: dict[str, str] | None = None  # safetensors' __metadata__
    dcp: DcpInfo | None = None  # a torch.distributed.checkpoint folder (_dcp_folder.py)
    # distinct globals past MAX_GLOBALS: counted, not listed; of them not covered; denied
    globals_omitted: int = 0
    unknown_omitted: int = 0
    dangerous_omitted: int = 0
    severity: str = LOADABLE  # what load does with it (the module docstring): SEVERITIES
    needs_allow: tuple[str, ...] = ()  # what load refused that an allow entry admits

    @property
    def unknown(self) -> tuple[str, ...]:
        """Listed globals compatshim does not cover here (with the reason in ``globals``);
        ``unknown_omitted`` more past the list's cap."""
        return tuple(g.name for g in self.globals if not g.covered)

    @property
    def loadable(self) -> bool:
        """Whether ``load`` reads it (a DCP folder: torch.distributed.checkpoint, hardened)."""
        return self.severity == LOADABLE

    @property
    def dangerous(self) -> tuple[str, ...]:
        """Listed globals no allow source can admit (denied; ``dangerous_omitted`` more)."""
        return tuple(g.name for g in self.globals if g.dangerous)

    @property
    def loaded_by(self) -> str:
        """What reads it: ``compatshim.checkpoint.load`` takes files, a DCP folder is torch's,
        an ``.npy``/``.npz`` numpy's (its pickles read by compatshim, hardened)."""
        if self.container == "dcp":
            return "torch.distributed.checkpoint.load (.metadata read by compatshim, hardened)"
        if self.container in ("npy", "npz"):
            return "numpy.load(allow_pickle=True) with COMPATSHIM_SAFE_LOAD=1 (hardened)"
        return "compatshim.checkpoint.load"

    def as_dict(self) -> dict[str, Any]:
        found = asdict(self)
        found["unknown"] = list(self.unknown)
        found["dangerous"] = list(self.dangerous)
        found["loadable"] = self.loadable
        found["severity"] = self.severity
        found["exit_code"] = EXIT_CODES[self.severity]
        found["loaded_by"] = self.loaded_by
        found["error"] = None
        return found


def _use(
    name: str, count: int, verdict: Verdict, split: tuple[str, str] | None = None
) -> GlobalUse:
    entry = verdict.entry
    if verdict.source == ALLOWLIST and entry is not None:
        return GlobalUse(name, count, entry.qualname, entry.kind)
    allowed_by = verdict.allowed
    plain = verdict.dangerous is None and allowed_by is None and not verdict.absent
    return GlobalUse(
        name,
        count,
        None if entry is None else entry.qualname,
        None if entry is None else entry.kind,
        verdict.note,
        dangerous=verdict.dangerous,
        allow=allow_code(name, split) if plain else None,
        allowed_by=None if allowed_by is None else f"{allowed_by.source} ({allowed_by.reason})",
        allow_everywhere=process_lines(name, split) if plain else (),
    )


def _uses(found: ScanResult) -> tuple[tuple[GlobalUse, ...], list[int]]:
    """The globals listed (at most :data:`MAX_GLOBALS`, by name) and the counts of those
    that are not: ``[omitted, of them not covered, of them denied]``.

    Every global is judged, as ``load`` judges it (less a call's ``allow=``); those listed
    are the first by rank (denied, not covered, omegaconf's, the rest), then by name, so
    what decides the verdict is shown first. The report and its memory stay a constant
    size however many globals a file names (a 2.4 MB file names 120 000)."""
    tally = [0, 0, 0, 0]

    def ranked() -> Iterator[tuple[int, str, Verdict]]:
        for name in found.globals:
            module, _, attr = name.rpartition(".")
            verdict = judge(module, attr, None, name in found.reached)
            entry = verdict.entry
            built = name in _omegaconf.CLASSES or (
                entry is not None and entry.qualname in _omegaconf.CLASSES
            )
            rank = 0 if verdict.dangerous else 1 if not verdict.admitted else 2 if built else 3
            tally[rank] += 1
            yield rank, name, verdict

    chosen = heapq.nsmallest(MAX_GLOBALS, ranked())  # names are distinct: verdicts never compared
    for rank, _, _ in chosen:
        tally[rank] -= 1
    uses = tuple(
        _use(name, found.globals[name], verdict, found.split.get(name))
        for _, name, verdict in sorted(chosen, key=lambda chose: chose[1])
    )
    return uses, [sum(tally), tally[0] + tally[1], tally[0]]


def _numpy_major(names: list[str]) -> int | None:
    """The numpy major whose core module spelling the file's globals use (the newest seen)."""
    majors = [core[0] for core in map(numpy_core, names) if core is not None]
    return max(majors, default=None)


def _torch_hint(directory: ZipDirectory | None, container: str) -> str | None:
    if container == "legacy":
        return "torch.save(..., _use_new_zipfile_serialization=False) (legacy format)"
    if directory is None:
        return None
    if container == "torchscript":  # torch.jit.save's records differ from torch.save's
        return "torch.jit.save (which torch release is not recorded)"
    if ".format_version" in directory.records:
        return "torch >= 2.6 (has .format_version)"
    if "byteorder" in directory.records:  # first written by 2.1 (2.0.1 and 1.13.1 do not)
        return "torch 2.1 .. 2.5 (byteorder record, no .format_version)"
    return "torch < 2.1 (no byteorder record)"


def _record_text(file: IO[bytes], directory: ZipDirectory, name: str, what: str) -> str | None:
    record = directory.records.get(name)
    if record is None or record.size > 64:
        return None
    return read_record(file, record, what).decode("ascii", "replace").strip()


def _scan(data: IO[bytes], container: str | None) -> tuple[Any, ScanResult]:
    machine = ScanMachine(Source(data), container)
    value = machine.run()
    return value, machine.found


def _from_zip(file: IO[bytes], what: str) -> CheckpointInfo:
    directory = read_zip_directory(file, what)
    refusals: list[str] = []
    if directory.is_torchscript:
        refusals.append("TorchScript archive (torch.jit.save): never loaded")
    found = ScanResult()
    if "data.pkl" in directory.records and not directory.is_torchscript:
        _, found = _scan(io.BytesIO(read_record(file, directory.records["data.pkl"], what)), "zip")
    for decl in found.storages.values():
        directory.storage_record(decl, what)
    container = "torchscript" if directory.is_torchscript else "zip"
    writer = Writer(
        pickle_protocol=found.protocol or None,
        archive_version=_record_text(file, directory, "version", what)
        or _record_text(file, directory, ".data/version", what),
        format_version=_record_text(file, directory, ".format_version", what),
        byteorder=_record_text(file, directory, "byteorder", what),
        storage_alignment=_record_text(file, directory, ".storage_alignment", what),
        numpy_major=_numpy_major(list(found.globals)),
        torch=_torch_hint(directory, container),
    )
    return _info(what, container, found, writer, refusals)


def _from_pickle(file: IO[bytes], what: str) -> CheckpointInfo:
    value, found = _scan(file, None)
    container = "pickle"
    if type(value) is int and value == LEGACY_MAGIC:
        found, container = read_legacy(file).found, "legacy"
    writer = Writer(
        pickle_protocol=found.protocol or None,
        numpy_major=_numpy_major(list(found.globals)),
        torch=_torch_hint(None, container),
    )
    return _info(what, container, found, writer, [])


def _from_safetensors(file: IO[bytes], what: str) -> CheckpointInfo:
    header = _safetensors.read_header(file)
    entries = header.entries
    dtypes: dict[str, int] = {}
    for e in entries:
        dtypes[e.torch_dtype] = dtypes.get(e.torch_dtype, 0) + 1
    return CheckpointInfo(
        path=what,
        container="safetensors",
        globals=(),
        tensors=len(entries),
        storages=len(entries),
        tensor_bytes=header.data_size,
        dtypes=dict(sorted(dtypes.items())),
        writer=Writer(),
        named_tensors=tuple(NamedTensor(e.name, e.torch_dtype, e.shape) for e in entries),
        metadata=header.metadata,
    )


def _info(
    what: str, container: str, found: ScanResult, writer: Writer, refusals: list[str]
) -> CheckpointInfo:
    for kind, count in sorted(found.persistent_kinds.items()):
        if kind != "storage":
            refusals.append(f"persistent id {kind!r} x{count} (only storages are loaded)")
        elif container == "pickle":
            refusals.append("storage references in a plain pickle")
    uses, (omitted, unknown, dangerous) = _uses(found)
    return CheckpointInfo(
        path=what,
        container=container,
        globals=uses,
        tensors=sum(found.tensor_dtypes.values()),
        storages=len(found.storages),
        tensor_bytes=sum(d.nbytes for d in found.storages.values()),
        dtypes=dict(sorted(found.tensor_dtypes.items())),
        writer=writer,
        refusals=tuple(refusals + found.problems),
        globals_omitted=omitted,
        unknown_omitted=unknown,
        dangerous_omitted=dangerous,
    )


def inspect(f: Any) -> CheckpointInfo:
    """See the module docstring; raises CheckpointError for a file the format reader finds
    damaged or no checkpoint (unreadable) and OSError for a path it cannot open. A file
    this install cannot read is reported, unreadable."""
    if not isinstance(f, (str, os.PathLike)) and not all(
        hasattr(f, name) for name in ("read", "seek", "tell")
    ):
        raise TypeError(f"f: expected a path or a seekable binary file object, got {short(f)}")
    if _dcp_folder.is_folder(f):
        return _inspect_folder(f)
    if isinstance(f, (str, os.PathLike)) and os.path.isdir(f):
        raise CheckpointError(_not_a_checkpoint_folder(os.fspath(f)))
    if isinstance(f, (str, os.PathLike)) and os.fspath(f).lower().endswith(NUMPY_FILES):
        return _inspect_numpy(os.fspath(f))
    start = None if isinstance(f, (str, os.PathLike)) else f.tell()
    try:
        info = read(f, _headers)
    except UnsafeCheckpointError as exc:  # the format reader's refusal: load's too
        return _refused(f, exc)
    except CheckpointError:  # damage; yet load may refuse the file before it reaches it
        error = _load(f, start)
        if isinstance(error, UnsafeCheckpointError):
            return _refused(f, error)
        raise  # unreadable (load meets the damage too, or, reading less, misses it)
    if info.severity == DANGEROUS:
        return info  # load refuses it too, and nothing can allow it
    read_data = info.container == "legacy" or any(use.entry == SPARSE for use in info.globals)
    return _judged(info, _load(f, start, info.container == "safetensors", read_data))


SPARSE = "torch._utils._rebuild_sparse_tensor"
"""load checks a sparse tensor's indices against its size: a file holding one is read with
its tensor data (on meta there is nothing to check)."""


def _load(
    f: Any, start: int | None, safetensors: bool = False, read_data: bool = False
) -> CheckpointError | None:
    """What ``checkpoint.load`` raises on ``f`` (None: it loads): every storage on meta, so
    no tensor data is read, but where ``read_data``: a file holding a sparse tensor
    (:data:`SPARSE`), and a legacy-format file (load reads its storages whatever the
    target, and a view of a storage cannot be cut on meta); a safetensors path is mapped by
    ``load``'s reader, never read."""
    from .request import Request
    from .request import read as read_request

    if start is not None:
        f.seek(start)
    where, mapped = ("cpu" if read_data else "meta"), safetensors and start is None
    try:
        read_request(f, Request(where, mmap=mapped))
    except CheckpointError as exc:
        return exc
    return None


def _allowable(name: str, listed: dict[str, GlobalUse]) -> bool:
    """Whether an allow entry admits ``name`` (a refused global, or an omegaconf resolver's
    ``omegaconf-resolver:NAME``): named, not denied, not reached through getattr."""
    if name.startswith(RESOLVER):
        try:
            parse(name, "refused", strict=True)
        except SettingError:
            return False  # a resolver whose name the config computes: nothing vouches for it
        return True
    use = listed.get(name)
    if use is not None:
        return not use.covered and use.dangerous is None
    verdict = _verdict(name)
    return verdict is not None and verdict.dangerous is None and not verdict.admitted


def _verdict(name: str) -> Verdict | None:
    """The gate's verdict on a refused ``name``; None for an operation or a structure ("BUILD
    on a dict"), which is no global."""
    module, _, attr = name.rpartition(".")
    if not module or not all(part.isidentifier() for part in name.split(".")):
        return None
    return judge(module, attr)


def severity_of(error: CheckpointError | None, listed: dict[str, GlobalUse]) -> str:
    """The severity of ``load``'s outcome (``listed``: the report's globals by name): None
    (it loads); an error that is no refusal (damage torch's reader or the machine meets, text
    this install cannot decode, a newer torch's fields, a dtype this torch lacks, no torch:
    unreadable here, not an attack); a refusal of globals an allow entry admits
    (needs-allow); any other refusal (dangerous: what the pickle builds or asks for is
    refused whatever is allowed)."""
    if error is None:
        return LOADABLE
    if isinstance(error, UndecodableTextError) or not isinstance(error, UnsafeCheckpointError):
        return UNREADABLE
    refused = getattr(error, "refused", ())
    verdicts = [_verdict(name) for name in refused]
    if any(v is not None and v.absent for v in verdicts):  # no torch installed: no allow
        return UNREADABLE  # entry makes it load here (the file's own classes or not)
    if not_rebuilt(refused) and not any(v is not None and v.dangerous for v in verdicts):
        return UNREADABLE  # quantized, DTensor: no allow entry makes it load
    if refused and all(_allowable(name, listed) for name in refused):
        return NEEDS_ALLOW
    return DANGEROUS


def _judged(info: CheckpointInfo, error: CheckpointError | None) -> CheckpointInfo:
    """``info`` with the severity of what ``load`` did (``error``: its refusal, None: loads)."""
    listed = {use.name: use for use in info.globals}
    severity = severity_of(error, listed)
    if severity == LOADABLE:
        return replace(info, severity=LOADABLE, needs_allow=())
    refused = getattr(error, "refused", ())
    unknown = [n for n in info.unknown if not listed[n].dangerous]
    if severity == NEEDS_ALLOW:
        unknown += refused
    verdicts = {name: _verdict(name) for name in (*unknown, *refused)}  # each judged once
    absent = [v for v in map(verdicts.__getitem__, refused) if v and v.absent]
    unknown = [n for n in unknown if not ((v := verdicts[n]) is not None and v.absent)]
    refusal = str(error).removeprefix(f"{info.path}: ")
    if absent and absent[0].entry is not None:  # say first what no allow entry mends
        needed = absent[0].entry.distribution or absent[0].entry.module.partition(".")[0]
        refusal = f"{needed} is not installed here ({absent[0].name} needs it): {refusal}"
    return replace(info, severity=severity, needs_allow=tuple(dict.fromkeys(unknown)),
                   refusals=(*info.refusals, refusal))  # fmt: skip


def _refused(f: Any, exc: UnsafeCheckpointError) -> CheckpointInfo:
    """The report of a file refused before its pickle could be listed (the format reader's
    refusal, or load's where the file is damaged past it): the denied names, judged."""
    uses = tuple(  # what load refused (a storage type that is os.system): judged by name
        _use(name, 1, judge(*name.rpartition(".")[::2]))
        for name in exc.refused[:MAX_GLOBALS]
        if all(part.isidentifier() for part in name.split("."))
    )
    what = describe_source(f)
    info = CheckpointInfo(what, "other", (), 0, 0, 0, {}, Writer())
    return _judged(replace(info, globals=tuple(u for u in uses if u.dangerous)), exc)


def _not_a_checkpoint_folder(path: str) -> str:
    shards = _dcp_folder.ranks_on_disk(path)[1]
    if shards:
        return (
            f"{path}: a DCP folder without its {_dcp_folder.METADATA} ({len(shards)} .distcp "
            "files): torch.distributed.checkpoint cannot load it (an interrupted save?)"
        )
    return (
        f"{path}: a folder, not a checkpoint file, and no DCP folder (no "
        f"{_dcp_folder.METADATA}); `compatshim scan {shlex.quote(path)}` scans the files in it"
    )


def _inspect_folder(folder: Any) -> CheckpointInfo:
    """``inspect`` of a DCP folder: its ``.metadata``'s globals and verdict, then what it
    lists (FQNs, dtypes, shapes, ranks that wrote it, non-tensor items) and the verdict on
    each non-tensor item, when the ``.metadata`` loads."""
    path = os.fspath(folder)
    info = inspect(os.path.join(path, _dcp_folder.METADATA))
    world_size, files = _dcp_folder.ranks_on_disk(path)
    unread = DcpInfo(world_size, files, (), None)
    if not info.loadable:
        return replace(info, path=path, container="dcp", dcp=unread)
    what = os.path.join(path, _dcp_folder.METADATA)
    try:
        metadata = _dcp_folder.load_folder_metadata(path)
    except UnsafeCheckpointError as exc:  # damage (CheckpointError) is raised, as for a file
        return replace(_judged(info, exc), path=path, container="dcp", dcp=unread)
    found, tensors = _dcp_folder.describe(metadata, what)
    dtypes: dict[str, int] = {}
    size = 0
    for _, dtype, shape in tensors:  # shapes checked by describe: each count <= MAX_ITEMS
        dtypes[dtype] = dtypes.get(dtype, 0) + 1
        known = BY_TORCH.get(dtype)  # an unknown dtype counts no bytes, as before
        size += _limits.count(shape, dtype) * (known.torch_bytes if known is not None else 0)
    info = replace(
        info,
        path=path,
        container="dcp",
        tensors=len(tensors),
        storages=len(found.data_files),
        tensor_bytes=size,
        dtypes=dict(sorted(dtypes.items())),
        named_tensors=tuple(NamedTensor(n, d, s) for n, d, s in tensors),
        dcp=found,
    )
    places = _places(metadata, found.items)
    for key in found.items:
        info = _with_item(info, path, key, places.get(key))
    for problem in _data_problems(path, metadata).values():
        info = _item_result(info, UNREADABLE, problem)
    return info


def _data_problems(folder: str, metadata: Any) -> dict[str, str]:
    """:func:`_dcp_folder.data_problems` of what ``storage_data`` places where."""
    storage = vars(metadata).get("storage_data")
    return _dcp_folder.data_problems(
        folder,
        (
            (fields.get("relative_path"), fields.get("offset"), fields.get("length"))
            for fields in map(vars, storage.values() if type(storage) is dict else ())
            if type(fields.get("relative_path")) is str  # a _StorageInfo's fields, else none
        ),
    )


def _places(metadata: Any, items: tuple[str, ...]) -> dict[str, tuple[str, int, int, Any]]:
    """Where each non-tensor item lies: ``fqn -> (data file, offset, length, transforms)``,
    from ``storage_data`` (each field checked for the type torch writes)."""
    from torch.distributed.checkpoint import filesystem
    from torch.distributed.checkpoint import metadata as md

    wanted = set(items)
    storage = vars(metadata).get("storage_data")
    places = {}
    for index, place in storage.items() if type(storage) is dict else ():
        if type(index) is not md.MetadataIndex or type(place) is not filesystem._StorageInfo:
            continue
        fqn, fields = vars(index).get("fqn"), vars(place)
        file, offset, length = (fields.get(k) for k in ("relative_path", "offset", "length"))
        if (
            type(fqn) is str
            and fqn in wanted
            and type(file) is str
            and type(offset) is int
            and type(length) is int
            and offset >= 0
            and length >= 0
        ):
            places[fqn] = (file, offset, length, fields.get("transform_descriptors"))
    return places


def _with_item(
    info: CheckpointInfo, folder: str, key: str, place: tuple[str, int, int, Any] | None
) -> CheckpointInfo:
    """``info`` with the verdict on the non-tensor item ``key``, read as hardened DCP reads
    it (``torch.load`` of its bytes, by load's machine; tensors on meta): the worst counts."""
    from ..patches.torch_dcp_safe_metadata import _Slice

    label = f"DCP item {short(key, 200)}"
    if place is None:
        return _item_result(info, UNREADABLE, f"{label}: no place in .metadata's storage_data")
    file, offset, length, transforms = place
    label += f" in {short(file, 200)}"
    try:
        with open_regular(os.path.join(folder, file), label) as raw:
            exact = _Slice(raw, offset, length)  # hardened DCP's exact view of the item
            vars(exact)["name"] = label  # what messages call it (io.BufferedReader shows it)
            view: Any = io.BufferedReader(exact)
            if transforms:  # compressed by a DCP extension: read whole, as torch reads it
                view = transformed(view, transforms, length, label)
            item = inspect(view)
    except (CheckpointError, OSError, ValueError) as exc:
        why = plain_text(exc).removeprefix(f"{label}: ")
        return _item_result(info, UNREADABLE, f"{label}: {why}")
    if item.loadable:
        return info
    uses = (u for u in item.globals if not u.covered)  # what it adds to .metadata's
    if item.refusals:
        why = "; ".join(r.removeprefix(f"{label}: ") for r in item.refusals)
    else:
        denied = item.dangerous
        why = f"denied: {', '.join(denied)}" if denied else f"allow: {', '.join(item.needs_allow)}"
    return _merged(info, item, uses, (f"{label}: {why}",))


def _merged(
    info: CheckpointInfo, part: CheckpointInfo, uses: Any, refusals: tuple[str, ...]
) -> CheckpointInfo:
    """``info`` with the verdict on one of its parts (a DCP item, an ``.npz`` member, an
    ``.npy``'s pickle): the worst severity counts; ``uses``, the part's globals to list
    (each once), and ``refusals`` are added, with what the part needs allowed."""
    listed = {use.name for use in info.globals}
    return replace(
        info,
        severity=worst(info.severity, part.severity),
        globals=(*info.globals, *(u for u in uses if u.name not in listed)),
        refusals=(*info.refusals, *refusals),
        needs_allow=tuple(dict.fromkeys((*info.needs_allow, *part.needs_allow))),
    )


def _item_result(info: CheckpointInfo, severity: str, refusal: str) -> CheckpointInfo:
    return replace(info, severity=worst(info.severity, severity),
                   refusals=(*info.refusals, refusal))  # fmt: skip


def _headers(file: IO[bytes], what: str, path: str | None = None) -> CheckpointInfo:
    """The report of the first read (torch-free), severity by what it alone can tell."""
    kind = sniff(file)
    if kind == "zip":
        info = _from_zip(file, what)
    elif kind == "pickle":
        info = _from_pickle(file, what)
    elif kind == "safetensors":
        info = _from_safetensors(file, what)
    elif kind == "tar":
        raise CheckpointError(f"{what}: torch's tar format (torch < 0.4) is not supported")
    else:
        raise CheckpointError(f"{what}: neither a torch zip file nor a pickle")
    if info.dangerous or info.dangerous_omitted or info.refusals:
        return replace(info, severity=DANGEROUS)
    return info  # what is not covered is for load to refuse (needs-allow, or worse)


# ---------------------------------------------------------------- numpy's .npy and .npz
_NPY_MAGIC = b"\x93NUMPY"
_NPY_HEADER_LIMIT = 10_000  # numpy's _MAX_HEADER_SIZE: hardened numpy.load keeps it


def _inspect_numpy(path: str) -> CheckpointInfo:
    """``numpy.load(path, allow_pickle=True)`` as hardened mode reads it (patch
    ``numpy-load-hardened``), told apart by content as numpy.load tells it: an ``.npz`` (zip)
    is each member with the ``.npy`` magic (numpy hands the others back as bytes), an ``.npy``
    is its header (numpy's own reader, held to numpy's header limit) and, for an object
    dtype, its pickle; anything else is a pickle. Each pickle is read by that patch's own
    reader (load's machine, plain object arrays admitted); the worst member counts."""
    try:
        from numpy.lib import format as npy
    except ImportError:
        raise CheckpointError(f"{path}: a numpy file, and numpy is not installed here") from None
    info = CheckpointInfo(path, "npy", (), 0, 0, 0, {}, Writer())
    with open_regular(path, path) as file:
        magic = file.read(6)
        file.seek(0)
        if not magic.startswith((b"PK\x03\x04", b"PK\x05\x06")):  # numpy.load's own test
            return _npy(info, npy, file, path, pickled=magic != _NPY_MAGIC)
        info = replace(info, container="npz")
        try:
            archive = zipfile.ZipFile(file)
        except (zipfile.BadZipFile, ValueError, OSError) as exc:
            raise CheckpointError(f"{path}: not an .npz numpy reads: {plain_text(exc)}") from None
        with archive:
            for member in archive.infolist():
                what = f"{path}: member {short(member.filename, 200)}"
                try:
                    with archive.open(member) as data:
                        info = _npy(info, npy, data, what)
                except CheckpointError:  # some are a ValueError too (undecodable text)
                    raise
                except _MEMBER_DAMAGE as exc:  # what zipfile raises reading it: numpy.load's too
                    raise CheckpointError(f"{what}: not readable: {plain_text(exc)}") from None
    return info


#: what ``zipfile`` raises on a member it cannot read: a bad CRC or header, a compression
#: method it lacks (NotImplementedError), an encrypted member (RuntimeError), damaged deflate
#: data (zlib.error, EOFError)
_MEMBER_DAMAGE = (
    zipfile.BadZipFile,
    zlib.error,
    NotImplementedError,
    RuntimeError,
    EOFError,
    OSError,
    ValueError,
)


def _header_parser(npy: Any, what: str) -> Any:
    """numpy's ``_read_array_header`` (1.x and 2.x alike), read from numpy's own
    ``read_array`` even where hardened mode's entry stands in for it."""
    from ..patches.numpy_load_hardened import _reader

    try:
        parse = _reader(npy).__globals__.get("_read_array_header")
    except LookupError:
        parse = None
    if not callable(parse):
        raise CheckpointError(
            f"{what}: numpy {getattr(sys.modules.get('numpy'), '__version__', '?')}: "
            f"numpy.lib.format.read_array reads no _read_array_header: layout not known"
        )
    return parse


def _npy(
    info: CheckpointInfo, npy: Any, file: IO[bytes], what: str, pickled: bool = False
) -> CheckpointInfo:
    """``info`` with the verdict on the ``.npy`` (or, ``pickled``, the pickle) at ``file``."""
    from ..patches.numpy_load_hardened import one_pickle

    head = file.read(12)
    if not pickled and head[:6] != _NPY_MAGIC:
        if info.container == "npz":
            return info  # numpy.load gives this member's bytes back
        raise CheckpointError(f"{what}: neither an .npy, an .npz nor a pickle")
    if not pickled:
        version = tuple(head[6:8])
        width = 2 if version == (1, 0) else 4
        size = int.from_bytes(head[8 : 8 + width], "little")
        if version not in ((1, 0), (2, 0), (3, 0)) or size > _NPY_HEADER_LIMIT:
            raise CheckpointError(
                f"{what}: an .npy header numpy does not read (format {version}, {size} bytes; "
                f"numpy's limit is {_NPY_HEADER_LIMIT})"
            )
        body = io.BytesIO(head[8:] + file.read(max(0, width + size - len(head) + 8)))
        parse = _header_parser(npy, what)
        try:  # numpy's own parse of at most _NPY_HEADER_LIMIT bytes
            _, _, dtype = parse(body, version)
        except (ValueError, TypeError, SyntaxError) as exc:
            raise CheckpointError(f"{what}: {plain_text(exc)}") from None
        array = replace(info, tensors=info.tensors + 1, dtypes=_counted(info.dtypes, dtype.str))
        if not dtype.hasobject:
            return array  # raw bytes: numpy reads no pickle
        info = array
    else:
        file.seek(0)
    payload = one_pickle(file)
    payload.name = what  # type: ignore[attr-defined]  # what a refusal names
    try:
        found = _from_pickle(payload, what)
    except UnsafeCheckpointError as exc:  # the format reader's refusal: load's too
        found = _refused(payload, exc)
    except CheckpointError as exc:  # damage; yet load may refuse the pickle before reaching it
        error = _numpy_read(payload)
        if isinstance(error, UnsafeCheckpointError):
            found = _refused(payload, error)
        elif pickled:
            why = plain_text(exc).removeprefix(f"{what}: ")
            raise CheckpointError(
                f"{what}: no .npy or .npz (no numpy or zip magic), and damaged as the pickle "
                f"numpy.load(allow_pickle=True) then reads: {why}"
            ) from None
        else:
            raise
    else:
        if found.dangerous or found.dangerous_omitted or found.refusals:
            found = replace(found, severity=DANGEROUS)  # as _headers judges a file
        else:
            found = _judged(found, _numpy_read(payload))
    if not info.writer.pickle_protocol:
        info = replace(info, writer=found.writer)
    refusals = tuple(f"{what}: {r.removeprefix(what + ': ')}" for r in found.refusals)
    return _merged(info, found, found.globals, refusals)


def _numpy_read(payload: IO[bytes]) -> CheckpointError | None:
    """What hardened ``numpy.load`` raises on the pickle (None: it loads), by its own reader."""
    from ..patches.numpy_load_hardened import _read

    payload.seek(0)
    try:
        _read(payload)
    except CheckpointError as exc:
        return exc
    return None


def _counted(dtypes: dict[str, int], name: str) -> dict[str, int]:
    return {**dtypes, name: dtypes.get(name, 0) + 1}


# ---------------------------------------------------------------- scan: a verdict per path
NUMPY_FILES = (".npy", ".npz")
"""Names :func:`inspect` reads as ``numpy.load(allow_pickle=True)`` does (hardened)."""
SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".pkl", ".pickle", ".safetensors", ".tar", ".metadata",
            *NUMPY_FILES)  # fmt: skip
"""Files a folder walk inspects (a path named on the command line is inspected whatever its
name): torch's, pickle's, safetensors' and numpy's usual names."""


@dataclass(frozen=True)
class Scanned:
    """One path of a scan: the report of :func:`inspect`, or why it could not be read."""

    path: str
    info: CheckpointInfo | None
    error: str | None = None

    @property
    def severity(self) -> str:
        return UNREADABLE if self.info is None else self.info.severity

    def as_dict(self) -> dict[str, Any]:
        """The per-file record of ``scan --json`` (the whole report is ``inspect --json``'s)."""
        info = self.info
        return {
            "path": self.path,
            "severity": self.severity,
            "exit_code": EXIT_CODES[self.severity],
            "container": None if info is None else info.container,
            "dangerous": [] if info is None else list(info.dangerous),
            "needs_allow": [] if info is None else list(info.needs_allow),
            "omitted": 0 if info is None else info.globals_omitted,
            "refusals": [] if info is None else list(info.refusals),
            "error": self.error,
        }


def targets(paths: Iterable[str | os.PathLike[str]]) -> Iterator[str]:
    """What ``scan`` inspects, in order: each path named; in a folder (recursively, links to
    folders not followed, by name, a folder's files before its subfolders), each DCP folder
    as one checkpoint (its ``.distcp`` files are not checkpoints alone), a folder of
    ``.distcp`` files without ``.metadata`` (unreadable), and each file named with one of
    :data:`SUFFIXES`."""
    for named in paths:
        top = os.fspath(named)
        if not os.path.isdir(top) or _dcp_folder.is_folder(top):
            yield top
            continue
        for folder, subfolders, files in os.walk(top):
            subfolders.sort()
            if folder != top and (
                _dcp_folder.METADATA in files or any(n.endswith(".distcp") for n in files)
            ):
                subfolders.clear()
                yield folder
                continue
            if folder == top and any(n.endswith(".distcp") for n in files):
                yield folder  # the .metadata is missing (a DCP folder's own is the case above)
                continue
            for name in sorted(files):
                if name.lower().endswith(SUFFIXES):
                    yield os.path.join(folder, name)


def scan_one(path: str) -> Scanned:
    """:func:`inspect` of one path; a damaged or unreadable one is a result, not an error."""
    try:
        return Scanned(path, inspect(path))
    except (CheckpointError, OSError) as exc:  # the CLI's one line; never a traceback
        return Scanned(path, None, str(exc))
