"""The deny list: no allow source (allow=, allow(), COMPATSHIM_ALLOW, the allow file, entry
points) can admit a known-dangerous global, by name or by the object's own name; inspect
says so; the allow file is read only when it is a regular file."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from compatshim import checkpoint  # noqa: E402
from compatshim.checkpoint import deny  # noqa: E402

DENIED = "denied (cannot be allowed)"


pytestmark = pytest.mark.usefixtures("process_allow_cleared")


def _calls(module: str, name: str, argument: str) -> bytes:
    """A protocol-0 pickle calling ``module.name(argument)``: what a hostile file writes."""
    assert "\n" not in argument and "\\" not in argument
    return f"c{module}\n{name}\n(V{argument}\ntR.".encode()


@pytest.fixture
def payload(tmp_path: Path) -> tuple[Path, Path]:
    """A file whose ``builtins.eval`` would create ``marker``."""
    marker = tmp_path / "marker"
    path = tmp_path / "eval.pkl"
    path.write_bytes(_calls("builtins", "eval", f"open({str(marker)!r}, 'w').write('ran')"))
    return path, marker


def _refused_as_denied(path: Path, marker: Path, **kwargs: Any) -> None:
    with pytest.raises(checkpoint.UnsafeCheckpointError, match=r"denied \(cannot be allowed\)"):
        checkpoint.load(path, **kwargs)
    assert not marker.exists()


@pytest.mark.parametrize("entry", ["builtins.eval", eval, (eval, "builtins.eval")])
def test_allow_argument_cannot_admit_eval(payload: tuple[Path, Path], entry: Any) -> None:
    _refused_as_denied(*payload, allow=[entry])


def test_an_object_is_judged_by_its_own_name_not_the_alias(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    path = tmp_path / "alias.pkl"
    path.write_bytes(_calls("mymodule", "safe", f"open({str(marker)!r}, 'w').write('ran')"))
    _refused_as_denied(path, marker, allow=[(eval, "mymodule.safe")])
    _refused_as_denied(path, marker, allow=[(os.system, "mymodule.safe")])


def test_code_source_refuses_denied_entries_at_once() -> None:
    for entry in ("builtins.eval", eval, os.system, "subprocess.Popen", "builtins.getattr"):
        with pytest.raises(ValueError, match=r"denied \(cannot be allowed\)"):
            checkpoint.allow(entry, reason="trust me")
    assert checkpoint.allowed() == []


def test_environment_cannot_admit_eval(
    payload: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COMPATSHIM_ALLOW", "builtins.eval,fractions.Fraction")
    _refused_as_denied(*payload)  # the deny list comes first: no source is even read
    with pytest.warns(RuntimeWarning, match="builtins.eval"):
        assert [e.qualname for e in checkpoint.allowed()] == ["fractions.Fraction"]


def test_allow_file_cannot_admit_eval(
    payload: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    listed = tmp_path / "allow.txt"
    listed.write_text("builtins.eval  # I promise\n__builtin__.eval\n")
    monkeypatch.setenv("COMPATSHIM_ALLOW_FILE", str(listed))
    _refused_as_denied(*payload)
    with pytest.warns(RuntimeWarning, match="builtins.eval"):
        assert checkpoint.allowed() == []


def test_a_string_entry_that_imports_as_a_denied_object_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = "compatshim_test_deny_alias"
    (tmp_path / f"{module}.py").write_text("run = eval\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("COMPATSHIM_ALLOW", f"{module}.run")
    marker = tmp_path / "marker"
    path = tmp_path / "alias.pkl"
    path.write_bytes(_calls(module, "run", f"open({str(marker)!r}, 'w').write('ran')"))
    try:
        _refused_as_denied(path, marker)
    finally:
        sys.modules.pop(module, None)


def test_entry_points_cannot_admit_exec(
    payload: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = "compatshim_test_deny_entries"
    (tmp_path / f"{module}.py").write_text(
        'ENTRIES = ["builtins.eval", ("subprocess.run", "why not"), "fractions.Fraction"]\n'
    )
    info = tmp_path / "compatshim_test_deny-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: compatshim-test-deny\nVersion: 1.0\n"
    )
    (info / "entry_points.txt").write_text(f"[compatshim.allow]\nlisted = {module}:ENTRIES\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    try:
        _refused_as_denied(*payload)
        with pytest.warns(RuntimeWarning, match="builtins.eval"):
            assert [e.qualname for e in checkpoint.allowed()] == ["fractions.Fraction"]
    finally:
        sys.modules.pop(module, None)


def test_the_patched_torch_load_honours_the_deny_list(
    payload: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    import pickle

    from packaging.version import Version

    import compatshim

    if Version(torch.__version__.split("+")[0]) < Version("2.6"):
        pytest.skip("torch < 2.6 loads weights_only=False by default: armed, the patch is off")

    monkeypatch.setenv("COMPATSHIM_ALLOW", "builtins.eval")
    compatshim.uninstall(["torch-load-safe-globals"])
    compatshim.install(include=["torch-load-safe-globals"])
    path, marker = payload
    try:
        with pytest.raises(pickle.UnpicklingError) as refused:
            torch.load(path, weights_only=True)  # the default from torch 2.6 on
        # torch's own refusal comes back as it was, with compatshim's verdict in a note
        told = str(refused.value) + "".join(getattr(refused.value, "__notes__", []))
        assert "denied (cannot be allowed)" in told, told
    finally:
        compatshim.uninstall(["torch-load-safe-globals"])
    assert not marker.exists()


def test_allowing_getattr_hands_back_no_live_loader(tmp_path: Path) -> None:
    """``getattr(torch.storage._load_from_bytes, '__call__')`` is torch.load(weights_only=
    False) as a bound method: allow=["builtins.getattr"] used to hand it back."""
    path = tmp_path / "getattr.pkl"
    path.write_bytes(
        b"\x80\x02cbuiltins\ngetattr\nctorch.storage\n_load_from_bytes\n"
        b"X\x08\x00\x00\x00__call__\x86R."
    )
    for allow in (["builtins.getattr"], [getattr], [(getattr, "builtins.getattr")]):
        with pytest.raises(checkpoint.UnsafeCheckpointError, match="getattr"):
            checkpoint.load(path, allow=allow)


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "compatshim", "inspect", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_inspect_says_denied_whatever_is_allowed(
    payload: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    path, _ = payload
    monkeypatch.setenv("COMPATSHIM_ALLOW", "builtins.eval")
    checkpoint.allow("fractions.Fraction", reason="unrelated")
    (use,) = checkpoint.inspect(path).globals
    assert use.name == "builtins.eval" and not use.covered and use.allowed_by is None
    assert use.dangerous == deny.DENIED["builtins.eval"] and use.allow is None
    env = {**os.environ, "COMPATSHIM_ALLOW": "builtins.eval"}
    human = _cli(str(path), env=env)
    assert human.returncode == 3 and f"{DENIED}: {use.dangerous}" in human.stdout
    assert "allowed process-wide" not in human.stdout
    data = json.loads(_cli(str(path), "--json", env=env).stdout)
    assert data["loadable"] is False and data["globals"][0]["allowed_by"] is None


def test_the_deny_list_is_the_one_table() -> None:
    """inspect's gadget list and the patch's advice are this table (no second list)."""
    from compatshim.checkpoint import _inspect
    from compatshim.patches import torch_load_safe_globals as patch

    assert isinstance(getattr(_inspect, "DANGEROUS", ""), str)  # a severity, not a second list
    assert not hasattr(patch, "_NEVER_ADVISED")
    assert "may be malicious" in patch._how_to_allow(("posix.system",))
    assert "COMPATSHIM_ALLOW=" in patch._how_to_allow(("mypackage.Config",))
    for name in ("os.system", "posix.system", "nt.system", "subprocess.Popen", "os"):
        assert deny.denied(name), name
    for name in ("pickle.loads", "_pickle.load", "marshal.loads", "importlib.import_module"):
        assert deny.denied(name), name
    for name in ("__builtin__.eval", "builtins.exec", "builtins.__import__", "runpy.run_path"):
        assert deny.denied(name), name
    for name in ("ossified.Thing", "system.x", "iopath.PathManager", "torch.nn.Linear"):
        assert deny.denied(name) is None, name
    assert deny.denied_object(os.system) and deny.denied_object(eval)
    assert deny.denied_object(Path) is None
    import numpy

    # numpy 2 serves recarray lazily (module __getattr__): a name that leads nowhere in vars()
    # is no lie, so the class is judged as itself, under both core spellings
    assert deny.denied_object(numpy.recarray) is None
    assert deny.denied_global("numpy.core.records.recarray") is None


def test_a_fifo_allow_file_is_not_read(tmp_path: Path) -> None:
    """A FIFO named by COMPATSHIM_ALLOW_FILE used to block every load that consulted it."""
    fifo = tmp_path / "allow.fifo"
    os.mkfifo(fifo)
    code = textwrap.dedent(
        """
        import io, warnings, fractions, torch
        from compatshim import checkpoint
        buffer = io.BytesIO(); torch.save(fractions.Fraction(1, 2), buffer); buffer.seek(0)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            try:
                checkpoint.load(buffer)
            except checkpoint.UnsafeCheckpointError as exc:
                print("refused", exc.refused)
        print([str(w.message) for w in seen])
        """
    )
    env = {**os.environ, "COMPATSHIM_ALLOW_FILE": str(fifo)}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "refused ('fractions.Fraction',)" in done.stdout
    assert "not a regular file" in done.stdout


def test_judging_a_long_hostile_name_is_linear() -> None:
    """A file may name a 1 MiB module of 500 000 dots: the check stays linear in its length."""
    import time

    started = time.perf_counter()
    assert deny.denied("a." * 500_000 + "b") is None
    assert deny.denied("os." + "a." * 500_000 + "b")
    assert deny.denied("x" * (1 << 20) + ".y") is None
    assert time.perf_counter() - started < 2.0


def test_set_obj_state_cannot_rewrite_a_class_even_when_allowed(tmp_path: Path) -> None:
    """``torch._utils._set_obj_state(obj, state)`` runs ``setattr(obj, k, v)`` for every
    entry: allowed, a file reaches a class the allowlist admits and rewrites it for the whole
    process (global state). The deny list refuses it whatever allows it."""
    import argparse
    import pickle

    class _Rewrite:  # argparse.Namespace: an allowlisted Python class, so a mutable one
        def __reduce__(self) -> Any:
            return (torch._utils._set_obj_state, (argparse.Namespace, {"pwned": 1}))

    path = tmp_path / "c.pt"
    path.write_bytes(pickle.dumps(_Rewrite(), protocol=2))
    with pytest.raises(checkpoint.UnsafeCheckpointError, match="_set_obj_state"):
        checkpoint.load(path, allow=["torch._utils._set_obj_state"])
    assert "pwned" not in vars(argparse.Namespace)
