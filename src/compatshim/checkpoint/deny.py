"""The deny list: objects no allow source can admit, whatever name they report.

One table of known-dangerous globals (code execution, imports, files, processes,
the network, threads, unrestricted unpicklers). It is consulted before every allow
source (a ``load`` call's ``allow=``, ``compatshim.checkpoint.allow``,
``COMPATSHIM_ALLOW``, ``COMPATSHIM_ALLOW_FILE``, the ``compatshim.allow`` entry
points). Only compatshim's curated allowlist handles a denied name it lists itself
(``builtins.getattr``, ``functools.partial``, ``codecs.encode``,
``torch.storage._load_from_bytes``), and then only through its own checked rule,
never as a callable the file calls freely.

Names lie, so objects are judged by what they are (:func:`denied_object`): a module
object is denied (it reaches its ``os``, its ``sys``), and so is a module's live dict, list
or set (``json.__builtins__`` is builtins' namespace: the file's SETITEMS would change
``open``); so is a callable whose name does
not lead back to it (no ``__qualname__``, as ``ctypes.memmove`` or ``exit``; a bound
method of some instance). Otherwise every spelling of the object is judged: the name it
reports (``functools.reduce`` reports ``_functools``), the module a C function is bound
to (``os.system`` is ``posix.system``), each table entry that is this very object in a
module already imported (``types.FunctionType`` is ``builtins.function``;
``torch.from_file`` reports ``torch._VariableFunctionsClass``), and for an object of a
C or private module, a listed module that exports it under its own name (``_io.open`` is
``io.open``). Nothing is imported.

Keys are ``module.name``, or ``prefix*`` for every name starting so (``os.*``: os and its
submodules, standard modules no checkpoint needs whose names include gadgets; ``code`` may
be a project's package, so its gadgets are named one by one). C modules are listed beside
the modules that wrap them. Names are judged as ``_names.canonical`` spells them
(``__builtin__``, in Python 2 pickles, is ``builtins``).
"""

from __future__ import annotations

import re
import sys
import types
from collections.abc import MutableMapping, MutableSequence, MutableSet
from typing import Any, Callable, Iterable, Mapping

from ._names import canonical_name, spellings

