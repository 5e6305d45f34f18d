"""``numpy-core-names``: pickles cross the numpy 1.x / 2.x line in both directions.

The fixtures in ``numpy_fixtures/`` were written under numpy 1.24, 1.26, 2.0,
2.4 and 2.5 by ``numpy_fixtures/make_fixtures.py``; ``numpy_fixtures/read_fixtures.py``
reads each through pickle, torch.load (both ``weights_only``) and
compatshim.checkpoint.load in a fresh ``python -W error``, with the patch
installed before or after numpy and torch are imported, or not at all. The
``random`` fixtures hold numpy.random objects (whose reduce arguments changed
in numpy 2) with what they drew next; the ``empty`` ones values that protocol
2 writes as ``bytes()``. The attacks at the end call the numpy.random ctors
with what numpy would construct or call, through compatshim's loader.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

from tests.harness.catalogue import a_library_wraps, alone, status_row

np = pytest.importorskip("numpy")

FIXTURES = Path(__file__).resolve().parent / "numpy_fixtures"
BIT_GENERATORS = ("MT19937", "PCG64", "PCG64DXSM", "Philox", "SFC64")
NUMPY2 = int(np.__version__.split(".")[0]) >= 2
PATCH = "numpy-core-names"


def read_fixtures(*flags: str) -> dict[str, Any]:
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("COMPATSHIM_")}
    done = subprocess.run(
        [sys.executable, "-W", "error", str(FIXTURES / "read_fixtures.py"), *flags],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            report: dict[str, Any] = json.loads(line[len("RESULT ") :])
            return report
    raise AssertionError(f"read_fixtures {flags} exit {done.returncode}:\n{done.stderr[-4000:]}")


@pytest.fixture(scope="module")
def plain() -> dict[str, Any]:
    return read_fixtures()


def _other_numpy(name: str) -> bool:
    return name.startswith("numpy-1.") if NUMPY2 else name.startswith("numpy-2.")


def test_fixtures_cover_both_numpy_majors() -> None:
    names = [p.name for p in FIXTURES.glob("numpy-*")]
    assert any(n.startswith("numpy-1.24.") for n in names)
    assert any(n.startswith("numpy-1.26.") for n in names)
    assert any(n.startswith("numpy-2.") for n in names)


def test_without_the_patch_the_other_numpys_pickles_fail(plain: dict[str, Any]) -> None:
    failed = {k: v for k, v in plain["results"].items() if v != "ok"}
    assert all(_other_numpy(k) for k in failed), failed  # same-major files always load
    protocol5 = [k for k in plain["results"] if _other_numpy(k) and ".plain.p5." in k]
    assert protocol5 and all(k in failed for k in protocol5)
    expected = "DeprecationWarning: numpy.core.numeric" if NUMPY2 else "ModuleNotFoundError"
    assert all(expected in failed[k] for k in protocol5), failed
    random = [k for k in plain["results"] if _other_numpy(k) and ".random." in k]
    random = [k for k in random if "compatshim" not in k and ".p5." not in k]
    assert random
    if NUMPY2:  # numpy 2's ctors take numpy 1's names and state dicts: no adapter needed
        assert all(plain["results"][k] == "ok" for k in random), failed
    else:  # numpy 2 pickles the bit generator's class; numpy 1 looks names up
        assert all("is not a known BitGenerator module" in failed[k] for k in random), failed


def test_compatshim_loads_every_fixture_without_the_patch(plain: dict[str, Any]) -> None:
    """Its loader rebuilds either major's numpy objects itself: b'', numpy.random included."""
    ours = {k: v for k, v in plain["results"].items() if "compatshim" in k}
    assert any(".random." in k for k in ours) and any(".empty." in k for k in ours)
    assert set(ours.values()) == {"ok"}, ours
    assert plain["subclassed"] == {}


