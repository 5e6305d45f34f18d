"""A finding, and the text in it, written without trusting the objects it describes.

Types are named through ``type``'s own descriptors (a metaclass cannot make
that raise or lie) and exceptions are printed with a fallback, because the
objects a finding describes are the ones that misbehave.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

_VIEW_TYPE_NAMES = frozenset(
    f"{prefix}_{kind}" for prefix in ("dict", "odict") for kind in ("keys", "values", "items")
)


@dataclass(frozen=True)
class Finding:
    """One object that blocks pickling, where it is, why, and what compatshim offers."""

    path: str
    """Access path from the root, e.g. ``dataset.eval_cfg.class_names``."""
    type_name: str
    """The offending object's type (``dict_keys``, ``torch._C._distributed_c10d.ProcessGroup``)."""
    error: str
    """What pickle says about this object alone."""
    fix: str | None = None
    """The compatshim patch or function that covers it, when there is one."""

    def __str__(self) -> str:
        text = f"{self.path} ({self.type_name}): {self.error}"
        return f"{text} [fix: {self.fix}]" if self.fix else text


def type_attribute(cls: type, name: str, default: str) -> str:
    """``cls.<name>`` read through ``type``'s own descriptor: a metaclass cannot intervene."""
    try:
        return safe_str(type.__dict__[name].__get__(cls))
    except Exception:
        return default


def type_name(cls: type) -> str:
    """``module.QualName`` (just ``QualName`` for builtins)."""
    module = type_attribute(cls, "__module__", "builtins")
    qualname = type_attribute(cls, "__qualname__", "<unnamed type>")
    return qualname if module == "builtins" else f"{module}.{qualname}"


def safe_str(value: Any) -> str:
    """``str(value)`` that cannot raise."""
    if type(value) is str:
        return value
    try:
        printed = str(value)
    except Exception as exc:
        return f"<str() failed: {type_attribute(type(exc), '__name__', 'exception')}>"
    return printed if type(printed) is str else "<str() returned no string>"


def error_text(exc: BaseException) -> str:
    """``ExceptionName: message``, whatever the exception does when printed."""
    return f"{type_attribute(type(exc), '__name__', 'exception')}: {safe_str(exc)}"


def _patch(name: str) -> str:
    """The patch that fixes it, and how to arm it here (``install()`` skips a disabled one)."""
    from .._engine.registry import disable_entries

    # spelling slips count, as the registry honours them (torch_processgroup_copy)
    if any(found == name for _, found in disable_entries([name])):
        return (
            f"patch {name} (disabled by COMPATSHIM_DISABLE here: remove it there, then "
            "compatshim.install())"
        )
    return f"patch {name} (compatshim.install())"


def fix_for(obj: Any, owner: Any) -> str | None:
    """The compatshim patch or function that covers this kind of culprit, if any."""
    module = type_attribute(type(obj), "__module__", "")
    name = type_attribute(type(obj), "__name__", "")
    if name in _VIEW_TYPE_NAMES:
        if type_attribute(type(owner), "__module__", "").startswith("nuscenes"):
            return _patch("nuscenes-dict-views")
        return None
    if module.startswith("torch") and "ProcessGroup" in name:
        return f"{_patch('torch-processgroup-copy')}; compatshim.clone_module for a deep copy"
    if module in ("_thread", "threading") or module.startswith("torch.cuda"):
        return "compatshim.clone_module shares it in a deep copy (pickling cannot carry it)"
    return None