DENIED: dict[str, str] = {
    "os.*": "operating-system calls: run shell commands, execute programs, delete files",
    "posix.*": "os under its C name: os.system, exec*, spawn*, remove",
    "nt.*": "os under its Windows name: os.system, exec*, spawn*, remove",
    "_winapi.*": "Windows processes and handles: CreateProcess runs any program",
    "msvcrt.*": "the Windows C runtime: any file descriptor, the console",
    "winreg.*": "reads and writes the Windows registry",
    "subprocess.*": "runs any program",
    "_posixsubprocess.*": "runs any program",
    "multiprocessing.*": "starts processes and unpickles what they send",
    "_multiprocessing.*": "multiprocessing's C half: semaphores, sends to processes",
    "concurrent.*": "process and thread pools: start processes, run any callable",
    "pty.*": "runs any program on a terminal",
    "sys.*": "the interpreter's global state (modules, paths, hooks, exit)",
    "builtins.eval": "evaluates Python source from the file",
    "builtins.exec": "executes Python source from the file",
    "builtins.compile": "compiles Python source from the file into code objects",
    "builtins.getattr": "reaches any attribute of any object (e.g. a module's system())",
    "builtins.setattr": "changes attributes of modules and classes: global state",
    "builtins.delattr": "removes attributes of modules and classes: global state",
    "builtins.__import__": "imports any module (importing runs its code)",
    "builtins.open": "reads or overwrites any file",
    "builtins.globals": "hands out a module's namespace to change",
    "builtins.locals": "hands out a namespace to change",
    "builtins.vars": "hands out a module's or class's namespace to change",
    "builtins.type": "makes new classes from names and namespaces in the file",
    "builtins.input": "reads from the terminal",
    "builtins.breakpoint": "starts a debugger",
    "builtins.exit": "ends the process",
    "builtins.quit": "ends the process",
    "builtins.help": "starts the interactive help (a pager, imports)",
    "builtins.function": "types.FunctionType: makes a function from a code object in the file",
    "builtins.code": "types.CodeType: makes a code object from bytes in the file",
    "builtins.method": "types.MethodType: binds any callable to any object",
    "builtins.module": "types.ModuleType: makes module objects",
    "_sitebuiltins.*": "exit, quit (end the process) and help (a pager, imports)",
    "importlib.*": "imports any module (importing runs its code)",
    "_frozen_importlib.*": "importlib's core under its frozen name: imports any module",
    "_frozen_importlib_external.*": "importlib's file loaders: import any module or path",
    "_imp.*": "the import machinery's C half: loads any shared library, runs any module",
    "pkgutil.*": "resolve_name and walk_packages import any module",
    "pydoc.*": "locate imports any module; pipepager runs a shell command",
    "runpy.*": "runs any module or script",
    "code.InteractiveInterpreter*": "runs Python source from the file (runsource, runcode)",
    "code.InteractiveConsole*": "runs Python source from the file (push, interact)",
    "code.interact": "starts an interactive interpreter",
    "code.compile_command": "compiles Python source from the file into code objects",
    "codeop.*": "compiles Python source from the file into code objects",
    "idlelib.*": "IDLE's shell and completers evaluate and run Python source (GHSA corpus)",
    "lib2to3.*": "Grammar.loads unpickles bytes with no allowlist; pgen evaluates source",
    "_pyrepl.*": "the REPL: runs source; its pager runs a shell command",
    "_aix_support.*": "runs a shell command (_read_cmd_output)",
    "_osx_support.*": "runs a shell command (_read_output)",
    "uuid._*": "uuid's private helpers run programs to find a MAC address (uuid.UUID is fine)",
    "ensurepip.*": "runs pip",
    "venv.*": "creates environments and runs pip",
    "distutils.*": "writes files, spawns compilers",
    "setuptools.*": "writes files, spawns compilers, runs setup scripts",
    "test.support.*": "CPython's test helpers run Python scripts and programs",
    "asyncio.*": "starts subprocesses, opens sockets, runs callbacks",
    "doctest.*": "runs Python source found in strings (debug_script, run_docstring_examples)",
    "timeit.*": "runs Python source given as a string",
    "pdb.*": "runs Python source under the debugger",
    "bdb.*": "runs Python source under the debugger",
    "trace.*": "runs Python source given as a string",
    "profile.*": "runs Python source given as a string",
    "cProfile.*": "runs Python source given as a string",
    "ctypes.*": "calls any C function, reads and writes any memory",
    "_ctypes.*": "calls any C function, reads and writes any memory",
    "shutil.*": "moves, overwrites and deletes files",
    "tempfile.*": "creates and deletes files",
    "zipfile.*": "writes, overwrites and extracts files",
    "tarfile.*": "extracts files anywhere and writes archives",
    "gzip.*": "opens and writes files",
    "bz2.*": "opens and writes files",
    "lzma.*": "opens and writes files",
    "shelve.*": "unpickles stored values with no allowlist; writes files",
    "dbm.*": "opens and creates database files",
    "sqlite3.*": "opens and creates database files, loads extensions",
    "_sqlite3.*": "opens and creates database files, loads extensions",
    "fileinput.*": "reads any file; in place, rewrites it",
    "linecache.*": "reads any file into what the load hands back",
    "glob.*": "lists any folder",
    "mmap.*": "maps any open file into memory",
    "_posixshmem.*": "creates and removes shared memory",
    "fcntl.*": "controls any open file descriptor (ioctl, locks)",
    "readline.*": "reads and writes history files; the terminal's state",
    "pathlib.Path.open": "opens any file",
    "pathlib.Path.read_bytes": "reads any file",
    "pathlib.Path.read_text": "reads any file",
    "pathlib.Path.write_bytes": "overwrites any file",
    "pathlib.Path.write_text": "overwrites any file",
    "pathlib.Path.touch": "creates files",
    "pathlib.Path.mkdir": "creates folders",
    "pathlib.Path.unlink": "deletes files",
    "pathlib.Path.rmdir": "deletes folders",
    "pathlib.Path.rename": "moves and overwrites files",
    "pathlib.Path.replace": "moves and overwrites files",
    "pathlib.Path.chmod": "changes any file's permissions",
    "pathlib.Path.symlink_to": "creates links to any file",
    "pathlib.Path.hardlink_to": "creates links to any file",
    "pathlib.Path.iterdir": "lists any folder",
    "pathlib.Path.glob": "lists any folder",
    "pathlib.Path.rglob": "lists any folder tree",
    "io.*": "opens and writes files",
    "_io.*": "opens and writes files",
    "codecs.*": "opens files (codecs.open) and decodes with any registered codec",
    "_codecs.*": "decodes with any registered codec (_codecs.encode is a checked rule)",
    "socket.*": "opens network connections",
    "_socket.*": "opens network connections",
    "ssl.*": "opens network connections (get_server_certificate)",
    "_ssl.*": "opens network connections",
    "http.*": "opens network connections",
    "urllib.*": "opens network connections and files (urlopen, urlretrieve)",
    "ftplib.*": "opens network connections",
    "imaplib.*": "opens network connections; IMAP4_stream runs a shell command",
    "smtplib.*": "opens network connections",
    "poplib.*": "opens network connections",
    "xmlrpc.*": "opens network connections, calls remote methods",
    "socketserver.*": "opens listening sockets",
    "requests.*": "opens network connections",
    "urllib3.*": "opens network connections",
    "httpx.*": "opens network connections",
    "aiohttp.*": "opens network connections",
    "webbrowser.*": "starts programs",
    "pip.*": "installs and runs packages",
    "zipimport.*": "imports and runs code from a zip file",
    "site.*": "addsitedir runs a folder's .pth lines; changes sys.path",
    "platform.*": "runs programs (architecture runs file, uname runs uname -p)",
    "cgitb.*": "replaces sys.excepthook; writes reports to files",
    "gettext.*": "reads catalogue files from any folder; install() changes builtins",
    "mimetypes.*": "reads any file into its global tables",
    "netrc.*": "reads a credentials file",
    "getpass.getpass": "reads from the terminal",
    "xml.*": "its parsers read any file or URL",
    "string.Formatter*": "format strings reach any attribute of their arguments",
    "abc.ABCMeta": "makes new classes from names and namespaces in the file",
    "hydra.utils.*": "instantiate and call import and call any callable",
    "hydra._internal.*": "locates and imports any callable",
    "omegaconf.OmegaConf.load": "reads any file",
    "omegaconf.OmegaConf.save": "writes any file",
    "omegaconf.OmegaConf.register*": "resolvers: global state, run any callable later",
    "omegaconf.OmegaConf.legacy_register_resolver": "resolvers: global state",
    "omegaconf.OmegaConf.clear_resolver*": "resolvers: global state",
    "logging.*": "handlers open files and sockets; config imports and calls any callable",
    "atexit.*": "registers any callable to run at exit",
    "threading.*": "starts threads that run any callable",
    "_thread.*": "starts threads that run any callable (start_new_thread)",
    "signal.*": "installs signal handlers that run any callable",
    "_signal.*": "installs signal handlers that run any callable",
    "weakref.*": "callbacks and finalizers run any callable when an object dies",
    "_weakref.*": "callbacks run any callable when an object dies",
    "gc.*": "hands out every live object (get_objects, get_referrers); global state",
    "resource.*": "the process's limits: global state",
    "faulthandler.*": "global state; writes tracebacks into any file descriptor",
    "tracemalloc.*": "global state (start, stop)",
    "locale.setlocale": "the process's locale: global state",
    "_locale.*": "locale's C half: setlocale changes global state",
    "types.FunctionType": "makes a function from a code object in the file",
    "types.CodeType": "makes a code object from bytes in the file",
    "types.LambdaType": "makes a function from a code object in the file",
    "types.MethodType": "binds any callable to any object",
    "types.ModuleType": "makes module objects",
    "marshal.*": "makes code objects from bytes in the file",
    "operator.*": "attrgetter, methodcaller, call: reach and call any attribute",
    "_operator.*": "attrgetter, methodcaller, call: reach and call any attribute",
    "functools.*": "partial and reduce call any function later, with the file's arguments",
    "_functools.*": "functools under its C name: reduce and partial call any function",
    "pickle.*": "unpickles bytes from the file with no allowlist (any global, any code)",
    "_pickle.*": "unpickles bytes from the file with no allowlist (any global, any code)",
    "copyreg.*": "registers reducers: global state (copyreg._reconstructor is a checked rule)",
    "dill.*": "unpickles bytes from the file with no allowlist, including code",
    "cloudpickle.*": "unpickles bytes from the file with no allowlist, including code",
    "joblib.load": "unpickles a file with no allowlist",
    "numpy.load": "unpickles a file when allow_pickle=True",
    "numpy.lib.format.*": "numpy's .npy reader and writer: read_array unpickles, files are written",
    "numpy.lib._format_impl.*": "numpy's .npy reader and writer (numpy 2's module)",
    "numpy.lib.npyio.*": "numpy's file readers and writers (NpzFile unpickles members)",
    "numpy.lib._npyio_impl.*": "numpy's file readers and writers (numpy 2's module)",
    "numpy.save*": "writes files (save, savez, savez_compressed, savetxt)",
    "numpy.loadtxt": "reads any file",
    "numpy.genfromtxt": "reads any file",
    "numpy.fromregex": "reads any file",
    "numpy.fromfile": "reads any file, as torch.from_file maps one",
    "numpy.rec.fromfile": "reads any file",
    "numpy.core.records.fromfile": "reads any file",
    "numpy.ndarray.tofile": "writes any file",
    "numpy.ndarray.dump": "writes any file",
    "numpy.ma.core.dump": "writes any file",
    "numpy.ma.core.load": "unpickles any file with no allowlist",
    "numpy.ma.dump": "writes any file",
    "numpy.ma.load": "unpickles any file with no allowlist",
    "numpy.lib._datasource.*": "opens any file or URL",
    "numpy.distutils.*": "exec_command runs shell commands; builds run compilers",
    "numpy.lib.stride_tricks.*": "as_strided makes views past an array's memory",
    "numpy.lib._stride_tricks_impl.*": "as_strided makes views past an array's memory",
    "numpy.random.seed": "numpy's global generator state",
    "numpy.random.set_bit_generator": "numpy's global generator state",
    "numpy.memmap": "maps any file on disk into an array",
    "numpy.frompyfunc": "wraps any callable to be called later, as functools.partial",
    "numpy.vectorize": "wraps any callable to be called later, as functools.partial",
    "numpy.set_*": "numpy's global state (set_printoptions, set_string_function)",
    "numpy.seterr*": "numpy's global state (seterr, seterrcall: calls any callable)",
    "numpy.setbufsize": "numpy's global state",
    "numpy.ctypeslib.*": "load_library loads any shared library; as_array reads any address",
    "numpy.f2py.*": "crackfortran evaluates Python source; f2py runs compilers",
    "numpy.testing.*": "runstring executes Python source",
    "torch.load": "may run torch.load(weights_only=False) on bytes from the file",
    "torch.save": "writes any file",
    "torch.compile": "compiles and runs a callable (Dynamo, Inductor)",
    "torch.export.*": "export.load reads programs from any file",
    "torch.library.*": "registers operators and kernels: global state",
    "torch.profiler.*": "the profiler: global state; writes traces",
    "torch.utils.tensorboard.*": "writes event files",
    "torch.cuda.memory.*": "the CUDA allocator's global state",
    "torch.nn.modules.module.register_module_*": "global module hooks run any callable later",
    "torch.distributed.rpc.*": "calls functions in other processes",
    "torch.distributed.distributed_c10d.*": "process groups: global state, network connections",
    "torch.serialization.*": "may run torch.load(weights_only=False) on bytes from the file",
    "torch.storage._load_from_bytes": "torch.load(weights_only=False) on bytes from the file",
    "torch.from_file": "maps any file on disk into a tensor",
    "torch._weights_only_unpickler.*": "torch's safe-globals registry: what torch.load admits",
    "torch._ops._Ops.load_library": "loads any shared library (torch.ops.load_library)",
    "torch._classes._Classes.load_library": "loads any shared library (torch.classes)",
    "torch.set_*": "torch's global state (default dtype and device, threads, flags)",
    "torch.cuda.set_*": "torch.cuda's global state (device, stream, allocator settings)",
    "torch.autograd.set_*": "autograd's global state (grad mode, anomaly mode), set when built",
    "torch.autograd.grad_mode.*": "grad mode: set_grad_enabled(False) turns gradients off",
    "torch.autograd.anomaly_mode.*": "anomaly detection: global state, set when built",
    "torch.multiprocessing.*": "starts processes (spawn) and unpickles what they send",
    "torch._C._set_*": "torch's global state (grad mode, flags)",
    "torch.random.*": "torch's global generator state (manual_seed, set_rng_state)",
    "torch.use_deterministic_algorithms": "torch's global state",
    "torch._dynamo.*": "compiles and runs code; guards evaluate source (GHSA corpus)",
    "torch._inductor.*": "compiles and loads generated code (codecache.compile_file)",
    "torch.fx.experimental.*": "symbolic_shapes evaluates guard source (GHSA corpus)",
    "torch.utils._config_module.*": "load_config unpickles bytes with no allowlist",
    "torch.utils.bottleneck.*": "runs and profiles any script",
    "torch.utils.collect_env.*": "runs shell commands (run, run_and_read_all)",
    "torch.utils.data.datapipes.utils.decoder.*": "decoders call pickle.loads and torch.load",
    "torch._utils._import_dotted_name": "imports any module by name",
    "torch._utils._set_obj_state": "sets any attribute on any object it reaches, classes too",
    "torch.package.*": "imports and runs code packaged in the file",
    "torch.fx.graph_module.*": "GraphModule's reducers build and exec Python source from the file",
    "torch.jit.*": "compiles and runs TorchScript code from the file",
    "torch.hub.*": "downloads and runs code",
    "torch.utils.cpp_extension.*": "compiles and loads C++ code",
    "torch._C._jit_*": "compiles and runs TorchScript code",
    "torch._C.import_ir_module*": "loads and runs TorchScript code from bytes or a file",
    "torch._C._import_ir_module*": "loads and runs TorchScript code from a package",
    "torch._C._load_for_lite_interpreter*": "loads and runs TorchScript code from a file",
}