@pytest.mark.parametrize("order", ["before", "after"])
def test_with_the_patch_every_route_loads_equal_values(order: str) -> None:
    patched = read_fixtures("--patched", order)
    assert patched["results"] and set(patched["results"].values()) == {"ok"}, patched["results"]
    if not NUMPY2:
        assert patched["identical"] == dict.fromkeys(patched["identical"], True)
    # A numpy-2 bit generator pickled on its own comes back under numpy 1 as a subclass of
    # numpy's class (BUILD needs a __setstate__ that numpy 1's type cannot be given); those
    # inside a Generator / RandomState, and everything compatshim's loader builds, are exact.
    for name, keys in patched["subclassed"].items():
        assert not NUMPY2 and _other_numpy(name) and "compatshim" not in name, name
        assert sorted(keys) == sorted(BIT_GENERATORS), (name, keys)
    assert NUMPY2 or patched["subclassed"]


def test_import_numpy_is_unchanged_until_a_pickle_asks(plain: dict[str, Any]) -> None:
    patched = read_fixtures("--patched", "before")
    for fact in ("numpy._core attribute before any load", "numpy._core imported before any load"):
        assert patched[fact] == plain[fact]


@pytest.fixture
def installed() -> Any:
    import compatshim

    with alone(PATCH, armed=False):
        yield compatshim


def test_install_is_idempotent_and_uninstall_exact(installed: Any) -> None:
    import pickle

    from compatshim._engine import import_hooks
    from compatshim.patches.numpy_core_names import NumpyCoreFinder

    meta_path = list(sys.meta_path)
    modules = set(sys.modules)
    ctors = dict(vars(_random_pickle()))
    assert installed.install(include=[PATCH]) == [PATCH]
    assert installed.install(include=[PATCH]) == [PATCH]
    row = status_row(PATCH)
    assert row.applied and row.fixed and row.applied_targets == ["numpy"]
    other = sorted(p for p in FIXTURES.glob("numpy-*.plain.p5.pkl") if _other_numpy(p.name))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for path in other:
            pickle.loads(path.read_bytes())
    installed.uninstall([PATCH])
    assert [f for f in sys.meta_path if isinstance(f, NumpyCoreFinder)] == []
    assert "numpy.core.numeric" not in import_hooks.watched()
    created = set(sys.modules) - modules
    aliases = [m for m in created if any(sys.modules[m] is sys.modules[o] for o in modules)]
    assert aliases == []  # numpy 1.26's own numpy._core stubs may stay: they are real modules
    if NUMPY2:
        shim = sys.modules.get("numpy.core.numeric")
        if shim is not None:
            assert "_frombuffer" not in vars(shim)
    assert sys.meta_path == meta_path
    assert {k: v for k, v in vars(_random_pickle()).items() if k.endswith("_ctor")} == {
        k: v for k, v in ctors.items() if k.endswith("_ctor")
    }


@pytest.mark.skipif(not NUMPY2, reason="numpy 2's numpy.core shims")
def test_other_numpy_core_attributes_keep_their_deprecation_warning(installed: Any) -> None:
    import numpy.core.numeric as shim

    installed.install(include=[PATCH])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert shim._frombuffer is sys.modules["numpy._core.numeric"]._frombuffer
    with pytest.warns(DeprecationWarning, match="numpy.core.numeric is deprecated"):
        shim.isclose  # noqa: B018 - ordinary code still hears numpy's deprecation


def test_torch_allowlist_takes_both_spellings_and_reverts(installed: Any) -> None:
    torch = pytest.importorskip("torch")
    from torch import _weights_only_unpickler as unpickler

    original = vars(unpickler).get("_get_user_allowed_globals")
    if original is None:
        pytest.skip(f"torch {torch.__version__} has no user allowlist (refuses numpy)")
    installed.install(include=[PATCH])
    multiarray = sys.modules["numpy._core.multiarray" if NUMPY2 else "numpy.core.multiarray"]
    serialization = torch.serialization
    before = serialization.get_safe_globals()
    serialization.add_safe_globals([multiarray._reconstruct])  # torch 2.4 has no safe_globals()
    try:
        allowed = unpickler._get_user_allowed_globals()
    finally:
        serialization.clear_safe_globals()
        serialization.add_safe_globals(before)
    assert allowed["numpy.core.multiarray._reconstruct"] is multiarray._reconstruct
    assert allowed["numpy._core.multiarray._reconstruct"] is multiarray._reconstruct
    installed.uninstall([PATCH])
    assert unpickler._get_user_allowed_globals is original


