"""The deny list against public gadget corpora, and objects an allow entry must not reach.

``GHSA_GADGETS``: every global that picklescan's own test samples (mmaitre314/picklescan,
``tests/data`` and ``tests/data2``: one file per GitHub security advisory of a scanner
bypass) use to run code, fetched and scanned 2026-12-05. Each was "needs-allow" here, so
``inspect``/``scan`` printed the ``COMPATSHIM_ALLOW=`` line that ran the file's code. Each
is denied now: no allow source admits it, and the scan calls a file naming it dangerous.
The samples themselves are not committed; the names are.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from compatshim.checkpoint import UnsafeCheckpointError, inspect, load
from compatshim.checkpoint._inspect import DANGEROUS
from compatshim.checkpoint.deny import denied_global, denied_object
from tests.checkpoint.corpus import P2, STOP, g, u

pytestmark = pytest.mark.timeout(300)
SRC = str(Path(__file__).resolve().parents[2] / "src")

GHSA_GADGETS = (
    "_aix_support._read_cmd_output",
    "_osx_support._read_output",
    "_pyrepl.pager.pipe_pager",
    "aiohttp.client.ClientSession",
    "asyncio.unix_events._UnixSubprocessTransport._start",
    "code.InteractiveInterpreter.runcode",
    "distutils.file_util.write_file",
    "ensurepip._run_pip",
    "http.client.HTTPSConnection",
    "idlelib.autocomplete.AutoComplete.fetch_completions",
    "idlelib.autocomplete.AutoComplete.get_entity",
    "idlelib.calltip.Calltip.fetch_tip",
    "idlelib.calltip.get_entity",
    "idlelib.debugobj.ObjectTreeItem.SetText",
    "idlelib.pyshell.ModifiedInterpreter.runcode",
    "idlelib.pyshell.ModifiedInterpreter.runcommand",
    "idlelib.run.Executive.runcode",
    "imaplib.IMAP4_stream",
    "lib2to3.pgen2.grammar.Grammar.loads",
    "lib2to3.pgen2.pgen.ParserGenerator.make_label",
    "logging.FileHandler",
    "numpy.f2py.crackfortran.getlincoef",
    "requests.api.get",
    "ssl.get_server_certificate",
    "test.support.script_helper.assert_python_ok",
    "torch._dynamo.guards.GuardBuilder.get",
    "torch._inductor.codecache.compile_file",
    "torch.fx.experimental.symbolic_shapes.ShapeEnv.evaluate_guards_expression",
    "torch.utils._config_module.ConfigModule.load_config",
    "torch.utils.bottleneck.__main__.run_autograd_prof",
    "torch.utils.bottleneck.__main__.run_cprofile",
    "torch.utils.collect_env.run",
    "torch.utils.collect_env.run_and_read_all",
    "torch.utils.data.datapipes.utils.decoder.basichandlers",
    "urllib.request.urlopen",
    "uuid._get_command_stdout",
    "venv.create",
)


@pytest.mark.parametrize("name", GHSA_GADGETS)
def test_each_corpus_gadget_is_denied(name: str, tmp_path: Path) -> None:
    assert denied_global(name), name
    module, _, attr = name.rpartition(".")
    path = tmp_path / "gadget.pkl"
    path.write_bytes(P2 + g(module, attr) + u("x") + b"\x85R" + STOP)
    assert inspect(path).severity == DANGEROUS
    with pytest.raises(UnsafeCheckpointError, match="denied"):
        load(path, allow=[name])


#: Gadgets no corpus used yet, found 2026-12-06 by offering the stdlib's, numpy's, torch's,
#: omegaconf's and hydra's file, process and global-state calls as allow entries: each was
#: admitted by one ``allow=`` entry (``pathlib.Path.write_text`` wrote any file).
OWN_GADGETS = (
    "_winapi.CreateProcess",
    "concurrent.futures.ProcessPoolExecutor",
    "shelve.open",
    "zipimport.zipimporter",
    "site.addsitedir",
    "platform.architecture",
    "zipfile.ZipFile",
    "tarfile.open",
    "gzip.open",
    "sqlite3.connect",
    "linecache.getline",
    "pathlib.Path.write_text",
    "pathlib.Path.unlink",
    "gc.get_objects",
    "resource.setrlimit",
    "weakref.finalize",
    "xml.etree.ElementTree.parse",
    "string.Formatter.format",
    "abc.ABCMeta",
    "numpy.ndarray.tofile",
    "numpy.ma.core.load",
    "numpy.lib.stride_tricks.as_strided",
    "numpy.random.seed",
    "torch.save",
    "torch.library.Library",
    "torch.nn.modules.module.register_module_forward_hook",
    "torch.distributed.distributed_c10d.init_process_group",
    "omegaconf.OmegaConf.save",
    "omegaconf.OmegaConf.register_new_resolver",
    "hydra.utils.instantiate",
)


@pytest.mark.parametrize("name", OWN_GADGETS)
def test_each_own_gadget_is_denied(name: str, tmp_path: Path) -> None:
    test_each_corpus_gadget_is_denied(name, tmp_path)


def test_one_allow_entry_no_longer_lets_a_file_write_a_file(tmp_path: Path) -> None:
    """``pathlib.Path.write_text`` called on a ``PosixPath`` the file builds: admitted by
    ``allow=["pathlib.Path.write_text"]``, the load wrote the file's text to its path."""
    target = tmp_path / "written"
    path = tmp_path / "writer.pkl"
    cls = "WindowsPath" if os.name == "nt" else "PosixPath"
    path.write_bytes(
        P2 + g("pathlib", "Path.write_text") + g("pathlib", cls) + u(str(target)) + b"\x85R"
        + u("hi") + b"\x86R" + STOP
    )  # fmt: skip
    with pytest.raises(UnsafeCheckpointError, match="denied"):
        load(path, allow=["pathlib.Path.write_text"])
    assert not target.exists()


