"""``pickle`` as a hardened patch hands it to one reader module.

``load``/``loads`` read through compatshim's loader and never run code from the data;
everything else (``dump``, ``UnpicklingError``...) is the real module. One class for
every patch that swaps a module's ``pickle`` (numpy's readers, DCP's ``.metadata``), so
a refusal is recorded and worded the same wherever it comes from.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import ModuleType
    from typing import Any, Callable


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
        from .torch_load_safe_globals import _refused_hardened, seekable

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
            raise _refused_hardened(
                why, what, read_as=self._read_as, promise=self._promise
            ) from None

    def loads(self, data: Any, /, **options: Any) -> Any:
        import io

        return self.load(io.BytesIO(bytes(data)), **options)
