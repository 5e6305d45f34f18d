"""The one name gate: is ``module.name`` admitted, by what, and if not, why.

:func:`judge` answers for ``load`` (resolving a global), its refusal message (every
other global the file names), ``inspect`` and the scanner's call rules, so they can never
disagree. In order, on the :func:`_names.canonical` key:

1. compatshim's allowlist, where its row applies to the installed release: its own checked
   handling, whatever else names the global (a denied name it lists, such as
   ``builtins.getattr``, is only ever its checked rule);
2. the deny list (``deny.py``): nothing below can admit what it names;
3. the call's ``allow=`` (:class:`Allow`; torch's ``add_safe_globals`` registrations reach
   it there);
4. the process-wide sources (``process_allow.py``), read only when reached.

The verdict reads no module: a string entry is taken at its word. ``load`` imports it
afterwards (:meth:`Allow.obtain`) and refuses what it turns out to be, when denied.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Mapping

from . import process_allow
from ._names import RESOLVER, UNRESOLVED, Key, canonical, parse
from .allowlist import Entry, candidate_modules, row
from .deny import REFUSAL as DENIED_REFUSAL
from .deny import denied_global, denied_object
from .process_allow import Allowed

ALLOWLIST = "compatshim's allowlist"
CALL = "allow="
NOT_LISTED = "not on compatshim's allowlist"
GETATTR_ONLY = (
    "reached through builtins.getattr: compatshim admits only the methods its table lists "
    "(allow= does not open getattr)"
)
# Torch objects whose files compatshim cannot rebuild, whatever is allowed: quantized storages
# are no storage type its reader knows, and rebuild_from_type_v2 takes no wrapper subclass
# (DTensor). A file naming one is unreadable here, not a list of globals to allow.
_QUANTIZED = ("torch._utils._rebuild_qtensor", "torch.QInt8Storage", "torch.QUInt8Storage",
              "torch.QInt32Storage", "torch.QUInt4x2Storage", "torch.QUInt2x4Storage")  # fmt: skip
NOT_REBUILT: dict[str, str] = {
    **dict.fromkeys(_QUANTIZED, "quantized tensors"),
    "torch._utils._rebuild_wrapper_subclass": "wrapper tensor subclasses (DTensor)",
}


def not_rebuilt(refused: Iterable[str]) -> str:
    """What ``refused`` names that compatshim cannot rebuild, as advice ("" for none)."""
    found: dict[str, str] = {}
    for name in refused:
        if name in NOT_REBUILT:
            found.setdefault(NOT_REBUILT[name], name)
    if not found:
        return ""
    kinds = "; ".join(f"{kind} ({name})" for kind, name in found.items())
    return (
        f". compatshim does not rebuild {kinds}: no allow entry makes this file load. "
        "torch's own weights-only load reads it where that torch admits them "
        "(torch.load(weights_only=True), COMPATSHIM_SAFE_LOAD unset)"
    )


_MISSING = object()
# the allowlist's verdicts: they depend on nothing but the installed releases, which
# _engine.versions reads once per process
_LISTED: dict[Key, Verdict] = {}


class Allow:
    """One call's ``allow=``: globals by canonical name (the object, or ``UNRESOLVED`` for a
    string) and the omegaconf resolvers its configs may call (then the process-wide ones)."""

    named: dict[str, Any]  # never changed once made (shared by calls passing one tuple)
    resolvers: process_allow.Resolvers

    def __init__(self, items: Iterable[Any] = ()) -> None:
        self._obtained: dict[str, Any] = {}
        cached = _parsed.get(id(items)) if type(items) is tuple else None
        if cached is not None and cached[0] is items:  # the same entries as a recent call
            self.named, self.resolvers = cached[1], cached[2]
            return
        if isinstance(items, (str, bytes)) or not isinstance(items, Iterable):
            hint = (
                f": write allow=[{items!r}]" if isinstance(items, str) and len(items) < 200 else ""
            )
            raise TypeError(
                "allow= takes a list of entries ('module.name' strings, classes, functions, "
                f"(object, 'module.name') pairs), got {type(items).__name__}{hint}"
            )
        self.named = {}
        resolvers: set[str] = set()
        for item in items:
            parsed = parse(item)
            if parsed.resolver:
                resolvers.add(parsed.key[len(RESOLVER) :])
            else:
                self.named[parsed.key] = parsed.obj
        self.resolvers = process_allow.Resolvers(frozenset(resolvers))
        if type(items) is tuple:  # immutable: its parse is kept for the next call passing it
            if len(_parsed) >= 8:
                _parsed.clear()
            _parsed[id(items)] = (items, self.named, self.resolvers)

    def obtain(self, verdict: Verdict, module: str) -> Any:
        """The object an ``allow=`` or process-wide entry admits. A string is resolved now,
        in ``module`` as the pickle splits it (numpy's core under the running numpy's
        name), through ``vars()`` only (a nested class: ``vars(Outer)["Inner"]``);
        ImportError/LookupError say why not. A denied object is the caller's to refuse."""
        found = self._obtained.get(verdict.name, _MISSING)
        if found is not _MISSING:
            return found
        found = verdict.obj
        if found is UNRESOLVED:
            module = canonical(module, "")[:-1]
            if not verdict.name.startswith(module + "."):
                module = verdict.name.rpartition(".")[0]
            namespace: Mapping[str, Any] | None = None
            for candidate in candidate_modules(module):
                namespace = vars(importlib.import_module(candidate))
            lazy = namespace is not None and "__getattr__" in namespace
            for part in verdict.name[len(module) + 1 :].split("."):
                found = _MISSING if namespace is None else namespace.get(part, _MISSING)
                namespace = vars(found) if isinstance(found, type) else None
            if found is _MISSING:  # named where it was allowed: allow=, COMPATSHIM_ALLOW, ...
                where = verdict.source or CALL
                also = (
                    f"; {module} may make it on attribute access (a module __getattr__, as "
                    "for a deprecated name), which compatshim does not run: allow the object "
                    "itself in allow=[...] or checkpoint.allow(...)"
                    if lazy
                    else ""
                )
                raise LookupError(f"{verdict.name} (named in {where}) does not exist{also}")
        self._obtained[verdict.name] = found
        return found


