"""Read every fixture of this folder through every route; print one JSON line.

    python -W error read_fixtures.py [--patched before|after]

``--patched before`` installs compatshim's ``numpy-core-names`` before numpy
and torch are imported, ``after`` once they are. Routes: ``pickle``,
``torch.load(weights_only=False)``, ``torch.load(weights_only=True)`` with the
running numpy's reconstructors allow-listed (torch 2.5+, where torch accepts
numpy at all), ``compatshim.checkpoint.load``. Each gives "ok" (equal values
of the running numpy's types), "mismatch", or "error: <type>: <message>".
Run by tests/checkpoint/test_patch_numpy_core_names.py.
"""

from __future__ import annotations

import json
import pickle
import sys
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent


def _install() -> None:
    import compatshim

    compatshim.install(include=["numpy-core-names"])


def _numpy_allowlist(np: Any) -> list[Any]:
    """What a careful user allow-lists for numpy under torch: the running numpy's objects."""
    multiarray = (
        __import__("numpy._core.multiarray").__dict__["_core"].multiarray
        if int(np.__version__.split(".")[0]) >= 2
        else np.core.multiarray
    )
    dtypes = {type(np.dtype(code)) for code in ("f8", "f4", "i4", "i8", "u1", "u4", "?")}
    return [multiarray._reconstruct, multiarray.scalar, np.ndarray, np.dtype, *dtypes]


def _routes(np: Any, torch: Any) -> dict[str, Callable[[Path], Any]]:
    from compatshim.checkpoint import load as compatshim_load

    routes: dict[str, Callable[[Path], Any]] = {
        "pickle": lambda path: pickle.loads(path.read_bytes()),
        "compatshim.checkpoint.load": compatshim_load,
    }
    if torch is None:
        return routes
    routes["torch.load(weights_only=False)"] = lambda path: torch.load(path, weights_only=False)
    safe_globals = getattr(torch.serialization, "safe_globals", None)
    if safe_globals is not None:

        def weights_only(path: Path) -> Any:
            with safe_globals(_numpy_allowlist(np)):
                return torch.load(path, weights_only=True)

        routes["torch.load(weights_only=True)"] = weights_only
    return routes


def _applicable(route: str, path: Path) -> bool:
    if path.name.endswith(".pt"):
        return route != "pickle"
    if ".plain." in path.name:
        return route == "pickle"
    return route in ("pickle", "compatshim.checkpoint.load")


def main() -> None:
    patched = sys.argv[2] if len(sys.argv) > 2 and sys.argv[1] == "--patched" else None
    if patched == "before":
        _install()
    import numpy as np

    try:
        import torch
    except ImportError:
        torch = None
    if patched == "after":
        _install()
    sys.path.insert(0, str(HERE))
    import corpus

    report: dict[str, Any] = {
        "numpy": np.__version__,
        "torch": None if torch is None else torch.__version__,
        "numpy._core attribute before any load": "_core" in vars(np),
        "numpy._core imported before any load": "numpy._core" in sys.modules,
        "results": {},
    }
    for path in sorted(HERE.glob("numpy-*")):
        expected = corpus.plain(np) if ".plain." in path.name else corpus.weights(np)
        for route, load in _routes(np, torch).items():
            if not _applicable(route, path):
                continue
            try:
                loaded = load(path)
                if isinstance(loaded, dict):
                    loaded.pop("tensor", None)
                outcome = "ok" if corpus.same(expected, loaded, np) else f"mismatch: {loaded!r}"
            except BaseException as exc:
                outcome = f"error: {type(exc).__name__}: {str(exc)[:300]}"
            report["results"][f"{path.name} via {route}"] = outcome
    if int(np.__version__.split(".")[0]) < 2 and patched:
        core = np.core
        report["identical"] = {
            "numpy._core.multiarray._reconstruct": sys.modules[
                "numpy._core.multiarray"
            ]._reconstruct
            is core.multiarray._reconstruct,
            "numpy._core.numeric": sys.modules.get("numpy._core.numeric") is core.numeric,
            "numpy.rec": sys.modules.get("numpy.rec") is core.records,
        }
    print("RESULT " + json.dumps(report))


if __name__ == "__main__":
    main()
