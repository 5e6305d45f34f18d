"""The deny list: globals no allow source can admit, whatever it says.

One table of known-dangerous names (code execution, imports, files, processes,
unrestricted unpicklers). It is consulted before every allow source (a
``load`` call's ``allow=``, ``compatshim.checkpoint.allow``,
``COMPATSHIM_ALLOW``, ``COMPATSHIM_ALLOW_FILE``, the ``compatshim.allow``
entry points), by name and, for objects, by the name the object itself
carries (``allow=[(eval, "my.safe")]`` is still ``builtins.eval``). Only
compatshim's curated allowlist handles a denied name it lists itself
(``builtins.getattr``, ``functools.partial``, ``codecs.encode``,
``torch.storage._load_from_bytes``), and then only through its own checked
rule, never as a callable the file calls freely.

Keys are ``module.name``, or ``prefix*`` for every name starting so (``os.*``:
os and its submodules, standard modules no checkpoint needs whose names
include gadgets; ``code`` may be a project's package, so its gadgets are named
one by one). Names are judged as ``_names.canonical`` spells them (``__builtin__``, in
Python 2 pickles, is ``builtins``).
"""

from __future__ import annotations

from typing import Any

from ._names import canonical_name

DENIED: dict[str, str] = {
    "os.*": "operating-system calls: run shell commands, execute programs, delete files",
    "posix.*": "os under its C name: os.system, exec*, spawn*, remove",
    "nt.*": "os under its Windows name: os.system, exec*, spawn*, remove",
    "subprocess.*": "runs any program",
    "_posixsubprocess.*": "runs any program",
    "multiprocessing.*": "starts processes and unpickles what they send",
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
    "importlib.*": "imports any module (importing runs its code)",
    "runpy.*": "runs any module or script",
    "code.InteractiveInterpreter": "runs Python source from the file",
    "code.InteractiveConsole": "runs Python source from the file",
    "code.interact": "starts an interactive interpreter",
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
    "io.*": "opens and writes files",
    "_io.*": "opens and writes files",
    "codecs.*": "opens files (codecs.open) and decodes with any registered codec",
    "_codecs.*": "decodes with any registered codec (_codecs.encode is a checked rule)",
    "socket.*": "opens network connections",
    "webbrowser.*": "starts programs",
    "pip.*": "installs and runs packages",
    "types.FunctionType": "makes a function from a code object in the file",
    "types.CodeType": "makes a code object from bytes in the file",
    "marshal.*": "makes code objects from bytes in the file",
    "operator.*": "attrgetter, methodcaller, call: reach and call any attribute",
    "_operator.*": "attrgetter, methodcaller, call: reach and call any attribute",
    "functools.*": "partial and reduce call any function later, with the file's arguments",
    "pickle.*": "unpickles bytes from the file with no allowlist (any global, any code)",
    "_pickle.*": "unpickles bytes from the file with no allowlist (any global, any code)",
    "copyreg.*": "registers reducers: global state (copyreg._reconstructor is a checked rule)",
    "dill.*": "unpickles bytes from the file with no allowlist, including code",
    "cloudpickle.*": "unpickles bytes from the file with no allowlist, including code",
    "joblib.load": "unpickles a file with no allowlist",
    "numpy.load": "unpickles a file when allow_pickle=True",
    "numpy.testing.*": "runstring executes Python source",
    "torch.load": "may run torch.load(weights_only=False) on bytes from the file",
    "torch.serialization.*": "may run torch.load(weights_only=False) on bytes from the file",
    "torch.storage._load_from_bytes": "torch.load(weights_only=False) on bytes from the file",
    "torch.jit.*": "compiles and runs TorchScript code from the file",
    "torch.hub.*": "downloads and runs code",
    "torch.utils.cpp_extension.*": "compiles and loads C++ code",
    "torch._C._jit_*": "compiles and runs TorchScript code",
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


def denied_object(obj: Any) -> str | None:
    """Why ``obj`` is a denied global, by the name it carries itself (``os.system`` is
    ``posix.system``), or None. ``obj`` comes from the caller's code (``allow=``, ``allow()``,
    an entry point, a string entry once imported), never from a file."""
    try:
        module = getattr(obj, "__module__", None)
        qualname = getattr(obj, "__qualname__", None)
    except Exception:
        return None
    if type(module) is not str or type(qualname) is not str:
        return None
    return denied(f"{module}.{qualname}")


def denied_entry(name: str, obj: Any = None) -> str | None:
    """:func:`denied` for an allow entry's name, then for its object's own name (None: a
    string entry, whose object is judged once imported)."""
    reason = denied(name)
    if reason is None and obj is not None:
        reason = denied_object(obj)
    return reason


REFUSAL = "denied (cannot be allowed)"