_EXACT = {k: v for k, v in DENIED.items() if not k.endswith("*")}
_MODULES = {k[:-2]: v for k, v in DENIED.items() if k.endswith(".*")}  # a module and below
_PREFIXES = tuple((k[:-1], v) for k, v in DENIED.items() if k.endswith("*") and k[-2] != ".")
_DEPTH = max(k.count(".") + 1 for k in _MODULES)  # the deepest module prefix listed


def denied(name: str) -> str | None:
    """Why the global ``name`` (``module.name``) can never be allowed, or None."""
    name = canonical_name(name)
    reason = _EXACT.get(name)
    if reason is not None:
        return reason
    end = -1
    for _ in range(_DEPTH):  # "os.path.join": os, os.path, os.path.join (linear in the name)
        end = name.find(".", end + 1)
        reason = _MODULES.get(name if end < 0 else name[:end])
        if reason is not None:
            return reason
        if end < 0:
            break
    for prefix, why in _PREFIXES:  # "torch._C._jit_*": a name prefix, not a module
        if name.startswith(prefix):
            return why
    return None


MODULE = "a module object: reaches everything the module holds (its os, its sys, its loader)"
CONTAINER = (
    "a live container of a module (builtins' namespace, a package's __path__, os.environ): "
    "the file would change it, and with it what runs later"
)
#: what a file may never be handed by name: the machine fills dicts, lists and sets with
#: SETITEMS, APPENDS and ADDITEMS (``json.__builtins__`` is builtins' namespace itself)
_MUTABLE = (dict, list, set, bytearray, MutableMapping, MutableSequence, MutableSet)
UNNAMED = (
    "a callable whose name does not lead back to it (no __qualname__, or its module holds "
    "another object there): compatshim cannot tell what it runs"
)


