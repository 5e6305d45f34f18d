"""``compatshim inspect FILE [--json]``: the report, and its exit code.

Exit 0: every global is covered (``load`` would accept the file); 1: some are
unknown or refused; 2: the file is damaged or unreadable (one reason line,
never a traceback).

Every string that comes from the file (global names, zip record names and
text records, tensor names, metadata, error messages quoting them) goes
through :func:`printable` in the human output, so a file cannot move the
cursor, erase lines or reorder text to forge a verdict; ``--json`` is exact.
"""

from __future__ import annotations

import json
import sys
import unicodedata

from ._inspect import CheckpointInfo, inspect
from .deny import REFUSAL as DENIED
from .errors import CheckpointError


def _size(count: int) -> str:
    """``count`` bytes in binary units (up to EiB: a float overflows only past 2**1084)."""
    units = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")
    step = min(max(count.bit_length() - 1, 0) // 10, len(units) - 1)
    return f"{count} B" if step == 0 else f"{count / (1 << 10 * step):.1f} {units[step]}"


MAX_SHOWN = 200  # characters of one file-derived string
MAX_TENSORS_SHOWN = 50
_ESCAPED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})


def printable(text: object, limit: int = MAX_SHOWN) -> str:
    """``text`` cut to ``limit`` characters, with controls escaped, safe to print to a terminal.

    Escaped as ``\\xNN`` / ``\\uNNNN`` / ``\\UNNNNNNNN``: C0, DEL and C1 controls (ESC
    sequences, ``\\r``), format characters (bidi overrides U+202A-U+202E and isolates
    U+2066-U+2069, zero-width), line/paragraph separators, surrogates, private-use and
    unassigned code points; a backslash is doubled so escapes cannot be forged.
    """
    whole = text if type(text) is str else str(text)  # str, int or our own exception
    cut = whole[:limit]
    out = []
    for char in cut:
        if char == "\\":
            out.append("\\\\")
        elif " " <= char <= "~":
            out.append(char)
        elif unicodedata.category(char) in _ESCAPED_CATEGORIES:
            code = ord(char)
            out.append(
                f"\\x{code:02x}"
                if code < 0x100
                else f"\\u{code:04x}"
                if code < 0x10000
                else f"\\U{code:08x}"
            )
        else:
            out.append(char)
    if len(whole) > limit:
        out.append(f"...({len(whole)} characters)")
    return "".join(out)


def _tensor_lines(info: CheckpointInfo) -> list[str]:
    lines = []
    for tensor in info.named_tensors[:MAX_TENSORS_SHOWN]:
        shape = "x".join(map(str, tensor.shape)) or "scalar"
        lines.append(f"    {printable(tensor.name)}: {printable(tensor.dtype, 40)} [{shape}]")
    if len(info.named_tensors) > MAX_TENSORS_SHOWN:
        lines.append(f"    ... and {len(info.named_tensors) - MAX_TENSORS_SHOWN} more (--json)")
    for key, value in (info.metadata or {}).items():
        lines.append(f"  metadata {printable(key, 80)}: {printable(value)}")
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
        lines.append(f"    {name} x{use.count}: UNKNOWN: {printable(use.note)}")
        if use.dangerous:
            lines.append(f"      {DENIED}: {use.dangerous}")
        elif use.allow:
            lines.append(f"      to allow it for one call: {printable(use.allow, 2 * MAX_SHOWN)}")
            lines.append("      for every load in the process (torch.load too), one of:")
            for line in use.allow_everywhere:
                lines.append(f"        {printable(line, 2 * MAX_SHOWN)}")
        elif "." in use.name and all(p.isidentifier() for p in use.name.split(".")):
            lines.append(
                "      a nested name: allow the object itself (allow=[Outer.Inner] or "
                "compatshim.checkpoint.allow(Outer.Inner, reason=...)), not a string"
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
    lines = [
        f"{printable(info.path, 1000)}: {info.container}",
        f"  tensors: {info.tensors} in {info.storages} storages, {_size(info.tensor_bytes)}"
        + (f" ({dtypes})" if dtypes else ""),
    ]
    if info.container == "safetensors":
        lines += _tensor_lines(info)
        lines.append("  globals: none (safetensors holds no pickle)")
    else:
        lines += _dcp_lines(info)
        lines += [
            f"  writer: pickle protocol {w.pickle_protocol}"
            + (f", archive version {printable(w.archive_version)}" if w.archive_version else "")
            + (f", byteorder {printable(w.byteorder)}" if w.byteorder else "")
            + (f", {w.torch}" if w.torch else "")
            + (f", numpy {w.numpy_major}.x names" if w.numpy_major else ""),
            f"  globals ({len(info.globals) + info.globals_omitted}):",
            *_global_lines(info),
        ]
    for refusal in info.refusals:
        lines.append(f"  REFUSED: {printable(refusal, 2 * MAX_SHOWN)}")
    verdict = "loadable by compatshim.checkpoint.load" if info.loadable else "NOT loadable as is"
    lines.append(f"  -> {verdict}")
    return "\n".join(lines)


def main(path: str, as_json: bool = False) -> int:
    try:
        info = inspect(path)
    except (CheckpointError, OSError) as exc:
        print(f"compatshim inspect: {printable(exc, 2 * MAX_SHOWN)}", file=sys.stderr)
        return 2
    print(json.dumps(info.as_dict(), indent=1) if as_json else render(info))
    return 0 if info.loadable else 1
