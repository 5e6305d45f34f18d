"""Build the API reference from the docstrings with pdoc: ``python docs/build_api.py OUT_DIR``.

Every public module of compatshim (no ``_``-prefixed part) is documented, except
``compatshim.auto``, whose import arms the patches. A warning pdoc raises (a name in
``__all__`` that does not resolve, a docstring link it cannot follow, a module that
fails to import) is an error: the build exits 1 and names it, so a reference that
would be broken fails CI (``tests/tooling/test_docs.py`` runs this in the lint env).

Packages export some names lazily (a module ``__getattr__``: importing compatshim
stays cheap); pdoc reads ``__all__`` from the module's ``__dict__``, so those names
are resolved first, through the package's own ``__getattr__``.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
import warnings
from pathlib import Path

SKIP = {"compatshim.auto", "compatshim.__main__"}  # auto: importing it arms every patch


def public_modules() -> list[str]:
    """Every importable public module name of compatshim, the package first."""
    import compatshim

    names = ["compatshim"]
    for info in pkgutil.walk_packages(compatshim.__path__, "compatshim."):
        if info.name in SKIP or any(part.startswith("_") for part in info.name.split(".")):
            continue
        names.append(info.name)
    return names


def resolve_lazy_exports(names: list[str]) -> None:
    """Put each lazily exported ``__all__`` name into its module's ``__dict__``."""
    for name in names:
        module = importlib.import_module(name)
        for attr in getattr(module, "__all__", ()):
            if attr not in vars(module):
                setattr(module, attr, getattr(module, attr))


def build(out: Path) -> list[str]:
    """Write the reference to ``out``; return pdoc's warnings (empty when it is whole)."""
    import pdoc

    names = public_modules()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resolve_lazy_exports(names)
        del caught[:]  # the imports' own warnings (deprecations in torch...) are not pdoc's
        pdoc.pdoc(*names, output_directory=out)
    return [
        f"{w.category.__name__}: {w.message}"
        for w in caught
        if ("pdoc" in Path(w.filename).parts or "compatshim" in str(w.message))
        # each listed package's submodules are walked by pdoc too: listed twice, one page
        and "but a module with this name has already been added" not in str(w.message)
    ]


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python docs/build_api.py OUT_DIR", file=sys.stderr)
        return 2
    problems = build(Path(argv[0]))
    for problem in problems:
        print(f"build_api: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
