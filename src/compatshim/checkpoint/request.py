"""One front door for every checkpoint read: a :class:`Request` and :func:`read`.

``checkpoint.load``, ``inspect``, DCP's ``.metadata`` reader and the hardened patches
(``torch.load``, ``numpy.load``, DCP's ``pickle``) each build a Request and call
:func:`read`, so they never judge a file differently; the options travel with the
request down to the pickle machine. A refusal leaves :func:`read` as an
:class:`~compatshim.checkpoint.UnsafeCheckpointError` whose ``refused`` lists what was
refused, with no advice: each caller words its own (``checkpoint.load``: ``allow=`` and
``trusted=``; the hardened patches: ``patches/_safe_pickle.py``). A DCP item written through
stream transforms is read through :class:`Bounded` (``_expand``) by every reader of it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Iterable, Literal

from ._container import compressed_size, describe_source, stored_size
from ._container import read as _guarded
from ._expand import Bounded
from ._expand import limit as expansion_limit
from ._gate import not_rebuilt
from ._load import Loader
from ._machine import MAX_LINE, py2_str_encoding
from .errors import CheckpointError, UnsafeCheckpointError

__all__ = [
    "MAX_LINE",
    "Bounded",
    "CheckpointError",
    "Expect",
    "Request",
    "UnsafeCheckpointError",
    "compressed_size",
    "expansion_limit",
    "not_rebuilt",
    "read",
    "stored_size",
]

#: what the source must be: any format ``load`` reads, a pickle (``numpy.load``'s), or a
#: DCP ``.metadata`` (a pickle whose data files lie inside its folder)
Expect = Literal["checkpoint", "pickle", "dcp-metadata"]


@dataclass(frozen=True)
class Request:
    """What one read is asked to do.

    ``map_location``, ``allow``, ``mmap``: as :func:`compatshim.checkpoint.load` takes them.
    ``encoding``: how Python 2 ``str`` is read (``torch.load``'s and ``numpy.load``'s
    ``encoding=``: a codec, ``"bytes"``, None for UTF-8; LookupError here for an unknown
    codec). ``object_arrays``: admit plain numpy object arrays (hardened
    ``numpy.load(allow_pickle=True)``). ``name``: what messages call the source (default:
    its path or ``.name``). ``expect``: what the source must be. ``nested``: set by the
    reader for a pickle inside the file (``torch.storage._load_from_bytes``): the outer
    read's parsed allow and budget, which it shares, and its depth.
    """

    map_location: Any = None
    allow: Iterable[Any] = ()
    mmap: bool = False
    encoding: str | None = None
    object_arrays: bool = False
    name: str | None = None
    expect: Expect = "checkpoint"
    nested: Any = None  # _load.Nested: (Allow, Budget, depth)

    def __post_init__(self) -> None:
        if self.encoding is not None:  # before any read, as pickle checks it
            object.__setattr__(self, "encoding", py2_str_encoding(self.encoding))


def read(source: Any, request: Request = Request()) -> Any:
    """What ``source`` (a path or a seekable binary file) holds, read as ``request`` asks.

    Only CheckpointError / UnsafeCheckpointError (and a missing path's OSError, a wrong
    argument's TypeError or LookupError) leave it, naming the source.
    """
    loader = Loader(request)  # a wrong map_location is a TypeError before any read
    value = _guarded(source, loader.read, name=request.name)
    if request.expect == "dcp-metadata":
        from ._dcp_folder import _charge_uses, _refuse_paths_outside

        what = request.name or describe_source(source)
        path: Any = source if isinstance(source, (str, os.PathLike)) else None
        path = os.fspath(path) if path is not None else getattr(source, "name", None)
        local = type(path) is str and os.path.isfile(path)  # torch's reader opens it by path
        _refuse_paths_outside(value, what, os.path.dirname(path) if local else None)
        _charge_uses(value, loader.budget, what)
    return value