#: id -> (a tuple of allow= entries, its parse): a caller passing the same tuple on every
#: call (the hardened torch.load: torch's registrations) parses it once. The tuple is held,
#: so its id is not reused while it is here; ``named`` and ``resolvers`` are never changed.
_parsed: dict[int, tuple[tuple[Any, ...], dict[str, Any], process_allow.Resolvers]] = {}


@dataclass(frozen=True)
class Verdict:
    """What :func:`judge` decided about one global."""

    name: Key  # the canonical key
    entry: Entry | None = None  # the allowlist row covering it, whether or not it applies
    member: str | None = None  # an enum member named as one global: the member
    source: str | None = None  # ALLOWLIST, CALL or a process-wide entry's source; None: refused
    obj: Any = None  # CALL / process-wide: the object, or UNRESOLVED
    allowed: Allowed | None = None  # the process-wide entry that admits it
    why: str | None = None  # refused: why
    dangerous: str | None = None  # denied, or reached through getattr: nothing admits it
    absent: bool = False  # allow-listed, its distribution not installed: it cannot exist here

    @property
    def admitted(self) -> bool:
        return self.source is not None

    @property
    def note(self) -> str | None:
        """Why the allowlist does not cover it here, or None where it does."""
        return NOT_LISTED if self.entry is None else self.entry.problem()


def judge(module: str, name: str, allow: Allow | None = None, reached: bool = False) -> Verdict:
    """The verdict on the global ``module.name`` (see the module docstring); ``reached``:
    named through ``builtins.getattr``, so only the allowlist can admit it."""
    key = canonical(module, name)
    listed = _LISTED.get(key)
    if listed is not None:
        return listed
    entry, member = row(key)
    if entry is not None and entry.applies():
        verdict = Verdict(key, entry, member, ALLOWLIST)
        if member is None:  # bounded by the table (a file may name any number of members)
            _LISTED[key] = verdict
        return verdict
    if entry is not None and entry.absent():  # neither dangerous nor allowable: not here
        return Verdict(key, entry, member, why=entry.problem(), absent=True)
    danger = GETATTR_ONLY if reached else denied_global(key)
    if danger is not None:
        why = danger if reached else f"{DENIED_REFUSAL}: {danger}"
        return Verdict(key, entry, member, why=why, dangerous=danger)
    if allow is not None:
        obj = allow.named.get(key, _MISSING)
        if obj is not _MISSING:
            danger = None if obj is UNRESOLVED else denied_object(obj)
            if danger is not None:
                why = f"{DENIED_REFUSAL}: {danger}"
                return Verdict(key, entry, member, why=why, dangerous=danger)
            return Verdict(key, entry, member, CALL, obj)
    hit = process_allow.declared(key)
    if hit is not None:
        return Verdict(key, entry, member, hit[1].source, hit[0], hit[1])
    return Verdict(key, entry, member, why=NOT_LISTED if entry is None else entry.problem())