def denied_object(obj: Any) -> str | None:
    """Why ``obj`` can never be admitted, judged by what it is (the module docstring), or
    None. ``obj`` comes from the caller's code (``allow=``, ``allow()``, an entry point, a
    string entry once imported) or from a module already imported, never from a file. Reads
    attributes and ``sys.modules`` only; imports nothing."""
    if isinstance(obj, types.ModuleType):
        return MODULE
    if isinstance(obj, _MUTABLE) and not isinstance(obj, type):
        return CONTAINER
    try:
        module = getattr(obj, "__module__", None)
        qualname = getattr(obj, "__qualname__", None)
        owner = getattr(obj, "__self__", None)
    except Exception:
        return UNNAMED if _callable(obj) else None
    names = []
    if type(module) is str and type(qualname) is str:
        names.append(f"{module}.{qualname}")
    if isinstance(owner, types.ModuleType) and type(qualname) is str:
        names.append(f"{owner.__name__}.{qualname}")  # the module a C function is bound to
    for name in names:
        reason = denied(name)
        if reason is not None:
            return reason
    for name, reason in _EXACT.items():  # this very object under a listed spelling
        if _lookup(name) is obj:
            return reason
    reason = _prefixed(obj)  # torch.set_printoptions is torch._tensor_str.set_printoptions
    if reason is not None:
        return reason
    if type(module) is str and (module.startswith("_") or module == "builtins"):
        short = getattr(obj, "__name__", None)  # a C module's object, as its wrapper exports it
        for name, reason in _MODULES.items():
            found = sys.modules.get(name)
            if found is not None and type(short) is str and _MODULE_DICT(found).get(short) is obj:
                return reason
    if _callable(obj):
        home = _lookup(names[0]) if names else None  # missing: a lazy module attribute
        if home is None or (home is not _MISSING and not _is_home(home, obj)):
            return UNNAMED
        if owner is not None and not isinstance(owner, (types.ModuleType, type)):
            return UNNAMED  # bound to some instance (sys.modules.get, a pybind11 record)
        if isinstance(obj, types.MethodType) and not isinstance(owner, type):
            return UNNAMED  # a method of an instance that is a module (torch.ops: load_library)
    return None


