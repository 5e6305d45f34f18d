"""``torch._six`` for torch >= 2.0, loaded under that name by compatshim's alias finder.

torch 1.13.1's ``torch/_six.py`` defined exactly ``inf``, ``nan``,
``string_classes`` and ``with_metaclass``; each is given here with the same
meaning (``inf is math.inf``). Any other name raises an ``AttributeError``
naming it and the caller. Never imported under its own name.
"""

from __future__ import annotations

import math
from typing import Any

inf = math.inf
nan = math.nan
string_classes = (str, bytes)

__all__ = ["inf", "nan", "string_classes", "with_metaclass"]


def with_metaclass(meta: type, *bases: type) -> type:
    """A temporary base whose subclasses are created by ``meta`` with ``bases`` (six's idiom)."""

    class _Temporary(meta):  # type: ignore[misc, valid-type]
        def __new__(cls, name: str, this_bases: tuple[type, ...], namespace: dict[str, Any]) -> Any:
            return meta(name, bases, namespace)

        @classmethod
        def __prepare__(cls, name: str, this_bases: tuple[type, ...], **kwargs: Any) -> Any:
            return meta.__prepare__(name, bases)

    return type.__new__(_Temporary, "temporary_class", (), {})


def __getattr__(name: str) -> Any:
    from compatshim.aliases._missing import not_provided

    raise not_provided("torch._six", name, "torch 2.0 removed torch._six")
