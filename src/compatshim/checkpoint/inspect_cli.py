"""``compatshim inspect PATH [--json]`` and ``compatshim scan PATH... [--json]``: reports
and their exit codes (docs/inspect.md).

Each path gets a severity (``_inspect.SEVERITIES``: what ``load`` does with it) and the CLI
exits with its code (scan: the worst path's, the highest): 0 loadable; 1 needs-allow (load
refuses only globals an allow entry admits, each named); 2 unreadable (damaged, a budget
bomb included, not a checkpoint, a folder without a DCP .metadata: one reason line on
stderr, never a traceback; argparse's usage errors exit 2 too); 3 dangerous (load refuses
what nothing can allow: a denied global, a hostile structure).
``--json`` prints a record on stdout whatever the outcome.

Every string that comes from the file (global names, zip record names and
text records, tensor names, metadata, error messages quoting them) goes
through :func:`printable` in the human output, so a file cannot move the
cursor, erase lines or reorder text to forge a verdict; ``--json`` is exact.
"""

from __future__ import annotations

import json
import sys
import time
from typing import IO, Sequence

from .._text import escaped
from ._inspect import (
    DANGEROUS,
    EXIT_CODES,
    NEEDS_ALLOW,
    SEVERITIES,
    SUFFIXES,
    UNREADABLE,
    CheckpointInfo,
    Scanned,
    scan_one,
    targets,
)
from .deny import REFUSAL as DENIED


