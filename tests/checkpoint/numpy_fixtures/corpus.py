"""The numpy values the fixtures hold, built the same way under numpy 1.24 to 2.x.

``weights()`` is what training checkpoints hold (arrays, scalars, dtypes, the
legacy RNG state): compatshim's loader and torch's weights-only unpickler
accept it. ``plain()`` adds what only plain pickle loads (a recarray, whose
numpy-2 pickle names ``numpy.rec``; a ufunc). ``same(a, b)`` compares values
built by one numpy with values loaded under another.
"""

from __future__ import annotations

from typing import Any


def weights(np: Any) -> dict[str, Any]:
    return {
        "f8": np.arange(6.0).reshape(2, 3),
        "i4": np.arange(5, dtype=np.int32),
        "u1": np.arange(4, dtype=np.uint8),
        "bool": np.array([True, False, True]),
        "fortran": np.asfortranarray(np.arange(6, dtype=np.int64).reshape(2, 3)),
        "zero_d": np.array(3.5),
        "scalar_f8": np.float64(1.5),
        "scalar_i8": np.int64(7),
        "scalar_bool": np.bool_(True),
        "dtype": np.dtype("float32"),
        "numpy_rng": np.random.RandomState(5).get_state(),
    }


def plain(np: Any) -> dict[str, Any]:
    return {
        **weights(np),
        "recarray": np.rec.array([(1, 2.0)], dtype=[("x", "<i4"), ("y", "<f8")]),
        "structured": np.array([(1, 2.0)], dtype=[("a", "<i4"), ("b", "<f8")]),
        "ufunc": np.add,
    }


def same(expected: Any, loaded: Any, np: Any) -> bool:
    """Equal values of the running numpy's own types (arrays, scalars, dtypes, ufuncs)."""
    if isinstance(expected, dict):
        return (
            isinstance(loaded, dict)
            and expected.keys() == loaded.keys()
            and all(same(expected[k], loaded[k], np) for k in expected)
        )
    if isinstance(expected, tuple):
        return (
            isinstance(loaded, tuple)
            and len(expected) == len(loaded)
            and all(same(a, b, np) for a, b in zip(expected, loaded))
        )
    if isinstance(expected, np.ndarray):
        return (
            type(loaded) is type(expected)
            and loaded.dtype == expected.dtype
            and loaded.shape == expected.shape
            and bool(loaded.flags.f_contiguous) == bool(expected.flags.f_contiguous)
            and bool(np.array_equal(loaded, expected))
        )
    if isinstance(expected, np.ufunc):
        return loaded is expected
    return type(loaded) is type(expected) and loaded == expected
