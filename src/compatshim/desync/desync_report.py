"""The readable report behind :class:`DesyncError`: who is where, who is missing, what differs.

One report is built from the records every rank left in the store, so each
rank that can still act prints the same picture: per rank its operation and
call site (or that it never arrived, where it was last seen, or that its
process exited), then the first difference found.

Every report opens with the same headline, ``compatshim.dist.DesyncError: ``,
whether a rank raises it or a monitor prints it for a rank that cannot raise
(blocked in a collective, or its child rank never launched): users grep for
the error's name.
"""

from __future__ import annotations

import re
import time
from typing import Iterable, Sequence

from ._liveness import RankState
from ._records import Site
from ._sites import format_site

HEADLINE = "compatshim.dist.DesyncError: "
SILENT_WHY = "blocked while holding the GIL, stopped, or its host is unreachable"
GROUP_ABOVE = 8  # worlds larger than this list ranks with the same description together
_SECONDS = re.compile(r"\d+\.\d s\b")  # "1.2 s": the one part of a description that varies


class DesyncError(RuntimeError):
    """Ranks are out of step: they are at different places, one never arrived, or one exited.

    ``report`` is the full text (it starts with ``compatshim.dist.DesyncError: ``,
    so the message itself leaves that out); ``ranks`` maps each rank to what is
    known of it.
    """

    def __init__(self, report: str, ranks: dict[int, RankState] | None = None) -> None:
        super().__init__(report[len(HEADLINE) :] if report.startswith(HEADLINE) else report)
        self.report = report
        self.ranks = ranks or {}


DesyncError.__module__ = "compatshim.dist"  # shown in tracebacks: the public name


def titled(text: str) -> str:
    """``text`` as the first line of a report (for the short ones, with no rank blocks)."""
    return HEADLINE + text


def rank_list(ranks: Iterable[int]) -> str:
    """``[0-29, 31]``: ranks in order, runs of three or more written as ranges."""
    ordered = sorted(set(ranks))
    parts: list[str] = []
    start = 0
    while start < len(ordered):
        end = start
        while end + 1 < len(ordered) and ordered[end + 1] == ordered[end] + 1:
            end += 1
        if end - start >= 2:
            parts.append(f"{ordered[start]}-{ordered[end]}")
        else:
            parts += [str(r) for r in ordered[start : end + 1]]
        start = end + 1
    return "[" + ", ".join(parts) + "]"


def _stack_lines(stack: Sequence[Site], indent: str) -> list[str]:
    return [f"{indent}{format_site(site)}" for site in stack]


def _first(stack: Sequence[Site]) -> Site | None:
    return stack[0] if stack else None


def describe_rank(rank: int, info: RankState, now: float, *, meeting: bool = True) -> list[str]:
    """Lines for one rank: arrived / last seen / exited, with call site and liveness.

    ``meeting``: the ranks were to meet somewhere, so one without an arrival "never arrived"
    (a hang report has no such place)."""
    me = "  <- this rank" if info.is_self else ""
    arrived = info.arrived
    if arrived is not None:
        head = f"rank {rank}: at {arrived.tag!r} from {format_site(_first(arrived.stack))}{me}"
        return [head, *_stack_lines(arrived.stack[1:3], "    called from ")]
    other = " never arrived" if meeting else ""
    parts = [f"rank {rank}: this rank" if me else f"rank {rank}:{other}"]
    seen = info.seen
    if seen is not None:
        active = "in" if seen.active else "last left"
        ago = now - seen.since
        parts.append(
            f"  {active} {seen.op} called at {format_site(_first(seen.stack))} ({ago:.1f} s ago)"
        )
        parts += _stack_lines(seen.stack[1:3], "    called from ")
    else:
        parts.append("  nothing recorded from this rank (it never reached a watched call)")
    if info.exit is not None and info.exit.left:
        parts.append(f"  it left the process group: {info.exit.how}")
    elif info.exit is not None:
        parts.append(f"  its process exited: {info.exit.how}")
    elif info.state == "silent":
        parts.append(f"  no heartbeat for {info.silent_for or 0:.1f} s: {SILENT_WHY}")
    elif info.heartbeat_age is not None:
        parts.append(f"  alive (heartbeat {info.heartbeat_age:.1f} s ago)")
    return parts


def _rank_blocks(ranks: dict[int, RankState], now: float, meeting: bool) -> list[list[str]]:
    """One block per rank; above ``GROUP_ABOVE`` ranks, one per distinct description.

    Ranks whose lines differ only in their ages (``1.2 s ago``) share a block
    headed ``ranks [0-5, 7]``, each age shown as the range seen in the group.
    """
    described = {
        rank: describe_rank(rank, ranks[rank], now, meeting=meeting) for rank in sorted(ranks)
    }
    if len(described) <= GROUP_ABOVE:
        return list(described.values())
    groups: dict[str, list[int]] = {}
    for rank, lines in described.items():
        joined = "\n".join([lines[0][len(f"rank {rank}") :], *lines[1:]])
        groups.setdefault(_SECONDS.sub("\0", joined), []).append(rank)
    blocks: list[list[str]] = []
    for key, members in groups.items():
        if len(members) == 1:
            blocks.append(described[members[0]])
            continue
        ages = [
            [float(m.group()[:-2]) for m in _SECONDS.finditer("\n".join(described[r]))]
            for r in members
        ]
        pieces = key.split("\0")
        text = pieces[0]
        for column, piece in zip(zip(*ages), pieces[1:]):
            low, high = min(column), max(column)
            text += (f"{low:.1f} s" if low == high else f"{low:.1f}-{high:.1f} s") + piece
        body = text.split("\n")
        blocks.append([f"ranks {rank_list(members)}{body[0]}", *body[1:]])
    return blocks


def build_report(
    *,
    headline: str,
    ranks: dict[int, RankState],
    differs: list[str],
    stacks: dict[int, str] | None = None,
    meeting: bool = True,
) -> str:
    """Assemble the text: headline, one block per rank, what differs, optional full stacks.

    ``meeting``: False for a hang report, where no rank was expected anywhere."""
    now = time.time()
    lines = [HEADLINE + headline]
    for block in _rank_blocks(ranks, now, meeting):
        lines += ["  " + line for line in block]
    if differs:
        lines.append("What differs:")
        lines += [f"  - {item}" for item in differs]
    if stacks:
        lines.append("Python stacks (all threads):")
        for rank in sorted(stacks):
            lines.append(f"  --- rank {rank} ---")
            lines += ["  " + line for line in stacks[rank].rstrip().splitlines()]
    return "\n".join(lines)
