"""The deny list judges objects, not the names they report (issue 37, item 1).

``functools.reduce`` reports ``_functools``: ``allow=[functools.reduce]`` or
``COMPATSHIM_ALLOW=_functools.reduce`` admitted it, and a file then handed the checked
``getattr`` rule to it (reduce calls its first argument freely): code ran. Every spelling of
every denied object that this process can reach, through every allow source, is refused
here; so is a module object, a callable whose name does not lead back to it, and any rule
global handed to a callable the caller allowed.
"""

from __future__ import annotations

import functools
import io
import pickle
import subprocess
import sys
import textwrap
import types
from pathlib import Path
from typing import Any, Iterator

import pytest

torch = pytest.importorskip("torch")

import compatshim  # noqa: E402
from compatshim.checkpoint import _gate, deny, inspect, load, process_allow  # noqa: E402
from compatshim.checkpoint import allow as allow_process  # noqa: E402
from compatshim.checkpoint.errors import UnsafeCheckpointError  # noqa: E402

pytestmark = pytest.mark.usefixtures("process_allow_cleared")


def _gadgets() -> dict[str, Any]:
    """The single-allow routes to code, files, threads or the network the attack round named,
    as objects of this process (imported here: the test's process, not the loader's)."""
    import _thread
    import atexit
    import ctypes
    import doctest
    import logging.config
    import pkgutil
    import posixpath
    import pydoc

    import torch.fx.graph_module

    found: dict[str, Any] = {
        "functools.reduce": functools.reduce,
        "types.FunctionType": types.FunctionType,
        "types.CodeType": types.CodeType,
        "ctypes.memmove": ctypes.memmove,
        "builtins.exit": exit,  # type: ignore[name-defined]  # site's Quitter
        "posixpath.os": posixpath.os,
        "sys.modules.get": sys.modules.get,
        "torch.from_file": torch.from_file,
        "torch._utils._import_dotted_name": torch._utils._import_dotted_name,
        "torch._C.import_ir_module": torch._C.import_ir_module,
        "torch._C._load_for_lite_interpreter": torch._C._load_for_lite_interpreter,
        "torch.fx.graph_module._exec_with_source": torch.fx.graph_module._exec_with_source,
        "pkgutil.resolve_name": pkgutil.resolve_name,
        "pydoc.locate": pydoc.locate,
        "pydoc.pipepager": pydoc.pipepager,
        "doctest.debug_script": doctest.debug_script,
        "logging.config.dictConfig": logging.config.dictConfig,
        "atexit.register": atexit.register,
        "_thread.start_new_thread": _thread.start_new_thread,
        "_imp.create_dynamic": sys.modules["_imp"].create_dynamic,
        "_frozen_importlib.import_module": sys.modules["_frozen_importlib"]._gcd_import,
        "_socket.socket": sys.modules["_socket"].socket,
    }
    if hasattr(torch, "package"):
        import torch.package

        found["torch.package.PackageImporter"] = torch.package.PackageImporter
    return found


def _spellings(obj: Any) -> set[str]:
    """Every ``module.name`` that is ``obj`` in a module imported now (the attribute aliases,
    C modules and re-exports), its reported name, and ``__builtin__`` for builtins."""
    names = set()
    for module_name, module in list(sys.modules.items()):
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict) or module_name.startswith("tests."):
            continue
        for attr, value in list(namespace.items()):
            if value is obj:
                names.add(f"{module_name}.{attr}")
    reported = (getattr(obj, "__module__", None), getattr(obj, "__qualname__", None))
    if all(isinstance(part, str) for part in reported):
        names.add(".".join(reported))  # type: ignore[arg-type]
    names = {n for n in names if _leads_to(n) is obj}  # a name that leads elsewhere is no spelling
    names |= {"__builtin__." + n[len("builtins.") :] for n in names if n.startswith("builtins.")}
    return names


def _leads_to(name: str) -> Any:
    parts = name.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        found: Any = sys.modules.get(".".join(parts[:cut]))
        if found is not None:
            for part in parts[cut:]:
                found = getattr(found, part, None)
            return found
    return None


@pytest.fixture(scope="module")
def gadgets() -> dict[str, Any]:
    return _gadgets()


