"""The one error the master-param adapter raises: it says what it saw, never guesses."""

from __future__ import annotations

from collections.abc import Sequence

from .._engine.versions import installed_version


class UnknownLayoutError(TypeError):
    """An optimizer whose master-param layout compatshim does not recognise.

    Raised instead of returning a tensor that might be the wrong one: the
    message names the installed colossalai version, the optimizer's type, the
    attributes that were looked for and the layouts compatshim knows.
    """

    def __init__(
        self,
        optimizer: object,
        looked_for: Sequence[str],
        known: Sequence[str],
        reason: str = "",
    ) -> None:
        self.optimizer_type = f"{type(optimizer).__module__}.{type(optimizer).__qualname__}"
        self.colossalai_version = installed_version("colossalai")
        self.looked_for = tuple(looked_for)
        self.known = tuple(known)
        version = self.colossalai_version or "not installed"
        lines = [
            f"compatshim.master: no known master-param layout on {self.optimizer_type} "
            f"(colossalai {version}).",
        ]
        if reason:
            lines.append(reason)
        lines.append("Looked for: " + ", ".join(self.looked_for) + ".")
        lines.append("Known layouts: " + "; ".join(self.known) + ".")
        lines.append(
            "If this is a new colossalai release, add a module for its layout to "
            "compatshim/master/layouts/."
        )
        super().__init__("\n".join(lines))
