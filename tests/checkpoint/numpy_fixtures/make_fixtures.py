"""Write this folder's fixtures with the running numpy (and torch): run once per numpy.

    python tests/checkpoint/numpy_fixtures/make_fixtures.py

Files, named after the writing numpy ``<v>``: ``numpy-<v>.plain.p2.pkl`` and
``.plain.p5.pkl`` (``pickle.dumps`` of :func:`corpus.plain`, protocols 2 and
5: protocol 5 names ``numeric._frombuffer``), ``numpy-<v>.weights.p2.pkl``
(:func:`corpus.weights`) and ``numpy-<v>.torch.pt`` (``torch.save`` of the
weights corpus with a tensor, as an RNG-state file would be). The committed
set was written under numpy 1.24.4 (torch 2.1.2), 1.26.4 (torch 2.5.1) and
2.4.6 (torch 2.13.0).
"""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import corpus  # noqa: E402


def main() -> None:
    stem = HERE / f"numpy-{np.__version__}"
    for protocol in (2, 5):
        Path(f"{stem}.plain.p{protocol}.pkl").write_bytes(
            pickle.dumps(corpus.plain(np), protocol=protocol)
        )
    Path(f"{stem}.weights.p2.pkl").write_bytes(pickle.dumps(corpus.weights(np), protocol=2))
    import torch

    torch.save({**corpus.weights(np), "tensor": torch.arange(3)}, f"{stem}.torch.pt")
    print(f"wrote {stem}.* (numpy {np.__version__}, torch {torch.__version__})")


if __name__ == "__main__":
    main()