def _prefixed(obj: Any) -> str | None:
    """The reason of a ``prefix*`` entry (``torch.set_*``) under whose names an imported
    module holds this very callable, whatever its own name (``torch.autograd.grad_mode.
    set_grad_enabled``). The matching names are listed once per size of the module's
    namespace; what each holds is read at every call (a name given a new object counts)."""
    if not _callable(obj):  # a constant under such a name (uuid._AIX) runs nothing
        return None
    for prefix, reason in _PREFIXES:
        home, _, start = prefix.rpartition(".")
        module = sys.modules.get(home)
        if module is None:
            continue
        namespace = _MODULE_DICT(module)
        known = _PREFIXED.get(prefix)
        if known is None or known[0] is not module or known[1] != len(namespace):
            names = tuple(name for name in list(namespace) if name.startswith(start))
            known = _PREFIXED[prefix] = (module, len(namespace), names)
        if any(namespace.get(name, _MISSING) is obj for name in known[2]):
            return reason
    return None


#: prefix entry -> (its module, the size of its namespace, the names the entry covers there)
_PREFIXED: dict[str, tuple[Any, int, tuple[str, ...]]] = {}


def denied_global(name: str) -> str | None:
    """:func:`denied` for ``name``, then :func:`denied_object` for what ``name`` already is in
    the imported modules (``posixpath.os`` is a module; ``shutil.os.system`` is posix's), so a
    new spelling of a denied object is denied too. Imports nothing; linear in the name."""
    reason = denied(name)
    if reason is not None:
        return reason
    for spelling in spellings(canonical_name(name)):  # numpy 1.x: numpy.core is the module
        found = _lookup(spelling)
        if found is not _MISSING:
            return denied_object(found)
    return None


