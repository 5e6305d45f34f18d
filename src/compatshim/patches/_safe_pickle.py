"""Hardened mode's reading and wording, one place for every hardened patch.

:class:`SafePickle`: ``pickle`` as a hardened patch hands it to one reader module.
``load``/``loads`` read through compatshim's loader and never run code from the data;
everything else (``dump``, ``UnpicklingError``...) is the real module. One class for
every patch that swaps a module's ``pickle`` (numpy's readers, DCP's ``.metadata``).
:func:`refused_hardened` words a refusal for all of them and for the hardened
``torch.load`` (from the refused names the loader reports, :func:`how_to_allow`), so a
refusal reads the same wherever it comes from.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import ModuleType
    from typing import Any, Callable

HARDENED_PROMISE = (
    "no torch.load in this process runs code from a file, whatever its weights_only argument"
)


def how_to_allow(refused: tuple[str, ...]) -> str:
    """Advice for a hardened reader's caller; never torch's (its wording sends PyG to
    unsafe loads)."""
    from ..checkpoint.deny import refused_globals
    from ..checkpoint.request import not_rebuilt

    names, risky = refused_globals(refused)
    unbuilt = not_rebuilt(names)
    if unbuilt and not risky:
        return unbuilt[1:]  # without its leading "."
    if risky:
        return (
            f" The file names {', '.join(risky)}, which can run code or reach the system "
            "(denied: no allow source can admit it): it may be malicious."
        )
    if not names:
        return ""
    listed = ", ".join(repr(n) for n in names)
    return (
        f" If you trust {', '.join(names)}, allow it for every load in this process: "
        f'compatshim.checkpoint.allow({listed}, reason="...") in code, or '
        f"COMPATSHIM_ALLOW={','.join(names)} in its environment."
    )


def refused_hardened(
    why: BaseException, what: str, read_as: str = "", promise: str = HARDENED_PROMISE
) -> BaseException:
    """The hardened-mode refusal: ``pickle.UnpicklingError`` (via UnsafeCheckpointError),
    from the loader's error ``why`` (no advice of its own: ``request.read``) and its
    ``refused`` names."""
    from ..checkpoint.errors import UnsafeCheckpointError, as_well

    refused = tuple(getattr(why, "refused", ()))
    text = str(why)
    if not isinstance(why, UnsafeCheckpointError):
        text = f"{what}: compatshim.checkpoint.load could not read it{read_as} ({text})"
    return as_well(UnsafeCheckpointError, type(why))(  # torch's type, where it has one
        f"{text}. COMPATSHIM_SAFE_LOAD=1: {promise}.{how_to_allow(refused)}",
        refused,
    )


def seekable(file: Any) -> bool:
    """Whether a hardened reader can read ``file`` in place (else it buffers the bytes first)."""
    try:
        return bool(file.seekable())
    except Exception:
        return False


class SafePickle:
    """A module's ``pickle`` whose ``load(file, **options)`` is ``read(file, **options)``.

    ``read`` is the patch's reader (compatshim's loader; it gets ``pickle.load``'s
    keyword options and uses those it honours); a ``CheckpointError`` from it becomes the
    hardened refusal (an ``UnsafeCheckpointError``, a ``pickle.UnpicklingError``),
    recorded as the ``patch``'s decision. An unseekable file is read into memory first.
    """

    def __init__(
        self,
        real: ModuleType,
        *,
        patch: str,
        read: Callable[..., Any],
        read_as: str,
        promise: str,
        unnamed: str,
    ) -> None:
        self._real, self._patch, self._read = real, patch, read
        self._read_as, self._promise, self._unnamed = read_as, promise, unnamed

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def load(self, file: Any, /, **options: Any) -> Any:
        import io

        from .._engine import decisions
        from ..checkpoint import CheckpointError

        name = getattr(file, "name", None)
        what = repr(name or self._unnamed)
        if not seekable(file):
            data = io.BytesIO(file.read())
            if name:
                data.name = name  # type: ignore[attr-defined]
            file = data
        try:
            return self._read(file, **options)
        except CheckpointError as why:  # UnsafeCheckpointError included
            decisions.record(self._patch, "refused", f"{what}: {type(why).__name__}")
            raise refused_hardened(
                why, what, read_as=self._read_as, promise=self._promise
            ) from None

    def loads(self, data: Any, /, **options: Any) -> Any:
        import io

        return self.load(io.BytesIO(bytes(data)), **options)
