"""Bounded text of values that come from a file or another process.

The one place such a value becomes text: ``str()``/``repr()`` of a file-controlled
object can be exponential in its size (a memo DAG of lists) or run its code, so
everything else calls :func:`short`.
"""

from __future__ import annotations

from typing import Any

__all__ = ["cut", "escaped", "named", "names", "short"]

#: what a terminal acts on or hides: C0, DEL and C1 controls (ESC sequences, ``\r``, BEL),
#: format characters (bidi overrides U+202A-U+202E and isolates U+2066-U+2069, zero-width),
#: line and paragraph separators, surrogates, private-use and unassigned code points
_ESCAPED = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})


def short(value: Any, limit: int = 40) -> str:
    """A bounded description of a value from the file (never a deep repr, never its own code):
    the repr of at most ``limit`` characters of a str or bytes."""
    kind = type(value)
    if kind is int and value.bit_length() > 128:  # repr is quadratic, and raises past 4300 digits
        return f"an int of {value.bit_length()} bits"
    if kind in (int, float, bool, type(None)):
        text = repr(value)
    elif kind in (str, bytes):
        text = repr(value[:limit]) + ("..." if len(value) > limit else "")
    else:
        return f"a {type(value).__name__}"
    return text if len(text) < limit + 20 else text[: limit + 17] + "..."


def escaped(text: str, backslash: bool = False) -> str:
    """``text`` with what a terminal acts on or hides (``_ESCAPED``) written as ``\\xNN`` /
    ``\\uNNNN`` / ``\\UNNNNNNNN``: a name from a file cannot move the cursor, erase a verdict,
    write the clipboard or reorder a line. ``backslash``: a backslash is doubled too, so no
    escape can be forged (not idempotent then: for text shown once)."""
    if text.isprintable() and not (backslash and "\\" in text):
        return text
    import unicodedata  # only here: start-up stays flat

    out = []
    for char in text:
        if char == "\\" and backslash:
            out.append("\\\\")
        elif " " <= char <= "~" or unicodedata.category(char) not in _ESCAPED:
            out.append(char)
        else:
            code = ord(char)
            out.append(
                f"\\x{code:02x}" if code < 0x100 else
                f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
            )  # fmt: skip
    return "".join(out)


def cut(text: str, limit: int = 200) -> str:
    """``text`` (a name the file wrote, already a str) cut to about ``limit`` characters, then
    :func:`escaped` (up to 10 characters each): messages and warnings carry it to a terminal."""
    if len(text) > limit:
        return f"{escaped(text[: limit - 40])}... ({len(text)} characters)"
    return escaped(text)


def names(items: list[str], limit: int = 20) -> str:
    """A comma-separated list of at most ``limit`` of ``items``, each cut, and how many more."""
    shown = ", ".join(cut(item) for item in items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


def named(value: Any) -> str:
    """``module.qualname`` of a class or function (each part cut), else ``a <type>``."""
    if isinstance(value, type) or callable(value):
        module = getattr(value, "__module__", None) or "?"
        name = getattr(value, "__qualname__", None)
        if type(module) is str and type(name) is str:
            return f"{cut(module, 100)}.{cut(name, 100)}"
    return f"a {type(value).__name__}"