def _callable(obj: Any) -> bool:
    try:
        return callable(obj)
    except Exception:
        return True


_MISSING: Any = object()


def _is_home(found: Any, obj: Any) -> bool:
    """``found`` (what ``obj``'s name leads to) is ``obj``, or the function of ``obj`` when
    ``obj`` is a class method bound to its class."""
    return found is obj or (found is not _MISSING and found is getattr(obj, "__func__", None))


def _lookup(name: str) -> Any:
    """The object ``name`` is in ``sys.modules`` now, or ``_MISSING``: through module and class
    namespaces only (read with ``ModuleType``'s and ``type``'s own ``__dict__``, so no
    descriptor of the file's choosing runs; a static or class method is its function). No
    import. The module is the longest imported prefix, also below a package that is not
    imported: a package whose import failed leaves the submodules it had imported in
    ``sys.modules`` (``triton.backends.compiler`` without ``triton``). Past the first prefix
    that is not a module, prefixes longer than the longest imported module name are not
    tried, so the work stays linear in the name."""
    found: Any = _MISSING
    end = -1
    longest = -1  # set at the first miss
    at = name.find(".")
    while at >= 0 and (longest < 0 or at <= longest):
        module = sys.modules.get(name[:at])
        if module is not None:
            found, end = module, at
        elif longest < 0:
            longest = _longest_module_name()
        at = name.find(".", at + 1)
    if found is _MISSING:
        return _MISSING
    for part in name[end + 1 :].split("."):
        if isinstance(found, types.ModuleType):
            namespace = _MODULE_DICT(found)
        elif isinstance(found, type):
            namespace = _TYPE_DICT(found)
        else:
            return _MISSING
        found = namespace.get(part, _MISSING)
        if found is _MISSING:
            return _MISSING
        if isinstance(found, (staticmethod, classmethod)):
            found = found.__func__
    return found


