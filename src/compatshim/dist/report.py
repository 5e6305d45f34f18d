"""The readable report behind :class:`DesyncError`: who is where, who is missing, what differs.

One report is built from the records every rank left in the store, so each
rank that can still act prints the same picture: per rank its operation and
call site (or that it never arrived, where it was last seen, or that its
process exited), then the first difference found.
"""

from __future__ import annotations

import time
from typing import Any

from ._sites import format_site


class DesyncError(RuntimeError):
    """Ranks are out of step: they are at different places, one never arrived, or one exited.

    ``report`` is the full text; ``ranks`` maps each rank to what is known of it.
    """

    def __init__(self, report: str, ranks: dict[int, dict[str, Any]] | None = None) -> None:
        super().__init__(report)
        self.report = report
        self.ranks = ranks or {}


DesyncError.__module__ = "compatshim.dist"  # shown in tracebacks: the public name


def _stack_lines(stack: Any, indent: str) -> list[str]:
    return [f"{indent}{format_site(site)}" for site in (stack or [])]


def describe_rank(rank: int, info: dict[str, Any], now: float) -> list[str]:
    """Lines for one rank: arrived / last seen / exited, with call site and liveness."""
    state = info.get("state", "missing")
    me = "  <- this rank" if info.get("self") else ""
    arrived = info.get("arrived")
    if arrived is not None:
        head = f"rank {rank}: at {arrived['tag']!r} from {format_site(_first(arrived))}{me}"
        lines = [head, *_stack_lines(arrived.get("stack", [])[1:3], "    called from ")]
        return lines
    parts = [f"rank {rank}: this rank" if me else f"rank {rank}: never arrived"]
    seen = info.get("seen")
    if seen:
        active = "in" if seen.get("active") else "last left"
        ago = now - float(seen.get("since", now))
        parts.append(
            f"  {active} {seen.get('op')} called at {format_site(_first(seen))} ({ago:.1f} s ago)"
        )
        parts += _stack_lines(seen.get("stack", [])[1:3], "    called from ")
    else:
        parts.append("  nothing recorded from this rank (it never reached a watched call)")
    exited = info.get("exit")
    if exited:
        parts.append(f"  its process exited: {exited.get('how')}")
    elif state == "silent":
        parts.append(f"  no heartbeat for {info.get('silent_for', 0):.1f} s: {info.get('why')}")
    elif info.get("heartbeat_age") is not None:
        parts.append(f"  alive (heartbeat {info['heartbeat_age']:.1f} s ago)")
    return parts


def _first(record: dict[str, Any]) -> Any:
    stack = record.get("stack") or []
    return stack[0] if stack else None


def build_report(
    *,
    headline: str,
    ranks: dict[int, dict[str, Any]],
    differs: list[str],
    stacks: dict[int, str] | None = None,
) -> str:
    """Assemble the text: headline, one block per rank, what differs, optional full stacks."""
    now = time.time()
    lines = [f"compatshim.dist: {headline}"]
    for rank in sorted(ranks):
        lines += ["  " + line for line in describe_rank(rank, ranks[rank], now)]
    if differs:
        lines.append("What differs:")
        lines += [f"  - {item}" for item in differs]
    if stacks:
        lines.append("Python stacks (all threads):")
        for rank in sorted(stacks):
            lines.append(f"  --- rank {rank} ---")
            lines += ["  " + line for line in stacks[rank].rstrip().splitlines()]
    return "\n".join(lines)
