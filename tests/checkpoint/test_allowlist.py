"""The allowlist: well-formed entries, resolution without surprises."""

from __future__ import annotations

import enum
import subprocess
import sys
import warnings

import pytest

from compatshim.checkpoint import allowlist
from compatshim.checkpoint.allowlist import KINDS, Entry, entries, lookup


def test_every_entry_is_well_formed() -> None:
    seen = set()
    for entry in entries():
        assert isinstance(entry, Entry)
        assert entry.kind in KINDS, entry
        assert entry.reason and len(entry.reason) < 160, entry
        assert entry.qualname not in seen, entry  # the index is by qualname
        seen.add(entry.qualname)


def test_every_callable_entry_has_a_checked_handler() -> None:
    from compatshim.checkpoint._safe import HANDLERS

    missing = [
        e.qualname
        for e in entries()
        if e.kind in ("constructor", "rebuild") and e.key not in HANDLERS
    ]
    assert not missing
    keys = {e.key for e in entries()}
    assert not [k for k in HANDLERS if k not in keys], "a handler for no entry"


def test_applicable_entries_resolve_here() -> None:
    """Every applicable callable resolves; constants may be missing (dtypes differ by release)."""
    unresolved = []
    for entry in entries():
        if entry.distribution in ("torch", "numpy", None) and entry.applies():
            try:
                entry.resolve()
            except LookupError as exc:
                if entry.kind != "constant":
                    unresolved.append(f"{entry.qualname}: {exc}")
    assert not unresolved


def test_numpy_names_of_both_majors_resolve_to_this_numpy_without_warnings() -> None:
    np = pytest.importorskip("numpy")

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        objects = {
            lookup(core + ".multiarray", "_reconstruct").resolve()  # type: ignore[union-attr]
            for core in ("numpy.core", "numpy._core")
        }
    assert len(objects) == 1
    running = "numpy._core" if int(np.__version__.split(".")[0]) >= 2 else "numpy.core"
    assert objects.pop().__module__.startswith((running, "numpy"))


def test_uninstalled_distribution_is_reported_not_imported() -> None:
    entry = lookup("deepspeed.runtime.zero.config", "ZeroStageEnum")
    assert entry is not None and entry.kind == "enum"
    if entry.applies():
        pytest.skip("deepspeed is installed here")
    with pytest.raises(LookupError, match="deepspeed is not installed"):
        entry.resolve()
    assert "deepspeed" not in sys.modules


def test_importing_the_package_imports_neither_torch_nor_numpy() -> None:
    code = (
        "import sys, compatshim.checkpoint, compatshim.checkpoint.allowlist\n"
        "assert 'torch' not in sys.modules and 'numpy' not in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_omegaconf_entries_are_built_by_the_checked_builder_only() -> None:
    """omegaconf classes are ``instance`` entries built by ``_omegaconf.py`` (never their
    ``__setstate__``)."""
    found = [e for e in entries() if e.module.startswith("omegaconf")]
    assert found
    assert all(e.kind == "instance" for e in found), found
    assert "omegaconf" in (allowlist.__doc__ or "")


class Colour(enum.Enum):
    RED = 1


def test_allowed_enum_returns_the_member_and_never_sets_state(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import pickle

    from compatshim.checkpoint import UnsafeCheckpointError, load

    path = tmp_path / "e.pkl"
    path.write_bytes(pickle.dumps({"c": Colour.RED}, protocol=2))
    assert load(path, allow=[Colour])["c"] is Colour.RED
    member = pickle.dumps(Colour.RED, protocol=2)[:-1]
    path.write_bytes(member + b"}X\x05\x00\x00\x00_may_X\x01\x00\x00\x00xsb.")
    with pytest.raises(UnsafeCheckpointError, match="BUILD"):
        load(path, allow=[Colour])
    assert not hasattr(Colour.RED, "_may_")