def test_a_library_wrapper_over_the_torch_allowlist_survives_uninstall(installed: Any) -> None:
    """Uninstall keeps it, and ours under it then adds no second spelling; installing again
    adds them through it."""
    torch = pytest.importorskip("torch")
    from torch import _weights_only_unpickler as unpickler

    original = vars(unpickler).get("_get_user_allowed_globals")
    if original is None:
        pytest.skip(f"torch {torch.__version__} has no user allowlist (refuses numpy)")
    multiarray = sys.modules["numpy._core.multiarray" if NUMPY2 else "numpy.core.multiarray"]
    before = torch.serialization.get_safe_globals()
    torch.serialization.add_safe_globals([multiarray._reconstruct])
    try:
        installed.install(include=[PATCH])
        library = a_library_wraps(unpickler, "_get_user_allowed_globals")
        installed.uninstall([PATCH])
        assert unpickler._get_user_allowed_globals is library
        names, torchs = set(library()), set(original())
        installed.install(include=[PATCH])
        again = set(unpickler._get_user_allowed_globals())
        installed.uninstall([PATCH])
    finally:
        unpickler._get_user_allowed_globals = original
        torch.serialization.clear_safe_globals()
        torch.serialization.add_safe_globals(before)
    assert names == torchs  # torch's own answer
    twin = "numpy.core.multiarray._reconstruct" if NUMPY2 else "numpy._core.multiarray._reconstruct"
    assert twin not in names and twin in again


# -- numpy.random: the numpy-1 adapter, in this process ------------------------------------------
def _random_pickle() -> Any:
    import numpy.random._pickle as module

    return module


def _ctor(name: str) -> Any:
    return vars(_random_pickle())[f"__{name}_ctor"]


@pytest.mark.skipif(NUMPY2, reason="numpy 2's ctors take classes and bit generators already")
def test_numpy1_ctors_take_numpy2_arguments_and_keep_their_names(installed: Any) -> None:
    import pickle

    original = {n: _ctor(n) for n in ("bit_generator", "generator", "randomstate")}
    with pytest.raises(ValueError, match="is not a known BitGenerator"):
        original["bit_generator"](np.random.PCG64)
    installed.install(include=[PATCH])
    wrapped = {n: _ctor(n) for n in original}
    for name, ctor in wrapped.items():
        assert ctor is not original[name] and ctor.__wrapped__ is original[name]
        assert (ctor.__module__, ctor.__qualname__) == ("numpy.random._pickle", f"__{name}_ctor")
    bit_generator = wrapped["bit_generator"](np.random.PCG64)
    assert isinstance(bit_generator, np.random.PCG64)
    bit_generator.__setstate__((np.random.PCG64(5).state, np.random.SeedSequence(5)))
    generator = wrapped["generator"](bit_generator)
    assert type(generator.bit_generator) is np.random.PCG64  # numpy's own class inside
    assert generator.bit_generator.state == np.random.PCG64(5).state
    assert (
        type(wrapped["randomstate"]("MT19937", wrapped["bit_generator"])) is np.random.RandomState
    )
    # written while armed: numpy's own names, loadable without compatshim
    data = pickle.dumps({"g": np.random.default_rng(3), "b": bit_generator}, protocol=2)
    assert b"compatshim" not in data
    installed.uninstall([PATCH])
    assert {n: _ctor(n) for n in original} == original
    loaded = pickle.loads(data)
    assert type(loaded["b"]) is np.random.PCG64 and loaded["b"].state == bit_generator.state
    with pytest.raises(ValueError, match="is not a known BitGenerator"):
        _ctor("bit_generator")(np.random.PCG64)


@pytest.mark.skipif(NUMPY2, reason="numpy 1's ctors")
def test_a_library_wrapper_over_a_numpy1_ctor_survives_uninstall(installed: Any) -> None:
    """Uninstall keeps it, and ours under it then acts as numpy's; installing again arms it."""
    module = _random_pickle()
    original = _ctor("bit_generator")
    installed.install(include=[PATCH])
    try:
        library = a_library_wraps(module, "__bit_generator_ctor")
        installed.uninstall([PATCH])
        assert _ctor("bit_generator") is library
        with pytest.raises(ValueError, match="is not a known BitGenerator"):
            library(np.random.PCG64)
        installed.install(include=[PATCH])
        assert isinstance(_ctor("bit_generator")(np.random.PCG64), np.random.PCG64)
        assert status_row(PATCH).applied
        installed.uninstall([PATCH])
    finally:
        setattr(module, "__bit_generator_ctor", original)