def _objects() -> dict[str, object]:
    """Objects an audit found admitted under an innocent name (``(obj, "pkg.thing")``)."""
    import code

    numpy = pytest.importorskip("numpy")
    torch = pytest.importorskip("torch")
    found: dict[str, object] = {
        "numpy.save": numpy.save,
        "numpy.fromfile": numpy.fromfile,
        "numpy.memmap": numpy.memmap,
        "numpy.frompyfunc": numpy.frompyfunc,
        "numpy.vectorize": numpy.vectorize,
        "numpy.ctypeslib.load_library": numpy.ctypeslib.load_library,
        "numpy.lib.format.read_array": numpy.lib.format.read_array,
        "numpy.seterrcall": numpy.seterrcall,
        "torch.ops.load_library": torch.ops.load_library,
        "torch.classes.load_library": torch.classes.load_library,
        "torch.manual_seed": torch.manual_seed,
        "torch.set_default_dtype": torch.set_default_dtype,
        "torch.set_num_threads": torch.set_num_threads,
        "torch._C._set_grad_enabled": torch._C._set_grad_enabled,
        "code.compile_command": code.compile_command,
        "code.InteractiveConsole.push": code.InteractiveConsole.push,
    }
    adder = getattr(torch._weights_only_unpickler, "_add_safe_globals", None)
    if adder is not None:  # torch 2.4+
        found["torch._weights_only_unpickler._add_safe_globals"] = adder
    return found


def test_objects_that_load_libraries_read_files_or_set_global_state_are_denied() -> None:
    for name, obj in _objects().items():
        assert denied_object(obj), name


def test_what_stays_allowable() -> None:
    """The deny list names gadgets, not whole libraries a checkpoint uses."""
    import uuid

    assert denied_object(uuid.UUID) is None
    assert denied_global("uuid.UUID") is None
    assert denied_global("code_models.Net") is None  # "code" may be a project's package
    assert denied_global("test_utils.Config") is None


def test_an_alias_of_an_allow_listed_rebuild_gets_its_checked_handling(tmp_path: Path) -> None:
    """``restore = torch._tensor._rebuild_from_type_v2`` re-exported by a package, allowed by
    that name: it was called freely with the file's arguments, which set state on a shared
    enum member of torch (global state). Now it is the allowlist's own checked rebuild."""
    metadata = pytest.importorskip("torch.distributed.checkpoint.metadata")
    if not hasattr(metadata, "_MEM_FORMAT_ENCODING"):
        pytest.skip("this torch's DCP has no _MEM_FORMAT_ENCODING enum (torch < 2.3)")
    package = tmp_path / "trainutils"
    package.mkdir()
    (package / "__init__.py").write_text(
        "from torch._tensor import _rebuild_from_type_v2 as restore\n"
    )
    enum = "torch.distributed.checkpoint.metadata"
    data = (
        P2
        + g("trainutils", "restore")
        + b"("
        + g(enum, "_MEM_FORMAT_ENCODING")
        + b"r\0\0\0\0"
        + b"j\0\0\0\0"
        + b"K\x01\x85"
        + b"}"
        + u("_value_")
        + b"M\x92\x10"
        + b"s"
        + b"tR"
        + STOP
    )  # (func, new_type, args, state): the enum called with 1, its shared member given state
    path = tmp_path / "ckpt.pkl"
    path.write_bytes(data)
    script = (
        "import sys, compatshim.checkpoint as c\n"
        f"import {enum} as m\n"
        "try:\n"
        f"    c.load({str(path)!r})\n"
        "    print('LOADED')\n"
        "except c.CheckpointError as exc:\n"
        "    print('REFUSED', exc)\n"
        "print('VALUES', [x._value_ for x in m._MEM_FORMAT_ENCODING])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True, text=True, timeout=240,
        env={**os.environ, "PYTHONPATH": os.pathsep.join((str(tmp_path), SRC)),
             "COMPATSHIM_ALLOW": "trainutils.restore"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "REFUSED" in done.stdout and "_rebuild_from_type_v2" in done.stdout, done.stdout
    assert "4242" not in done.stdout.split("VALUES")[1], done.stdout
