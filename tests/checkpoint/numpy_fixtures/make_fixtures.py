"""Write this folder's fixtures with the running numpy (and torch, if installed): run per numpy.

    python tests/checkpoint/numpy_fixtures/make_fixtures.py [--force]

Files, named after the writing numpy ``<v>`` (``<c>`` a corpus of
:mod:`corpus`): ``numpy-<v>.plain.p2.pkl`` and ``.plain.p5.pkl``
(``pickle.dumps`` of :func:`corpus.plain`, protocols 2 and 5: protocol 5 names
``numeric._frombuffer``), ``numpy-<v>.weights.p2.pkl`` (:func:`corpus.weights`),
``numpy-<v>.torch.pt`` (``torch.save`` of the weights corpus with a tensor, as
an RNG-state file would be), ``numpy-<v>.empty.p2.pkl`` / ``.empty.torch.pt``
(:func:`corpus.empty`), ``numpy-<v>.random.p2.pkl`` / ``.random.p5.pkl`` /
``.random.torch.pt`` (:func:`corpus.random`) and ``numpy-<v>.random.draws.json``
(what each of those RNG objects drew next in the writing process). Existing
files are kept unless ``--force``. The committed set was written under numpy
1.24.4 (torch 2.1.2; ``empty``/``random``: torch 2.13.0), 1.26.4 (torch 2.5.1;
``empty``/``random``: torch 2.13.0), 2.0.2 (torch 2.13.0), 2.4.6 (torch 2.13.0)
and 2.5.5 (Python 3.12, no torch: no ``.pt`` files).
"""

from __future__ import annotations

import json
import pickle
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import corpus  # noqa: E402


def _files(torch: Any) -> dict[str, Callable[[Path], None]]:
    def dump(build: Callable[[Any], Any], protocol: int) -> Callable[[Path], None]:
        return lambda path: path.write_bytes(pickle.dumps(build(np), protocol=protocol))

    def save(build: Callable[[Any], Any], **extra: Any) -> Callable[[Path], None]:
        return lambda path: torch.save({**build(np), **extra}, path)

    def draws(path: Path) -> None:
        made = {k: corpus.draws(v, np) for k, v in corpus.random(np).items()}
        path.write_text(json.dumps({k: v for k, v in made.items() if v is not None}) + "\n")

    files = {
        "plain.p2.pkl": dump(corpus.plain, 2),
        "plain.p5.pkl": dump(corpus.plain, 5),
        "weights.p2.pkl": dump(corpus.weights, 2),
        "empty.p2.pkl": dump(corpus.empty, 2),
        "random.p2.pkl": dump(corpus.random, 2),
        "random.p5.pkl": dump(corpus.random, 5),
        "random.draws.json": draws,
    }
    if torch is not None:
        files["torch.pt"] = save(corpus.weights, tensor=torch.arange(3))
        files["empty.torch.pt"] = save(corpus.empty)
        files["random.torch.pt"] = save(corpus.random)
    return files


def main() -> None:
    try:
        import torch
    except ImportError:
        torch = None
    force = "--force" in sys.argv[1:]
    for suffix, write in _files(torch).items():
        path = HERE / f"numpy-{np.__version__}.{suffix}"
        if force or not path.exists():
            write(path)
            print(f"wrote {path.name}")
    print(f"numpy {np.__version__}, torch {getattr(torch, '__version__', None)}")


if __name__ == "__main__":
    main()
