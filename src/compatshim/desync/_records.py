"""What ranks leave for each other in the process group's store: every key and every record shape.

The store is a protocol between processes (a rank reads what another rank of
the same compatshim wrote), so its layout lives here and nowhere else. Records
travel as JSON objects; decoding ignores fields it does not know, so a record
can gain a field without breaking a reader.

===============  =====================  ==============================================
key              record                 written by
===============  =====================  ==============================================
``hb/R``         :class:`Heartbeat`     rank R's monitor, every half second
``seen/R``       :class:`Seen`          rank R's monitor (latest breadcrumb), sync points
``sp/N/R``       :class:`Arrival`       rank R arriving at sync point number N
``desync``       :class:`DesyncNotice`  the first rank that found the ranks out of step
``ack/R``        :class:`Ack`           rank R's monitor once it has seen the notice
``exit/R``       :class:`ExitRecord`    rank R at exit or when it destroys the group,
                                        or the launcher that started it
``hangs``        a counter (``add``)    a rank asking every rank for its stacks
``stack/N/R``    :class:`StackDump`     rank R answering stack request number N
===============  =====================  ==============================================

``sp/N/R`` is the only key written again and again: rank R deletes it once every
rank has arrived at a later sync point (nobody reads it any more), so the store
holds at most about three per rank. ``stack/N/R`` is written only for a hang report, and
deleted by the rank that asked once it has read them (an answer later than its wait stays).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar, TypeVar

PREFIX = "compatshim/dist/"

Site = tuple[str, int, str]  # (file, line, function) of one frame


def _key(*parts: object) -> str:
    return PREFIX + "/".join(str(part) for part in parts)


class Keys:
    """The store key of each record (see the table in the module docstring)."""

    @staticmethod
    def heartbeat(rank: int) -> str:
        return _key("hb", rank)

    @staticmethod
    def seen(rank: int) -> str:
        return _key("seen", rank)

    @staticmethod
    def arrival(seq: int, rank: int) -> str:
        return _key("sp", seq, rank)

    @staticmethod
    def desync() -> str:
        return _key("desync")

    @staticmethod
    def ack(rank: int) -> str:
        return _key("ack", rank)

    @staticmethod
    def exit(rank: int) -> str:
        return _key("exit", rank)

    @staticmethod
    def hangs() -> str:
        return _key("hangs")

    @staticmethod
    def stacks(number: int, rank: int) -> str:
        return _key("stack", number, rank)


R = TypeVar("R", bound="Record")


@dataclass(frozen=True)
class Record:
    """Base of every store record: JSON out, JSON in (unknown fields ignored)."""

    _SITE_FIELDS: ClassVar[tuple[str, ...]] = ()

    def to_json(self) -> str:
        return json.dumps(asdict(self), default=str)

    @classmethod
    def from_json(cls: type[R], raw: bytes | str) -> R:
        data = json.loads(raw.decode() if isinstance(raw, (bytes, bytearray)) else raw)
        known = {f.name for f in fields(cls)}
        values = {name: value for name, value in data.items() if name in known}
        for name in cls._SITE_FIELDS:  # JSON has no tuples: frames come back as lists
            values[name] = [tuple(site) for site in values.get(name) or []]
        return cls(**values)


@dataclass(frozen=True)
class Heartbeat(Record):
    """A rank is alive, and whether it sits inside a watched call (and which one)."""

    time: float
    pid: int
    host: str
    op_seq: int | None = None  # number of the watched call it is inside, None when outside
    collective: bool = False  # that call is a world-wide collective (needs every rank)


@dataclass(frozen=True)
class Seen(Record):
    """A rank's latest breadcrumb: the watched call it is in (``active``) or last left."""

    _SITE_FIELDS: ClassVar[tuple[str, ...]] = ("stack",)

    op: str
    stack: list[Site]
    since: float
    active: bool
    seq: int | None = None
    collective: bool = False


@dataclass(frozen=True)
class Arrival(Record):
    """A rank has reached sync point number N with this tag, from this call site."""

    _SITE_FIELDS: ClassVar[tuple[str, ...]] = ("stack",)

    tag: str
    stack: list[Site]
    pid: int
    host: str
    time: float
    payload: Any = None  # compared across ranks (``check_module_consistency``: the module)
    world_size: int | None = None  # the world this rank waits for (None: an older writer)


@dataclass(frozen=True)
class DesyncNotice(Record):
    """The ranks are out of step; ``report`` is the full text the reporting rank raised."""

    reporter: int
    headline: str
    report: str
    ends_run: bool = False  # a hang report (watchdog, stuck call): every rank ends at once


@dataclass(frozen=True)
class Ack(Record):
    """A rank's monitor has seen the desync notice (the reporter waits briefly for these)."""

    time: float


@dataclass(frozen=True)
class ExitRecord(Record):
    """A rank has ended or is ending (``left``: it destroyed its process group, and so left
    the run); ``how`` in words, ``code`` when a launcher saw the exit."""

    how: str
    code: int | None = None
    left: bool = False


@dataclass(frozen=True)
class StackDump(Record):
    """Every Python thread's stack of one rank, answering one stack request."""

    text: str