def _size(count: int) -> str:
    """``count`` bytes in binary units (up to EiB: a float overflows only past 2**1084)."""
    units = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")
    step = min(max(count.bit_length() - 1, 0) // 10, len(units) - 1)
    return f"{count} B" if step == 0 else f"{count / (1 << 10 * step):.1f} {units[step]}"


MAX_SHOWN = 200  # characters of one file-derived string
MAX_TENSORS_SHOWN = 50


def printable(text: object, limit: int = MAX_SHOWN) -> str:
    """``text`` cut to ``limit`` characters, :func:`~compatshim._text.escaped` with every
    backslash doubled: safe to print to a terminal, and no escape in it is forged."""
    whole = text if type(text) is str else str(text)  # str, int or our own exception
    shown = escaped(whole[:limit], backslash=True)
    return shown + (f"...({len(whole)} characters)" if len(whole) > limit else "")


def _tensor_lines(info: CheckpointInfo) -> list[str]:
    lines = []
    for tensor in info.named_tensors[:MAX_TENSORS_SHOWN]:
        shape = "x".join(map(str, tensor.shape)) or "scalar"
        lines.append(f"    {printable(tensor.name)}: {printable(tensor.dtype, 40)} [{shape}]")
    if len(info.named_tensors) > MAX_TENSORS_SHOWN:
        lines.append(f"    ... and {len(info.named_tensors) - MAX_TENSORS_SHOWN} more (--json)")
    metadata = list((info.metadata or {}).items())
    for key, value in metadata[:MAX_TENSORS_SHOWN]:  # a header may hold millions
        lines.append(f"  metadata {printable(key, 80)}: {printable(value)}")
    if len(metadata) > MAX_TENSORS_SHOWN:
        lines.append(f"  ... and {len(metadata) - MAX_TENSORS_SHOWN} more metadata (--json)")
    return lines


def _global_lines(info: CheckpointInfo) -> list[str]:
    lines = []
    for use in info.globals:
        name = printable(use.name)
        if use.allowed_by is not None:
            lines.append(
                f"    {name} x{use.count}: allowed process-wide by "
                f"{printable(use.allowed_by, 2 * MAX_SHOWN)}"
            )
            continue
        if use.covered:
            lines.append(f"    {name} x{use.count}: covered by {use.kind} entry")
            continue
        if use.dangerous:  # on the deny list: not "unknown", and no allow line
            lines.append(f"    {name} x{use.count}: {DENIED}: {use.dangerous}")
            continue
        lines.append(f"    {name} x{use.count}: UNKNOWN: {printable(use.note)}")
        if use.allow:
            if info.loaded_by == "compatshim.checkpoint.load":  # the others take no allow=
                lines.append(
                    f"      to allow it for one call: {printable(use.allow, 2 * MAX_SHOWN)}"
                )
            lines.append("      for every load in the process (torch.load too), one of:")
            for line in use.allow_everywhere:
                lines.append(f"        {printable(line, 2 * MAX_SHOWN)}")
        elif use.entry is not None:  # allow-listed; its distribution is not installed here
            lines.append("      allow-listed where its distribution is installed: install it")
        elif "." in use.name and all(p.isidentifier() for p in use.name.split(".")):
            lines.append(
                "      a nested name: allow the object itself (allow=[Outer.Inner] or "
                "compatshim.checkpoint.allow(Outer.Inner, reason=...)): it says which one "
                "without doubt (a dotted string names it too)"
            )
        else:
            lines.append("      not a Python name: no module defines it, nothing can allow it")
    if info.globals_omitted:
        lines.append(
            f"    ... and {info.globals_omitted} more, not listed ({info.unknown_omitted} "
            f"not covered, {info.dangerous_omitted} of them denied)"
        )
    return lines


def _dcp_lines(info: CheckpointInfo) -> list[str]:
    """A DCP folder: who wrote it, its tensors, its non-tensor items (then .metadata's pickle)."""
    found = info.dcp
    if found is None:
        return []
    ranks = "unknown" if found.world_size is None else str(found.world_size)
    lines = [
        f"  saved by {ranks} rank(s): {len(found.data_files)} data files"
        + (f", DCP format {printable(found.version, 40)}" if found.version else ""),
        *_tensor_lines(info),
    ]
    items = ", ".join(printable(name, 80) for name in found.items[:MAX_TENSORS_SHOWN])
    more = (
        f" and {len(found.items) - MAX_TENSORS_SHOWN} more"
        if len(found.items) > MAX_TENSORS_SHOWN
        else ""
    )
    lines.append(f"  non-tensor items ({len(found.items)}): {items or '-'}{more}")
    lines.append("  .metadata:")
    return lines


def render(info: CheckpointInfo) -> str:
    w = info.writer
    dtypes = ", ".join(f"{printable(k, 40)} x{v}" for k, v in info.dtypes.items())
    tensors = (
        "  tensors: not counted (a TorchScript archive is never unpickled)"
        if info.container == "torchscript"
        else f"  arrays: {info.tensors}" + (f" ({dtypes})" if dtypes else "")
        if info.container in ("npy", "npz")
        else f"  tensors: {info.tensors} in {info.storages} storages, {_size(info.tensor_bytes)}"
        + (f" ({dtypes})" if dtypes else "")
    )
    lines = [f"{printable(info.path, 1000)}: {info.container}", tensors]
    if info.container == "safetensors":
        lines += _tensor_lines(info)
        lines.append("  globals: none (safetensors holds no pickle)")
    else:
        lines += _dcp_lines(info)
        lines += [
            "  writer: "
            + (f"pickle protocol {w.pickle_protocol}" if w.pickle_protocol else "no pickle read")
            + (f", archive version {printable(w.archive_version)}" if w.archive_version else "")
            + (f", byteorder {printable(w.byteorder)}" if w.byteorder else "")
            + (f", {w.torch}" if w.torch else "")
            + (f", numpy {w.numpy_major}.x names" if w.numpy_major else ""),
            f"  globals ({len(info.globals) + info.globals_omitted}):",
            *_global_lines(info),
        ]
    for refusal in info.refusals:
        lines.append(f"  REFUSED: {printable(refusal, 2 * MAX_SHOWN)}")
    verdict = f"loadable by {info.loaded_by}" if info.loadable else "NOT loadable as is"
    if info.severity == DANGEROUS and info.container == "torchscript":
        lines.append(
            "  DANGEROUS: a TorchScript archive holds code, which torch.jit.load runs: load "
            "it only from a source you trust, with torch.jit.load"
        )
    elif info.severity == DANGEROUS:
        lines.append(
            "  DANGEROUS: load refuses what no allow entry admits (a denied global, a hostile "
            "structure): treat it as an attack"
        )
    lines.append(f"  -> {verdict}")
    return "\n".join(lines)


def _failed(command: str, path: str, error: str, as_json: bool) -> int:
    """An unreadable path: one line on stderr (never a traceback), and with ``--json`` the
    same record on stdout that a readable one gets, so a caller always has JSON to read."""
    print(f"compatshim {command}: {printable(error, 2 * MAX_SHOWN)}", file=sys.stderr)
    if as_json:
        print(json.dumps(Scanned(path, None, error).as_dict(), indent=1))
    return EXIT_CODES[UNREADABLE]


def main(path: str, as_json: bool = False) -> int:
    """``compatshim inspect PATH``: the report; exit code by severity (``EXIT_CODES``)."""
    done = scan_one(path)
    info = done.info
    if info is None:
        return _failed("inspect", path, done.error or "", as_json)
    print(json.dumps(info.as_dict(), indent=1) if as_json else render(info))
    return EXIT_CODES[info.severity]


def _scan_line(done: Scanned) -> str:
    """``SEVERITY  path  (why)``: the names that decide it, a few at most."""
    info, why = done.info, ""
    if info is None:
        why = done.error or ""
    elif info.severity == NEEDS_ALLOW and not info.dcp:
        named = info.needs_allow
        more = len(named) + info.unknown_omitted - 3
        why = "allow: " + ", ".join(named[:3]) + (f" and {more} more" if more > 0 else "")
    elif info.refusals:
        why = info.refusals[-1]  # the deciding one: load's, or a DCP item's (key and file)
    elif info.dangerous or info.dangerous_omitted:
        why = (
            "denied: " + ", ".join(info.dangerous[:3]) + (" ..." if len(info.dangerous) > 3 else "")
        )
    shown = f"{done.severity:<11} {printable(done.path, 1000)}"
    return f"{shown}  ({printable(why)})" if why else shown


class Progress:
    """``scanned i/n`` on stderr for a long scan: redrawn in place on a terminal, else a line
    every few seconds once the scan has run that long (a CI log stays short)."""

    AFTER_S = 3.0

    def __init__(self, total: int, stream: IO[str] | None = None) -> None:
        self.total, self.stream = total, stream or sys.stderr
        self.terminal = self.stream.isatty()
        self.start = self.last = time.monotonic()
        self.shown = False

    def step(self, done: int) -> None:
        now = time.monotonic()
        if self.terminal and (now - self.last >= 0.1 or done == self.total):
            self.stream.write(f"\rcompatshim scan: {done}/{self.total} paths")
        elif not self.terminal and now - self.start >= self.AFTER_S and now - self.last >= 5:
            self.stream.write(f"compatshim scan: {done}/{self.total} paths\n")
        else:
            return
        self.stream.flush()
        self.last, self.shown = now, True

    def close(self) -> None:
        if self.terminal and self.shown:
            self.stream.write("\r\x1b[K")  # erase the line: the report follows on stdout
            self.stream.flush()


def scan_main(paths: Sequence[str], as_json: bool = False) -> int:
    """``compatshim scan PATH...``: a severity per file, folders walked (:func:`targets`);
    exit with the worst file's code (the highest: ``EXIT_CODES``)."""
    found = list(targets(paths))
    progress = Progress(len(found))
    results = []
    for count, path in enumerate(found, 1):
        try:
            results.append(scan_one(path))
        except Exception as exc:  # a compatshim bug on one file must not hide the others
            why = f"compatshim failed on it ({type(exc).__name__}): a bug, please report it"
            results.append(Scanned(path, None, why))
        progress.step(count)
    progress.close()
    counts = {severity: 0 for severity in SEVERITIES}
    for done in results:
        counts[done.severity] += 1
    # nothing found is no pass: a gate on a mistyped or still empty folder would go green
    code = max((EXIT_CODES[done.severity] for done in results), default=EXIT_CODES[UNREADABLE])
    error = None if results else _nothing_found(paths)
    if as_json:
        report = {"files": [d.as_dict() for d in results], "counts": counts, "exit_code": code,
                  "error": error}  # fmt: skip
        print(json.dumps(report, indent=1))
        return code
    for done in results:
        print(_scan_line(done))
    summary = ", ".join(f"{n} {severity}" for severity, n in counts.items() if n)
    if error:
        print(f"compatshim scan: {error}", file=sys.stderr)
    else:
        print(f"{len(results)} path(s): {summary}")
    return code


def _nothing_found(paths: Sequence[str]) -> str:
    names = ", ".join(printable(p, 200) for p in paths[:3]) + (", ..." if paths[3:] else "")
    suffixes = " ".join(f"*{s}" for s in SUFFIXES)
    return (
        f"nothing to scan under {names}: no DCP folder and no file named {suffixes} (name a "
        "file to inspect it whatever its name)"
    )