@pytest.mark.skipif(not NUMPY2, reason="numpy 1's ctors")
def test_numpy2_ctors_are_left_alone(installed: Any) -> None:
    before = {n: _ctor(n) for n in ("bit_generator", "generator", "randomstate")}
    installed.install(include=[PATCH])
    assert {n: _ctor(n) for n in before} == before


# -- compatshim's loader: builtins.bytes and numpy.random attacks --------------------------------
class _Reduce:
    """Pickles as ``func(*args)`` then BUILD ``state``: any call a file can ask for."""

    def __init__(self, func: Any, args: tuple[Any, ...], *state: Any) -> None:
        self.reduced = (func, args, *state)

    def __reduce__(self) -> Any:
        return self.reduced


def _load(value: Any, **kwargs: Any) -> Any:
    import io
    import pickle

    from compatshim.checkpoint import load

    return load(io.BytesIO(pickle.dumps(value, protocol=2)), **kwargs)


CALLS: list[Any] = []


def _record(*args: Any) -> Any:
    """A callable a careless ``allow=`` admits: the attacks must never reach it."""
    CALLS.append(args)
    return np.random.PCG64(0)


@pytest.mark.parametrize("protocol", [0, 1, 2])
def test_empty_bytes_and_empty_arrays_load(protocol: int) -> None:
    import io
    import pickle

    from compatshim.checkpoint import load

    value = {"b": b"", "x": b"ab", "f8": np.zeros(0), "i8": np.zeros((0, 2), np.int64)}
    loaded = load(io.BytesIO(pickle.dumps(value, protocol=protocol)))
    assert loaded["b"] == b"" and loaded["x"] == b"ab"
    assert loaded["f8"].dtype == np.float64 and loaded["i8"].shape == (0, 2)


@pytest.mark.parametrize("args", [(10**12,), ([1, 2],), ("ab", "latin1"), (b"ab",)])
def test_bytes_with_arguments_is_refused(args: tuple[Any, ...]) -> None:
    from compatshim.checkpoint import UnsafeCheckpointError

    with pytest.raises(UnsafeCheckpointError, match="bytes called with arguments"):
        _load(_Reduce(bytes, args))


def _attacks() -> dict[str, Any]:
    import collections
    import os

    bit_generator_ctor, generator_ctor = _ctor("bit_generator"), _ctor("generator")
    randomstate_ctor = _ctor("randomstate")
    seed_sequence = vars(np.random.bit_generator)["__pyx_unpickle_SeedSequence"]
    return {
        "class that is no bit generator": _Reduce(bit_generator_ctor, (np.random.SeedSequence,)),
        "allowed builtin class": _Reduce(bit_generator_ctor, (collections.OrderedDict,)),
        "name of no bit generator": _Reduce(bit_generator_ctor, ("SeedSequence",)),
        "dotted name": _Reduce(bit_generator_ctor, ("os.system",)),
        "generator with another ctor": _Reduce(generator_ctor, ("PCG64", _record)),
        "randomstate with another ctor": _Reduce(randomstate_ctor, ("MT19937", _record)),
        "generator over a callable": _Reduce(generator_ctor, (_record,)),
        "os.system": _Reduce(bit_generator_ctor, (os.system,)),
        "seed sequence of another class": _Reduce(
            seed_sequence, (collections.OrderedDict, 0, None)
        ),
    }


@pytest.mark.parametrize("attack", sorted(_attacks()))
def test_numpy_random_ctor_attacks_are_refused_without_side_effects(attack: str) -> None:
    from compatshim.checkpoint import UnsafeCheckpointError

    CALLS.clear()
    import os

    allow = [_record, os.system]  # what numpy's own ctors would call, were they called
    with pytest.raises(UnsafeCheckpointError):
        _load(_attacks()[attack], allow=allow)
    assert CALLS == []


