"""``compatshim inspect FILE [--json]``: the report, and its exit code.

Exit 0: every global is covered (``load`` would accept the file); 1: some are
unknown or refused; 2: the file is damaged or unreadable (one reason line,
never a traceback).
"""

from __future__ import annotations

import json
import sys

from ._inspect import CheckpointInfo, inspect
from .errors import CheckpointError


def _size(count: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024  # type: ignore[assignment]
    return str(count)


def render(info: CheckpointInfo) -> str:
    w = info.writer
    lines = [
        f"{info.path}: {info.container}",
        f"  tensors: {info.tensors} in {info.storages} storages, {_size(info.tensor_bytes)}"
        + (f" ({', '.join(f'{k} x{v}' for k, v in info.dtypes.items())})" if info.dtypes else ""),
        f"  writer: pickle protocol {w.pickle_protocol}"
        + (f", archive version {w.archive_version}" if w.archive_version else "")
        + (f", byteorder {w.byteorder}" if w.byteorder else "")
        + (f", {w.torch}" if w.torch else "")
        + (f", numpy {w.numpy_major}.x names" if w.numpy_major else ""),
        f"  globals ({len(info.globals)}):",
    ]
    for use in info.globals:
        status = f"covered by {use.kind} entry" if use.covered else f"UNKNOWN: {use.note}"
        lines.append(f"    {use.name} x{use.count}: {status}")
    for refusal in info.refusals:
        lines.append(f"  REFUSED: {refusal}")
    verdict = "loadable by compatshim.checkpoint.load" if info.loadable else "NOT loadable as is"
    lines.append(f"  -> {verdict}")
    return "\n".join(lines)


def main(path: str, as_json: bool = False) -> int:
    try:
        info = inspect(path)
    except (CheckpointError, OSError) as exc:
        print(f"compatshim inspect: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(info.as_dict(), indent=1) if as_json else render(info))
    return 0 if info.loadable else 1
