"""Every file of other people's attack corpora through ``load`` and ``inspect``, hardened.

    python tests/checkpoint/upstream/run_attack_corpus.py FOLDER [FOLDER ...]

FOLDER: a corpus fetched outside this checkout (never committed here): picklescan's
``tests/data`` and ``tests/data2``, the pickles fickling's own tests build, polyglot files.
Each file is read in a fresh interpreter (``COMPATSHIM_AUTO=1 COMPATSHIM_SAFE_LOAD=1``) with
an audit hook armed after set-up. A file fails the run when its load or inspect raises
anything but compatshim's typed errors, a load hands back a callable, the two disagree
(``inspect`` says loadable and ``load`` refuses, or ``load`` reads what ``inspect`` does not
call loadable), or the hook sees a process, a network call, a write, ``exec``/``compile``
outside an import and numpy's header parse, or a setattr on a type. Prints one line per
file and a count per outcome; exit 1 when any file failed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

CHILD = r"""
import ast, io, json, os, sys
import numpy, torch
import compatshim.checkpoint as ck
buffer = io.BytesIO()
torch.save({"a": torch.zeros(2), "n": numpy.zeros(2)}, buffer)
ck.load(io.BytesIO(buffer.getvalue()))  # every lazy import of the loader, before the hook
ck.inspect(io.BytesIO(buffer.getvalue()))
WATCH = ("os.system", "os.exec", "os.spawn", "os.posix_spawn", "os.fork", "subprocess",
         "ctypes", "socket", "urllib", "webbrowser", "os.remove", "os.rename", "os.rmdir",
         "os.mkdir", "os.chmod", "os.kill", "os.putenv", "os.unsetenv", "shutil", "pty",
         "builtins.input", "sys.settrace", "sys.setprofile", "object.__delattr__")
seen, importing = [], []
def parsing_literal():  # numpy's .npy header parse: ast.literal_eval compiles to a tree only
    frame = sys._getframe(2)
    while frame is not None and frame.f_code is not ast.literal_eval.__code__:
        frame = frame.f_back
    return frame is not None
def hook(event, args):
    if event == "import":
        importing.append(args[0])
    elif event in ("exec", "compile") and not importing and not parsing_literal():
        seen.append(event)
    elif event == "object.__setattr__" and isinstance(args[0], type):
        seen.append(f"setattr {args[0].__qualname__}.{args[1]}")
    elif event == "open" and isinstance(args[2], int) and args[2] & (os.O_WRONLY | os.O_RDWR):
        seen.append(f"open for writing {str(args[0])[:80]}")
    elif event.startswith(WATCH):
        seen.append(event)
def callables(value):
    stack, found = [value], []
    while stack and len(found) < 5:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple, set, frozenset)):
            stack.extend(item)
        elif callable(item) and not isinstance(item, torch.Tensor):
            found.append(type(item).__qualname__)
    return found
sys.addaudithook(hook)
result = {}
for name, call in (("load", ck.load), ("inspect", ck.inspect)):
    importing.clear()
    try:
        value = call(sys.argv[1])
    except ck.CheckpointError as exc:
        result[name] = ["refused" if isinstance(exc, ck.UnsafeCheckpointError) else "damaged",
                        str(exc).splitlines()[0][:200]]
    except BaseException as exc:
        result[name] = ["untyped", f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}"[:200]]
    else:
        if name == "load":
            result[name] = ["loaded", callables(value)]
        else:
            result[name] = [value.severity, list(value.needs_allow)]
result["events"] = sorted(set(seen))
print("RESULT " + json.dumps(result))
"""


def judge(result: dict[str, list[object]]) -> list[str]:
    """Why this file's reading broke a promise (empty: it kept them all)."""
    load, info = result["load"], result["inspect"]
    problems = [f"events {result['events']}"] if result["events"] else []
    problems += [f"{name} untyped" for name in ("load", "inspect") if result[name][0] == "untyped"]
    if load[0] == "loaded" and load[1]:
        problems.append(f"load handed back callables {load[1]}")
    if (load[0] == "refused" and info[0] == "loadable") or (
        load[0] == "loaded" and info[0] != "loadable"
    ):  # load "damaged", inspect not: a numpy file, judged as numpy.load reads it
        problems.append(f"load {load[0]} but inspect says {info[0]}")
    return problems


def main(folders: list[str]) -> int:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPATSHIM_")}
    env.update(COMPATSHIM_AUTO="1", COMPATSHIM_SAFE_LOAD="1")
    outcomes: Counter[str] = Counter()
    failed = 0
    for folder in folders:
        for path in sorted(p.resolve() for p in Path(folder).rglob("*") if p.is_file()):
            try:
                done = subprocess.run(
                    [sys.executable, "-c", CHILD, str(path)],
                    capture_output=True, text=True, timeout=300, env=env, cwd=path.parent,
                )  # fmt: skip
                lines = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
                result = json.loads(lines[-1][7:]) if lines else None
            except subprocess.TimeoutExpired:
                result = None
            if result is None:
                problems = ["no result (a crash or a timeout)"]
                outcome = "none"
            else:
                problems = judge(result)
                outcome = f"load {result['load'][0]}, inspect {result['inspect'][0]}"
            outcomes[outcome] += 1
            failed += bool(problems)
            print(f"{'FAIL' if problems else 'ok  '} {path}: {outcome} {'; '.join(problems)}")
    for outcome, count in sorted(outcomes.items()):
        print(f"{count:5d}  {outcome}")
    print(f"{sum(outcomes.values())} files, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