def _bad_states() -> dict[str, Any]:
    mt = np.random.MT19937(1).state
    pcg = np.random.PCG64(1).state
    short_key = {**mt, "state": {**mt["state"], "key": mt["state"]["key"][:10]}}
    return {
        "short MT19937 key": (np.random.MT19937, short_key),
        "PCG64 state past 128 bits": (
            np.random.PCG64,
            {**pcg, "state": {**pcg["state"], "state": 2**200}},
        ),
        "state of another generator": (np.random.PCG64, np.random.SFC64(1).state),
        "extra field": (np.random.PCG64, {**pcg, "seed": 1}),
        "seed sequence of another type": (np.random.PCG64, (pcg, "entropy")),
    }


@pytest.mark.parametrize("case", sorted(_bad_states()))
def test_bit_generator_state_is_checked_before_numpy_sees_it(case: str) -> None:
    from compatshim.checkpoint import CheckpointError

    cls, state = _bad_states()[case]
    with pytest.raises(CheckpointError, match=r"numpy\.random"):
        _load(_Reduce(_ctor("bit_generator"), (cls.__name__,), state))


def test_seed_sequence_state_is_checked_and_rebuilt() -> None:
    from compatshim.checkpoint import CheckpointError

    unpickle = vars(np.random.bit_generator)["__pyx_unpickle_SeedSequence"]
    good = np.random.SeedSequence(7, spawn_key=(1, 2), n_children_spawned=3)
    loaded = _load(good)
    assert type(loaded) is np.random.SeedSequence
    assert (loaded.entropy, loaded.spawn_key, loaded.n_children_spawned) == (7, (1, 2), 3)
    assert loaded.generate_state(4).tolist() == good.generate_state(4).tolist()
    for entropy in (np.int64(5), np.array([1, 2, 3]), [1, np.uint32(2)], (4, 5), 2**200):
        given = np.random.SeedSequence(entropy, spawn_key=(np.int64(1),))  # kept as given
        assert _load(given).generate_state(4).tolist() == given.generate_state(4).tolist()
    pool = good.pool
    huge = (7, 0, pool, 10**9, ())  # pool_size would allocate 4 GB
    forged = (7, 0, pool + 1, 4, ())  # a pool that does not follow from the entropy
    for state in (huge, forged, (None, 0, pool, 4, ()), (7, 0, pool, 4)):
        with pytest.raises(CheckpointError, match="SeedSequence"):
            _load(_Reduce(unpickle, (np.random.SeedSequence, 0, None), state))


def test_numpy_random_objects_per_file_are_bounded() -> None:
    from compatshim.checkpoint import CheckpointError, _numpy

    ctor = _ctor("bit_generator")
    fits = [_Reduce(ctor, ("MT19937",)) for _ in range(_numpy.MAX_RANDOM_OBJECTS // 8)]
    assert len(_load(fits)) == len(fits)
    for name, count in (("SFC64", _numpy.MAX_RANDOM_OBJECTS + 1), ("MT19937", len(fits) + 1)):
        with pytest.raises(CheckpointError, match=r"numpy\.random objects"):
            _load([_Reduce(ctor, (name,)) for _ in range(count)])


def test_legacy_randomstate_ctor_of_numpy_before_1_17() -> None:
    """numpy < 1.17 pickled RandomState as ``numpy.random.__RandomState_ctor()`` + get_state()."""
    legacy = np.random.RandomState(11)
    legacy.standard_normal(1)
    ctor = vars(np.random)["__RandomState_ctor"]
    loaded = _load(_Reduce(ctor, (), legacy.get_state()))
    assert type(loaded) is np.random.RandomState
    assert loaded.standard_normal(3).tolist() == legacy.standard_normal(3).tolist()


@pytest.mark.parametrize("name", ["numpy-2.4.6.random.p2.pkl", "numpy-1.26.4.random.p5.pkl"])
def test_mutated_random_fixtures_raise_only_library_errors(name: str) -> None:
    import io
    import random

    from compatshim.checkpoint import CheckpointError, load

    base = (FIXTURES / name).read_bytes()
    rng = random.Random(name)
    for _ in range(200):
        mutant = bytearray(base)
        for _ in range(rng.randint(1, 4)):
            mutant[rng.randrange(len(mutant))] = rng.randrange(256)
        with contextlib.suppress(CheckpointError):  # UnsafeCheckpointError is one too
            load(io.BytesIO(bytes(mutant[: rng.randint(len(mutant) // 2, len(mutant))])))
