"""The numpy values the fixtures hold, built the same way under numpy 1.24 to 2.x.

``weights()`` is what training checkpoints hold (arrays, scalars, dtypes, the
legacy RNG state): compatshim's loader and torch's weights-only unpickler
accept it. ``plain()`` adds what only plain pickle loads (a recarray, whose
numpy-2 pickle names ``numpy.rec``; a ufunc). ``empty()`` holds what protocol
2 writes as ``bytes()`` (empty arrays, ``b''``). ``random()`` holds
``numpy.random`` objects, part-way through their streams (numpy 2 pickles the
bit-generator class and its SeedSequence, numpy 1 the class name), and
``draws()`` says what each draws next. ``same(a, b)`` compares values built by
one numpy with values loaded under another.
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
    if isinstance(expected, np.random.SeedSequence):
        return type(loaded) is type(expected) and _seed_sequence_fields(
            loaded
        ) == _seed_sequence_fields(expected)
    if isinstance(expected, (np.random.Generator, np.random.RandomState)):
        return type(loaded) is type(expected) and same(
            expected._bit_generator, loaded._bit_generator, np
        )
    if isinstance(expected, np.random.BitGenerator):  # read_fixtures checks exact types
        return isinstance(loaded, type(expected)) and same(expected.state, loaded.state, np)
    return type(loaded) is type(expected) and loaded == expected


def empty(np: Any) -> dict[str, Any]:
    """Values whose protocol-2 pickles call ``builtins.bytes()`` (empty data, ``b''``)."""
    return {
        "f8": np.zeros(0),
        "i8": np.zeros((0, 3), dtype=np.int64),
        "u1": np.zeros((2, 0), dtype=np.uint8),
        "bool": np.zeros(0, dtype=bool),
        "c16": np.zeros(0, dtype=np.complex128),
        "zero_d_f8": np.array(2.5),
        "zero_d_i8": np.array(-3, dtype=np.int64),
        "empty_bytes": b"",
        "bytes": b"abc",
        "numpy_rng": np.random.RandomState(3).get_state(),
        "pcg64_state": np.random.PCG64(3).state,
        "metrics": {"loss": np.zeros(0, dtype=np.float32), "step": np.int64(0)},
    }


BIT_GENERATORS = ("PCG64", "PCG64DXSM", "MT19937", "Philox", "SFC64")


def _advanced(bit_generator: Any, np: Any) -> Any:
    """Part-way through the stream, with half a 64-bit word buffered (``has_uint32``)."""
    np.random.Generator(bit_generator).integers(0, 2**32, 3, dtype=np.uint32)
    return bit_generator


def random(np: Any) -> dict[str, Any]:
    """numpy.random objects and their state values, each some draws into its stream."""
    generator = np.random.default_rng(12345)
    generator.integers(0, 2**32, 3, dtype=np.uint32)
    generator.standard_normal(1)
    legacy = np.random.RandomState(12345)
    legacy.standard_normal(1)  # one Gaussian cached (has_gauss)
    spawning = np.random.SeedSequence(2024)
    children = spawning.spawn(3)
    values: dict[str, Any] = {
        "generator": generator,
        "generator_mt19937": np.random.Generator(_advanced(np.random.MT19937(7), np)),
        "random_state": legacy,
        "random_state_pcg64": np.random.RandomState(_advanced(np.random.PCG64(9), np)),
        "seed_sequence": np.random.SeedSequence(12345),
        "seed_sequence_parent": spawning,
        "seed_sequence_child": children[2],
        "get_state": legacy.get_state(),
        "get_state_dict": legacy.get_state(legacy=False),
        "pcg64_state": generator.bit_generator.state,
    }
    for name in BIT_GENERATORS:
        values[name] = _advanced(getattr(np.random, name)(11), np)
    return values


def draws(value: Any, np: Any) -> Any:
    """What an RNG object draws next (JSON values; it is consumed), or None for plain values."""
    if isinstance(value, np.random.Generator):
        return [
            value.integers(0, 2**32, 5, dtype=np.uint32).tolist(),
            value.random(3).tolist(),
            value.standard_normal(3).tolist(),
        ]
    if isinstance(value, np.random.RandomState):
        return [value.standard_normal(3).tolist(), value.random_sample(3).tolist()]
    if isinstance(value, np.random.SeedSequence):
        child = value.spawn(1)[0]
        return [
            value.generate_state(4).tolist(),
            list(child.spawn_key),
            child.generate_state(2).tolist(),
        ]
    if hasattr(value, "random_raw"):
        return [*draws(np.random.Generator(value), np), value.random_raw(2).tolist()]
    return None


def _seed_sequence_fields(value: Any) -> tuple[Any, ...]:
    return (value.entropy, value.spawn_key, value.pool_size, value.n_children_spawned)
