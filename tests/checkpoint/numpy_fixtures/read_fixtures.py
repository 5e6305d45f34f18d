"""Read every fixture of this folder through every route; print one JSON line.

    python -W error read_fixtures.py [--patched before|after]

``--patched before`` installs compatshim's ``numpy-core-names`` before numpy
and torch are imported, ``after`` once they are. Routes: ``pickle``,
``torch.load(weights_only=False)``, ``torch.load(weights_only=True)`` with the
running numpy's reconstructors allow-listed (torch 2.5+, where torch accepts
numpy at all; not for numpy.random files, whose ctors torch does not allow),
``compatshim.checkpoint.load``. Each gives "ok" (equal values of the running
numpy's types; RNG objects also draw what the writing process drew next),
"mismatch", or "error: <type>: <message>". ``subclassed`` lists the values
whose type is a subclass of numpy's (the numpy-1 adapter for a numpy-2 bit
generator pickled on its own). Run by
tests/checkpoint/test_patch_numpy_core_names.py.
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
    if path.name.endswith(".pt"):  # torch's weights-only refuses numpy.random ctors and bytes()
        refused = any(f".{kind}." in path.name for kind in ("random", "empty"))
        return route != "pickle" and not ("=True" in route and refused)
    if ".plain." in path.name:
        return route == "pickle"
    return route in ("pickle", "compatshim.checkpoint.load")


def _expected(path: Path, np: Any, corpus: Any) -> Any:
    for kind in ("plain", "empty", "random"):
        if f".{kind}." in path.name:
            return getattr(corpus, kind)(np)
    return corpus.weights(np)


def _outcome(path: Path, expected: Any, loaded: Any, np: Any, corpus: Any) -> str:
    if isinstance(loaded, dict):
        loaded.pop("tensor", None)
    if not corpus.same(expected, loaded, np):
        return f"mismatch: {str(loaded)[:300]}"
    if ".random." not in path.name:
        return "ok"
    drawn = json.loads(
        path.with_name(path.name.split(".random.")[0] + ".random.draws.json").read_text()
    )
    now = {k: json.loads(json.dumps(corpus.draws(loaded[k], np))) for k in drawn}
    wrong = sorted(k for k in drawn if now[k] != drawn[k])
    return f"mismatch: next draws differ for {wrong}" if wrong else "ok"


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
        "subclassed": {},
    }
    for path in sorted(HERE.glob("numpy-*")):
        if path.suffix == ".json" or (path.suffix == ".pt" and torch is None):
            continue
        expected = _expected(path, np, corpus)
        for route, load in _routes(np, torch).items():
            if not _applicable(route, path):
                continue
            name = f"{path.name} via {route}"
            try:
                loaded = load(path)
                if isinstance(loaded, dict) and isinstance(expected, dict):
                    subclassed = [
                        k
                        for k in expected
                        if k in loaded and type(loaded[k]) is not type(expected[k])
                    ]
                    if subclassed:
                        report["subclassed"][name] = subclassed
                outcome = _outcome(path, expected, loaded, np, corpus)
            except BaseException as exc:
                outcome = f"error: {type(exc).__name__}: {str(exc)[:300]}"
            report["results"][name] = outcome
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