def test_every_spelling_of_every_gadget_is_dangerous_to_the_gate(gadgets: dict[str, Any]) -> None:
    """The verdict inspect and load share: dangerous, whatever allow= names it by."""
    checked = 0
    for label, obj in gadgets.items():
        spellings = _spellings(obj) or {label}  # sys.modules.get: a new bound method each time
        for spelling in spellings:
            module, _, name = spelling.rpartition(".")
            for allow in ([spelling], [obj], [(obj, "compatshim_test_safe.Thing")]):
                try:
                    verdict = _gate.judge(module, name, _gate.Allow(allow))
                except TypeError:  # no __qualname__: allow= refuses the bare object outright
                    assert not hasattr(obj, "__qualname__"), label
                    continue
                assert not verdict.admitted and verdict.dangerous, (label, spelling, allow)
                checked += 1
            assert deny.denied_entry(spelling, obj), (label, spelling)
    assert checked > 3 * len(gadgets)


@pytest.mark.filterwarnings("ignore:compatshim.*is ignored:RuntimeWarning")
def test_no_process_wide_source_admits_a_gadget(
    gadgets: dict[str, Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    spellings = sorted({s for obj in gadgets.values() for s in _spellings(obj)})
    monkeypatch.setenv("COMPATSHIM_ALLOW", ",".join(spellings))
    listed = tmp_path / "allow.txt"
    listed.write_text("\n".join(spellings) + "\n")
    monkeypatch.setenv("COMPATSHIM_ALLOW_FILE", str(listed))
    assert process_allow.allowed() == []
    for label, obj in gadgets.items():
        for entry in (obj, *_spellings(obj)):
            with pytest.raises((ValueError, TypeError)):
                allow_process(entry, reason="trust me")
        assert process_allow.allowed() == [], label


def _stack_global(module: str, name: str) -> bytes:
    return (
        b"\x80\x04"
        + pickle.dumps(module, protocol=4)[2:-1]
        + pickle.dumps(name, protocol=4)[2:-1]
        + b"\x93."
    )


@pytest.mark.parametrize("spelling", ["_functools.reduce", "posixpath.os", "builtins.function"])
def test_inspect_calls_other_spellings_dangerous_and_suggests_no_allow_line(
    tmp_path: Path, spelling: str
) -> None:
    path = tmp_path / "gadget.pkl"
    path.write_bytes(_stack_global(*spelling.rsplit(".", 1)))
    (use,) = inspect(path).globals
    assert use.dangerous and use.allow is None and not use.covered


def _apply_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A caller's own harmless-looking callable that calls what it is given (as reduce does)."""
    module = "compatshim_test_apply"
    (tmp_path / f"{module}.py").write_text("def apply(f, *args):\n    return f(*args)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return module


@pytest.fixture
def apply(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    module = _apply_module(tmp_path, monkeypatch)
    yield module
    sys.modules.pop(module, None)


def _hands_getattr(module: str) -> bytes:
    """``apply(builtins.getattr, collections.OrderedDict, 'keys')``: the checked getattr rule
    handed to the caller's callable, which calls it with any arguments."""
    return f"c{module}\napply\n(cbuiltins\ngetattr\nccollections\nOrderedDict\nVkeys\ntR.".encode()


def test_a_rule_global_is_never_handed_to_an_allowed_callable(tmp_path: Path, apply: str) -> None:
    path = tmp_path / "hand.pkl"
    path.write_bytes(_hands_getattr(apply))
    with pytest.raises(UnsafeCheckpointError, match=r"builtins\.getattr handed to"):
        load(path, allow=[f"{apply}.apply"])
    nested = tmp_path / "nested.pkl"  # inside a list: the walk follows containers
    nested.write_bytes(f"c{apply}\napply\n(c{apply}\napply\n(lcbuiltins\ngetattr\natR.".encode())
    with pytest.raises(UnsafeCheckpointError, match="handed to"):
        load(nested, allow=[f"{apply}.apply"])


def test_the_reduce_exploit_runs_no_code_under_hardened_torch_load(tmp_path: Path) -> None:
    """The attack round's chain, in a fresh interpreter: COMPATSHIM_ALLOW=_functools.reduce and
    SAFE_LOAD; reduce(getattr, ...) reaches a module's namespace and calls from it."""
    marker = tmp_path / "marker"
    # reduce(getattr, [OrderedDict, "__init__", "__class__"]): getattr called freely, any
    # attribute of any object (before: it loaded, a wrapper_descriptor; the round chained on
    # to a module's namespace and exec)
    evil = tmp_path / "evil.pt"
    evil.write_bytes(
        b"c_functools\nreduce\n(cbuiltins\ngetattr\n(lccollections\nOrderedDict\naV__init__\na"
        b"V__class__\natR."
    )
    code = textwrap.dedent(
        f"""
        import torch, compatshim
        compatshim.install(include=["torch-load-safe-globals"])
        try:
            value = torch.load({str(evil)!r}, weights_only=False)
        except Exception as exc:
            print("refused", type(exc).__name__)
        else:
            open({str(marker)!r}, "w").write(repr(type(value)))
        """
    )
    env = {"COMPATSHIM_SAFE_LOAD": "1", "COMPATSHIM_ALLOW": "_functools.reduce"}
    import os

    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=300,
    )
    assert "refused" in done.stdout, done.stdout + done.stderr
    assert not marker.exists()


def test_an_allow_string_is_not_read_letter_by_letter(tmp_path: Path) -> None:
    path = tmp_path / "x.pt"
    torch.save({"a": 1}, path)
    with pytest.raises(TypeError, match=r"allow= takes a list.*allow=\['fractions.Fraction'\]"):
        load(path, allow="fractions.Fraction")  # type: ignore[arg-type]


def test_harmless_objects_stay_admissible() -> None:
    """Do no harm: a class a denied module happens to import (torch.fx imports pathlib.Path)
    and the caller's own classes and functions are judged as themselves."""
    import fractions
    import pathlib

    for obj in (pathlib.Path, fractions.Fraction, print, len, torch.nn.Linear, compatshim.status):
        assert deny.denied_object(obj) is None, obj


@pytest.fixture
def orphan_submodule(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A package whose import failed after its submodule loaded (as triton's does where
    setuptools is missing, with torch 2.4/2.5): ``pkg.sub`` stays in ``sys.modules``, ``pkg``
    does not."""
    package = tmp_path / "compatshim_test_orphan"
    package.mkdir()
    (package / "sub.py").write_text("import os\n")
    (package / "__init__.py").write_text(
        "from . import sub\nraise ImportError('a dependency is missing')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ImportError):
        __import__("compatshim_test_orphan")
    assert "compatshim_test_orphan" not in sys.modules
    assert "compatshim_test_orphan.sub" in sys.modules
    try:
        yield "compatshim_test_orphan.sub.os"
    finally:
        sys.modules.pop("compatshim_test_orphan.sub", None)


@pytest.mark.filterwarnings("ignore:compatshim.*is ignored:RuntimeWarning")
def test_a_module_below_a_package_that_failed_to_import_is_judged_by_its_object(
    orphan_submodule: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by the matrix on torch 2.4/2.5 (``triton.backends.compiler.os``): the name was
    looked up from its top-level package only, which is not imported, so ``os`` under it was
    judged by its name and admitted by a string allow entry (inspect: needs-allow, not
    dangerous; load still refused the module object itself)."""
    module, _, name = orphan_submodule.rpartition(".")
    verdict = _gate.judge(module, name, _gate.Allow([orphan_submodule]))
    assert not verdict.admitted and verdict.dangerous, verdict
    monkeypatch.setenv("COMPATSHIM_ALLOW", orphan_submodule)
    assert process_allow.allowed() == []
    with pytest.raises(UnsafeCheckpointError, match="module"):
        load(io.BytesIO(_stack_global(module, name)), allow=[orphan_submodule])


def test_a_long_dotted_name_is_looked_up_in_linear_time() -> None:
    """Past the first missing prefix only prefixes as long as an imported module name are
    tried: a 1 MiB name of single letters and dots costs what reading it costs."""
    import time

    for top in ("collections", "compatshim_test_no_such_package"):
        name = top + "." + "a." * 500_000 + "b"
        start = time.process_time()
        assert deny.denied_global(name) is None
        assert time.process_time() - start < 2, top


def _fills(module: str, name: str, op: bytes) -> bytes:
    """``module.name`` by STACK_GLOBAL, then ``op`` on it: SETITEMS open=pathlib.Path (a dict)
    or APPEND a folder (a list)."""
    if op == b"setitems":
        body = b"(\x8c\x04open" + _stack_global("pathlib", "Path")[2:-1] + b"u"
    else:
        body = b"\x8c\x0f/tmp/nowhere/pwa"
    return _stack_global(module, name)[:-1] + body + b"."


@pytest.mark.parametrize(
    ("name", "op"), [("json.__builtins__", b"setitems"), ("json.__path__", b"append")]
)
def test_a_live_module_container_is_denied_whatever_allows_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, op: bytes
) -> None:
    """allow=["json.__builtins__"] handed the file builtins' namespace itself, and its
    SETITEMS made open() return a Path; json.__path__ plus one APPEND put a folder of the
    file's choosing on an import path (a later `import json.x` ran code from it). inspect
    offered the allow line for both."""
    import builtins
    import json

    path = tmp_path / "fills.pkl"
    path.write_bytes(_fills(*name.split("."), op))
    obj = getattr(json, name.split(".")[1])
    before = (builtins.open, list(json.__path__))
    try:
        for allowed in ([name], [(obj, name)]):
            with pytest.raises(UnsafeCheckpointError, match="live container") as caught:
                load(path, allow=allowed)
            assert "No allow entry admits" in str(caught.value)
        with pytest.raises(ValueError, match="live container"):
            allow_process(name, reason="trust me")
        (use,) = [use for use in inspect(path).globals if use.name == name]
        assert use.dangerous and use.allow is None
        assert (builtins.open, list(json.__path__)) == before
    finally:  # where the defence fails, this process must not go on with a poisoned open
        builtins.open, json.__path__[:] = before


@pytest.mark.parametrize(
    "spelling",
    [
        "torch.autograd.grad_mode.set_grad_enabled",  # is torch.set_grad_enabled
        "torch._tensor_str.set_printoptions",  # is torch.set_printoptions
    ],
)
def test_another_name_of_an_object_a_prefix_entry_denies_is_denied(spelling: str) -> None:
    """torch.set_* was judged by name: the same objects under their home module's name, or
    given as objects, were admitted, and a 40-byte file turned gradients off."""
    module, _, name = spelling.rpartition(".")
    obj = getattr(sys.modules[module], name)
    assert deny.denied_global(spelling) and deny.denied_object(obj)
    with pytest.raises(ValueError, match="denied"):
        allow_process(obj, reason="trust me")
    data = _stack_global(module, name)[:-1] + b"\x89\x85R."  # (False,) REDUCE
    grad = torch.is_grad_enabled()
    with pytest.raises(UnsafeCheckpointError, match="denied"):
        load(io.BytesIO(data), allow=[obj])
    assert torch.is_grad_enabled() == grad


def test_a_prefix_entry_judges_callables_live_and_leaves_constants_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The identity check of a prefix entry also caught constants (uuid._AIX is False, so
    None, True, 1 and typing.TYPE_CHECKING read denied), and its cache missed an object
    given to a covered name after the first look."""
    assert deny.denied_object(None) is None and deny.denied_object(True) is None
    assert deny.denied_global("typing.TYPE_CHECKING") is None
    assert deny.denied_object(torch.set_grad_enabled) is not None  # the cache is made

    def hook(*args: Any) -> None:
        """A caller's own function."""

    module = types.ModuleType("compatshim_test_hook")
    module.hook = hook  # type: ignore[attr-defined]
    hook.__module__, hook.__qualname__ = module.__name__, "hook"
    monkeypatch.setitem(sys.modules, module.__name__, module)
    assert deny.denied_object(hook) is None
    monkeypatch.setattr(torch, "set_warn_always", hook)  # the same names, another object
    assert deny.denied_object(hook) is not None


def test_no_refusal_advises_allowing_an_object_the_deny_list_refuses() -> None:
    """The patched torch.load's advice judged names alone: for json.__builtins__ (denied as
    an object) it said "COMPATSHIM_ALLOW=json.__builtins__" right after "cannot be allowed"."""
    from compatshim.patches._safe_pickle import how_to_allow

    for name in ("json.__builtins__", "torch.autograd.grad_mode.set_grad_enabled"):
        advice = how_to_allow((name,))
        assert "may be malicious" in advice and "COMPATSHIM_ALLOW" not in advice, advice
    assert "COMPATSHIM_ALLOW=types.SimpleNamespace" in how_to_allow(("types.SimpleNamespace",))
