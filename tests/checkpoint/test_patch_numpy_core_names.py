"""``numpy-core-names``: pickles cross the numpy 1.x / 2.x line in both directions.

The fixtures in ``numpy_fixtures/`` were written under numpy 1.24, 1.26 and
2.4 by ``numpy_fixtures/make_fixtures.py``; ``numpy_fixtures/read_fixtures.py``
reads each through pickle, torch.load (both ``weights_only``) and
compatshim.checkpoint.load in a fresh ``python -W error``, with the patch
installed before or after numpy and torch are imported, or not at all.
"""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

np = pytest.importorskip("numpy")

FIXTURES = Path(__file__).resolve().parent / "numpy_fixtures"
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
    protocol5 = [k for k in plain["results"] if _other_numpy(k) and ".p5." in k]
    assert protocol5 and all(k in failed for k in protocol5)
    expected = "DeprecationWarning: numpy.core.numeric" if NUMPY2 else "ModuleNotFoundError"
    assert all(expected in failed[k] for k in protocol5), failed


@pytest.mark.parametrize("order", ["before", "after"])
def test_with_the_patch_every_route_loads_equal_values(order: str) -> None:
    patched = read_fixtures("--patched", order)
    assert patched["results"] and set(patched["results"].values()) == {"ok"}, patched["results"]
    if not NUMPY2:
        assert patched["identical"] == dict.fromkeys(patched["identical"], True)


def test_import_numpy_is_unchanged_until_a_pickle_asks(plain: dict[str, Any]) -> None:
    patched = read_fixtures("--patched", "before")
    for fact in ("numpy._core attribute before any load", "numpy._core imported before any load"):
        assert patched[fact] == plain[fact]


@pytest.fixture
def installed() -> Any:
    import compatshim

    compatshim.uninstall([PATCH])
    yield compatshim
    compatshim.uninstall([PATCH])


def _row(compatshim: Any) -> Any:
    (row,) = [r for r in compatshim.status() if r.name == PATCH]
    return row


def test_install_is_idempotent_and_uninstall_exact(installed: Any) -> None:
    import pickle

    from compatshim import _import_hooks

    meta_path = list(sys.meta_path)
    modules = set(sys.modules)
    assert installed.install(include=[PATCH]) == [PATCH]
    assert installed.install(include=[PATCH]) == [PATCH]
    row = _row(installed)
    assert row.applied and row.fixed and row.applied_targets == ["numpy"]
    other = sorted(p for p in FIXTURES.glob("numpy-*.plain.p5.pkl") if _other_numpy(p.name))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for path in other:
            pickle.loads(path.read_bytes())
    installed.uninstall([PATCH])
    assert [f for f in sys.meta_path if type(f).__name__ == "AliasFinder"] == []
    assert "numpy.core.numeric" not in _import_hooks.watched()
    created = set(sys.modules) - modules
    aliases = [m for m in created if any(sys.modules[m] is sys.modules[o] for o in modules)]
    assert aliases == []  # numpy 1.26's own numpy._core stubs may stay: they are real modules
    if NUMPY2:
        shim = sys.modules.get("numpy.core.numeric")
        if shim is not None:
            assert "_frombuffer" not in vars(shim)
    assert sys.meta_path == meta_path


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
