"""Hardened ``numpy.load(allow_pickle=True)`` (patch ``numpy-load-hardened``) vs numpy's own.

What a user calls is ``numpy.load(f, allow_pickle=True)``; hardened, its pickles are read
by compatshim's loader instead of the C unpickler. Both contenders make that same call in
one process, alternately, from the same file in the page cache: for the plain one the
reader's ``pickle`` is the real module for the duration of the call (a dict assignment).
Shapes: ragged arrays saved as an object array (the usual reason for ``allow_pickle``),
per-sample metadata dicts, an ``.npz`` of one large numeric array beside a small object
array, a pickle file of a dict of arrays, and the first two again as compressed ``.npz``
members (``savez_compressed``: read from an inflating stream). Medians.

``main()`` prints Markdown and returns the ratios (hardened / plain).
"""

from __future__ import annotations

import inspect
import os
import pickle
import tempfile
from importlib import import_module
from pathlib import Path
from typing import Any, Callable

from _common import interleaved, median, ms, table


def _files(folder: Path) -> dict[str, Path]:
    import numpy as np

    rng = np.random.default_rng(0)
    ragged = np.empty(2_000, dtype=object)
    ragged[:] = [rng.random(int(n), dtype=np.float32) for n in rng.integers(10, 500, 2_000)]
    meta = np.array(
        [{"id": i, "label": f"class{i % 10}", "box": [1.0, 2.0, 3.0, 4.0]} for i in range(20_000)],
        dtype=object,
    )
    files = {
        "2 000 ragged float32 arrays (.npy)": folder / "ragged.npy",
        "20 000 metadata dicts (.npy)": folder / "meta.npy",
        "8 MB array + 100 strings (.npz)": folder / "both.npz",
        "dict of 50 arrays (pickle file)": folder / "state.pkl",
        "2 000 ragged float32 arrays (compressed .npz)": folder / "ragged_z.npz",
        "20 000 metadata dicts (compressed .npz)": folder / "meta_z.npz",
    }
    np.save(files["2 000 ragged float32 arrays (.npy)"], ragged, allow_pickle=True)
    np.save(files["20 000 metadata dicts (.npy)"], meta, allow_pickle=True)
    np.savez(
        files["8 MB array + 100 strings (.npz)"],
        data=rng.random(1_000_000),
        names=np.array([f"sample{i}" for i in range(100)], dtype=object),
    )
    np.savez_compressed(files["2 000 ragged float32 arrays (compressed .npz)"], ragged=ragged)
    np.savez_compressed(files["20 000 metadata dicts (compressed .npz)"], meta=meta)
    state = {f"layer{i}": rng.random((64, 64)) for i in range(50)}
    files["dict of 50 arrays (pickle file)"].write_bytes(pickle.dumps(state, protocol=4))
    return files


def _everything(loaded: Any) -> Any:
    if hasattr(loaded, "files"):
        with loaded:
            return {key: loaded[key] for key in loaded.files}
    return loaded


class _PurePythonPickle:
    """``pickle`` whose ``load`` is the standard library's pure-Python unpickler."""

    def __getattr__(self, name: str) -> Any:
        return getattr(pickle, name)

    @staticmethod
    def load(file: Any, **options: Any) -> Any:
        return pickle._Unpickler(file, **options).load()  # type: ignore[attr-defined]


def main(repeats: int = 9) -> dict[str, float]:
    os.environ["COMPATSHIM_SAFE_LOAD"] = "1"
    import numpy as np

    import compatshim
    from compatshim.patches._safe_pickle import SafePickle
    from compatshim.patches.numpy_load_hardened import READERS, safe_pickle

    compatshim.install(include=["numpy-load-hardened"])
    # the reader functions' namespaces (under the patch's entries that note max_header_size)
    readers = [inspect.unwrap(vars(import_module(t))[f]) for t, f in READERS.items()]
    spaces = [reader.__globals__ for reader in readers]
    assert all(isinstance(g["pickle"], SafePickle) for g in spaces), "patch not applied"

    def read_with(module: Any, path: Path) -> Any:
        for g in spaces:
            g["pickle"] = module
        try:
            return _everything(np.load(path, allow_pickle=True))
        finally:
            for g in spaces:
                g["pickle"] = safe_pickle(pickle)

    def hardened(path: Path) -> Any:
        return _everything(np.load(path, allow_pickle=True))

    rows, ratios = [], {}
    with tempfile.TemporaryDirectory() as folder:
        for name, path in _files(Path(folder)).items():
            contenders: dict[str, Callable[[], Any]] = {
                "hardened": lambda p=path: hardened(p),
                "plain": lambda p=path: read_with(pickle, p),
                "python": lambda p=path: read_with(_PurePythonPickle(), p),
            }
            samples = interleaved(contenders, repeats)
            ours, theirs = median(samples["hardened"]), median(samples["plain"])
            python = median(samples["python"])
            ratios[name] = ours / theirs
            size = path.stat().st_size / 2**20
            rows.append(
                [
                    name,
                    f"{size:.1f} MiB",
                    ms(ours),
                    ms(theirs),
                    f"{ours / theirs:.2f}x",
                    ms(python),
                    f"{ours / python:.2f}x",
                ]
            )
    compatshim.uninstall()
    print(
        f"### Hardened numpy.load(allow_pickle=True) vs numpy's own (numpy {np.__version__}, "
        f"{repeats} interleaved repeats, medians)\n"
    )
    header = [
        "file",
        "size",
        "hardened",
        "numpy (C pickle.load)",
        "ratio",
        "pure-Python pickle, no checks",
        "ratio",
    ]
    print(table(header, rows))
    print(
        "\nThe first ratio is the price of reading the pickle with compatshim's checked Python "
        "machine instead of the C unpickler; the second compares it with the standard "
        "library's own pure-Python unpickler (``pickle._Unpickler``, which checks nothing and "
        "runs any global): what reading in Python costs before any check. Numeric array bytes "
        "outside pickles are read by numpy either way."
    )
    return ratios


if __name__ == "__main__":
    main()