_LONGEST: list[Any] = [0, -1, None]  # the longest module name, len(sys.modules), its last key


def _longest_module_name() -> int:
    """The length of the longest name in ``sys.modules``, measured again when its size or
    its last key (where an import adds one) changed."""
    modules = sys.modules
    size, last = len(modules), next(reversed(modules), None)
    if _LONGEST[1] != size or _LONGEST[2] != last:
        _LONGEST[:] = [max(map(len, modules), default=0), size, last]
    return int(_LONGEST[0])


_MODULE_DICT: Callable[[Any], Mapping[str, Any]] = vars(types.ModuleType)["__dict__"].__get__
_TYPE_DICT: Callable[[Any], Mapping[str, Any]] = vars(type)["__dict__"].__get__


_GLOBAL_NAME = re.compile(r"[A-Za-z_][\w.]*\.[A-Za-z_]\w*")


def refused_globals(refused: Iterable[str]) -> tuple[list[str], list[str]]:
    """The ``module.name`` globals among a refusal's entries (others name an operation:
    "SETITEM a dict"), and those of them the deny list refuses, judged as objects
    (:func:`denied_global`): every refusal's advice must say "it may be malicious" for
    these, never how to allow them."""
    names = [name for name in refused if _GLOBAL_NAME.fullmatch(name)]
    return names, [name for name in names if denied_global(name) is not None]


def denied_entry(name: str, obj: Any = None) -> str | None:
    """:func:`denied_global` for an allow entry's name, then :func:`denied_object` for its
    object (None: a string entry, whose object is judged again once imported)."""
    reason = denied_global(name)
    if reason is None and obj is not None:
        reason = denied_object(obj)
    return reason


REFUSAL = "denied (cannot be allowed)"
