"""``compatshim matrix``: a user's own tests on each of compatshim's pinned framework sets.

The pin sets are the ones compatshim's own matrix runs (``matrix/<name>.txt``, one
requirements file per set: torch, numpy and the frameworks, each ``==`` a release). A wheel
carries them as ``compatshim/_pins/*.txt``; a checkout reads ``matrix/`` itself. For each
chosen set, an environment under ``.compatshim-matrix/<name>`` in the project gets the pins,
this compatshim, pytest and the project (``pip install -e .``) in one resolve, and
``python -m pytest`` runs there; a table ends the run and any set that did not pass (pytest's
"no tests ran" included) makes the exit status 1. An environment is made again only when
what went into it changed (the pins, the Python, the install arguments, this compatshim or
the project's build files).

The pin-folder reading here (:func:`pin_sets`, :func:`describe`) is the one the tox plugin
(toxfile.py) uses too, loaded by path: nothing at module level imports beyond the standard
library.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from itertools import takewhile
from pathlib import Path
from typing import Collection, NamedTuple, Sequence

NOT_PINS = "bench"  # matrix/bench*.txt: the benchmarks' pins (tox.ini), not a framework set
DEFAULT_PYTHON = "3.11"  # tox.ini's base_python: the Python of a set without a py3.X factor
PY_FACTOR = re.compile(r"(?:^|-)py(3\.\d+)(?=-|$)")
NOTE = re.compile(r"[\w.-]+: ")  # "omegaconf: ..." in a pin file's comment: a note of its own
WORKDIR = ".compatshim-matrix"
STAMP = "compatshim-matrix.json"  # what the environment was made from
BUILD_FILES = ("pyproject.toml", "setup.cfg", "setup.py")  # a change reinstalls the project
NO_TESTS = 5  # pytest's exit status when no test ran
# Not passed on to the tests: a PYTHONPATH would put other releases before the pins; bytecode
# is written whatever the shell says (as tox.ini does: uv installs none, and each run would
# otherwise compile torch's imported modules again, seconds per interpreter)
LEFT_OUT = ("PYTHONPATH", "PYTHONHOME", "PYTHONDONTWRITEBYTECODE")


class MatrixError(ValueError):
    """A bad ``compatshim matrix`` request: an unknown set, no pins, no interpreter."""


def pin_sets(folder: Path) -> list[str]:
    """One set per ``<name>.txt`` in ``folder`` (sorted), ``bench*.txt`` left out."""
    found = (path.stem for path in folder.glob("*.txt") if not path.name.startswith(NOT_PINS))
    return sorted(found)


def describe(pins: Path) -> str:
    """The first sentence of the pin file's opening comment (it ends at ``. `` or ``;`` outside
    brackets; a line that opens with ``name:`` starts another note, not the sentence)."""
    lines = pins.read_text(encoding="utf-8").splitlines()
    comment = [line.lstrip("#").strip() for line in takewhile(lambda x: x.startswith("#"), lines)]
    text = ""
    for line in comment:
        if not line or (text and NOTE.match(line)):
            break
        text = f"{text} {line}".strip()
        depth, end = 0, None
        for at, char in enumerate(text):
            depth += (char in "([") - (char in ")]")
            if depth == 0 and (char == ";" or text.startswith(". ", at) or text[at:] == "."):
                end = at
                break
        if end is not None:
            text = text[:end]
            break
    return text.rstrip(",:") or f"the pins in matrix/{pins.name}"


def family(name: str) -> str:
    """The family (``core``, ``checkpoint``, ``lightning``...): the name up to its first ``-``."""
    return name.split("-", 1)[0]


def python_of(name: str) -> str:
    """The Python compatshim's matrix runs the set on: its ``py3.X`` factor, else 3.11."""
    match = PY_FACTOR.search(name)
    return match[1] if match else DEFAULT_PYTHON


def default_pins() -> Path:
    """The wheel's ``compatshim/_pins``, else the checkout's ``matrix/`` (an editable install)."""
    here = Path(__file__).resolve().parent
    for folder in (here / "_pins", here.parent.parent / "matrix"):
        if folder.is_dir():
            return folder
    raise MatrixError(f"no pin sets: neither {here / '_pins'} nor a checkout's matrix/ exists")


class Outcome(NamedTuple):
    env: str
    python: str
    result: str  # passed, failed, no tests, error (exit N), install failed
    passed: int | None = None
    failed: int | None = None
    skipped: int | None = None
    seconds: float | None = None


def known_sets(folder: Path) -> list[str]:
    """:func:`pin_sets`, where none (a wrong or missing ``--pins``) is a bad request: a listing
    of nothing or a run of nothing would hide the typo."""
    known = pin_sets(folder)
    if not known:
        raise MatrixError(f"--pins {folder}: no <name>.txt pin file there")
    return known


def choose(folder: Path, envs: Sequence[str], families: Sequence[str]) -> list[str]:
    """The named sets and every set of the named families, in the folder's order."""
    known = known_sets(folder)
    if not envs and not families:
        raise MatrixError("no set chosen: name one with --env or --family (--list shows them)")
    unknown = [env for env in envs if env not in known]
    if unknown:
        raise MatrixError(f"--env {', '.join(unknown)}: no such pin set in {folder}")
    families_known = {family(env) for env in known}
    unknown = [name for name in families if name not in families_known]
    if unknown:
        raise MatrixError(
            f"--family {', '.join(unknown)}: no such family in {folder} "
            f"(there: {', '.join(sorted(families_known))})"
        )
    return [env for env in known if env in envs or family(env) in families]


def this_compatshim() -> list[str]:
    """The compatshim running this command, as install arguments: the checkout it runs from
    (editable), else what it was installed from (PEP 610's direct_url.json: a folder, an
    archive, a VCS commit), else the release of its version from the index."""
    root = Path(__file__).resolve().parents[2]
    if (root / "pyproject.toml").is_file() and (root / "src" / "compatshim").is_dir():
        return ["-e", str(root)]
    from importlib import metadata

    from . import __version__

    try:
        direct = json.loads(metadata.distribution("compatshim").read_text("direct_url.json") or "")
    except (metadata.PackageNotFoundError, ValueError):
        return [f"compatshim=={__version__}"]
    url = direct["url"]
    if "vcs_info" in direct:
        vcs = direct["vcs_info"]
        return [f"compatshim @ {vcs['vcs']}+{url}@{vcs['commit_id']}"]
    if direct.get("dir_info", {}).get("editable"):
        return ["-e", url]
    return [f"compatshim @ {url}"]


def env_python(env_dir: Path) -> Path:
    return env_dir / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def _fingerprint(pins: Path, python: str, installer: str, install: list[str], project: Path) -> str:
    builds = {
        name: (project / name).read_bytes() for name in BUILD_FILES if (project / name).is_file()
    }
    recipe = {
        "pins": pins.read_text(encoding="utf-8"),
        "python": python,
        "installer": installer,
        "install": install,
        "compatshim": this_compatshim(),
        "build files": {name: hashlib.sha256(data).hexdigest() for name, data in builds.items()},
    }
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()


def _running(version: str) -> bool:
    """Whether the interpreter running this command is Python ``version`` (then it is the
    environment's base: it is known to work, where a version search may stop at a shim)."""
    return f"{sys.version_info[0]}.{sys.version_info[1]}" == version


def _make(env_dir: Path, python: str, installer: str, requirements: list[str], log: Path) -> bool:
    """A fresh environment with ``requirements`` installed; False when a step failed."""
    exe = env_python(env_dir)
    base = sys.executable if _running(python) else None
    if installer == "uv":
        steps = [
            ["uv", "venv", "--quiet", "--python", base or python, str(env_dir)],
            ["uv", "pip", "install", "--python", str(exe), *requirements],
        ]
    else:
        base = base or shutil.which(f"python{python}")
        if base is None:
            log.write_text(f"no python{python} on PATH (uv finds or fetches it)\n", "utf-8")
            return False
        steps = [
            [base, "-m", "venv", str(env_dir)],
            [str(exe), "-m", "pip", "install", *requirements],
        ]
    with log.open("w", encoding="utf-8") as out:
        for step in steps:
            out.write(f"$ {shlex.join(step)}\n")
            out.flush()
            if subprocess.run(step, stdout=out, stderr=subprocess.STDOUT).returncode != 0:
                return False
    return True


def check_workdir(workdir: Path) -> None:
    """Refuse a ``--workdir`` that is a file or lies under one, before any set is made (else
    ``mkdir`` fails with a traceback once a set's install is due)."""
    blocked = next((p for p in (workdir, *workdir.parents) if p.exists() or p.is_symlink()), None)
    if blocked is not None and not blocked.is_dir():
        where = "" if blocked == workdir else f" ({blocked} is a file)"
        raise MatrixError(f"--workdir {workdir}: not a folder{where}")


def check_free(env_dir: Path) -> None:
    """Only an environment (``pyvenv.cfg``) may stand where a set's goes: anything else is the
    user's, never deleted. :func:`main` checks every chosen set's before installing any."""
    if (env_dir.exists() or env_dir.is_symlink()) and not (env_dir / "pyvenv.cfg").is_file():
        raise MatrixError(f"{env_dir}: in the way and not an environment (pyvenv.cfg); move it")


def _replace(env_dir: Path) -> None:
    """Remove an environment this command made; anything else in its place is left alone."""
    check_free(env_dir)
    if env_dir.exists():
        shutil.rmtree(env_dir)


def _counts(junit: Path) -> tuple[int | None, int | None, int | None]:
    """(passed, failed, skipped) from pytest's JUnit XML; failed counts errors too."""
    try:
        root = ET.parse(junit).getroot()
    except (OSError, ET.ParseError):
        return None, None, None
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    total = failed = skipped = 0
    for suite in suites:
        total += int(suite.get("tests", 0))
        failed += int(suite.get("failures", 0)) + int(suite.get("errors", 0))
        skipped += int(suite.get("skipped", 0))
    return total - failed - skipped, failed, skipped


def _result(code: int) -> str:
    return {0: "passed", 1: "failed", NO_TESTS: "no tests"}.get(code, f"error (exit {code})")


def run_env(
    env: str,
    folder: Path,
    python: str,
    installer: str,
    install: list[str],
    pytest_args: list[str],
    workdir: Path,
    recreate: bool,
) -> Outcome:
    """Make (or reuse) the set's environment, then run pytest there from the project root."""
    project = Path.cwd()
    pins = folder / f"{env}.txt"
    env_dir = workdir / env
    stamp = env_dir / STAMP
    wanted = _fingerprint(pins, python, installer, install, project)
    made = stamp.is_file() and stamp.read_text(encoding="utf-8") == wanted
    if recreate or not made:
        _replace(env_dir)
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / ".gitignore").write_text("*\n", encoding="utf-8")
        _say(f"{env}: installing {pins.name} on Python {python} ({installer})")
        log = workdir / f"{env}.install.log"
        requirements = ["-r", str(pins), *this_compatshim(), "pytest", *install]
        if not _make(env_dir, python, installer, requirements, log):
            tail = log.read_text(encoding="utf-8", errors="replace").splitlines()[-15:]
            print("\n".join(tail), file=sys.stderr)
            _say(f"{env}: install failed; the whole log: {log}")
            return Outcome(env, python, "install failed")
        stamp.write_text(wanted, encoding="utf-8")
    else:
        _say(f"{env}: reusing {env_dir}")
    junit = env_dir / "junit.xml"
    junit.unlink(missing_ok=True)
    environ = {k: v for k, v in os.environ.items() if k not in LEFT_OUT}
    environ["VIRTUAL_ENV"] = str(env_dir)
    environ["PATH"] = os.pathsep.join([str(env_python(env_dir).parent), environ.get("PATH", "")])
    command = [str(env_python(env_dir)), "-m", "pytest", f"--junitxml={junit}", *pytest_args]
    _say(f"{env}: {shlex.join(['python', *command[1:]])}")
    started = time.monotonic()
    code = subprocess.run(command, env=environ).returncode
    seconds = time.monotonic() - started
    return Outcome(env, python, _result(code), *_counts(junit), seconds=seconds)


def _say(line: str) -> None:
    print(f"compatshim matrix: {line}", flush=True)


def table(rows: list[list[str]], right: Collection[int] = ()) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(
            (cell.rjust(width) if i in right else cell.ljust(width))
            for i, (cell, width) in enumerate(zip(row, widths))
        ).rstrip()
        for row in rows
    )


def summary(outcomes: list[Outcome]) -> str:
    def cell(value: int | float | None) -> str:
        if value is None:
            return "-"
        return f"{value:.1f}" if isinstance(value, float) else str(value)

    rows = [["env", "python", "result", "passed", "failed", "skipped", "seconds"]]
    for o in outcomes:
        rows.append([o.env, o.python, o.result, *map(cell, o[3:])])
    return table(rows, right={3, 4, 5, 6})


USAGE = "compatshim matrix [options] [-- PYTEST_ARGS]"


def parser() -> argparse.ArgumentParser:
    cli = argparse.ArgumentParser(
        prog="compatshim matrix",
        usage=USAGE,
        description="Run your project's tests (python -m pytest PYTEST_ARGS, from the project "
        "root) on each chosen pin set of compatshim's matrix, each in its own cached "
        "environment (docs/matrix.md).",
        epilog="exit status: 0 every chosen set passed; 1 one did not (failed, no tests ran, "
        "install failed); 2 a bad request",
    )
    cli.add_argument("--list", action="store_true", help="the pin sets (or the chosen ones)")
    cli.add_argument("--env", action="append", default=[], metavar="NAME", help="a pin set")
    cli.add_argument(
        "--family", action="append", default=[], metavar="F", help="every set of a family"
    )
    cli.add_argument("--pins", metavar="DIR", help="another folder of <name>.txt pin files")
    cli.add_argument(
        "--python", metavar="X.Y", help="another Python than the set's own (its py3.X, else 3.11)"
    )
    cli.add_argument(
        "--install",
        action="append",
        metavar="SPEC",
        help="what to install, as pip arguments (default: -e .); repeatable",
    )
    cli.add_argument("--installer", choices=("uv", "pip"), help="default: uv where on PATH")
    cli.add_argument("--workdir", default=WORKDIR, help=f"the environments (default: {WORKDIR})")
    cli.add_argument("--recreate", action="store_true", help="make the environments again")
    cli.add_argument("paths", nargs="*", metavar="PATH", help="test paths, passed to pytest")
    return cli


def main(argv: Sequence[str]) -> int:
    """``compatshim matrix``: 0 every chosen set passed, 1 one did not, 2 a bad request.
    Everything after the first ``--`` goes to pytest as it is."""
    argv = list(argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    args = parser().parse_args(argv[:cut])
    pytest_args = [*args.paths, *argv[cut + 1 :]]
    try:
        if args.python is not None and not re.fullmatch(r"\d+\.\d+(\.\d+)?", args.python):
            raise MatrixError(  # else an install that fails only once the env is being made
                f"--python {args.python}: expected a Python version such as 3.12"
            )
        folder = Path(args.pins).resolve() if args.pins else default_pins()
        if args.list:
            chosen = choose(folder, args.env, args.family) if args.env or args.family else None
            names = known_sets(folder) if chosen is None else chosen
            rows = [["env", "family", "python", "description"]]
            rows += [
                [n, family(n), args.python or python_of(n), describe(folder / f"{n}.txt")]
                for n in names
            ]
            print(table(rows))
            return 0
        chosen = choose(folder, args.env, args.family)
        installer = args.installer or ("uv" if shutil.which("uv") else "pip")
        if installer == "uv" and not shutil.which("uv"):
            raise MatrixError("--installer uv: no uv on PATH")
        if args.install:
            specs = [arg for spec in args.install for arg in shlex.split(spec)]
        elif any((Path.cwd() / name).is_file() for name in BUILD_FILES):
            specs = ["-e", str(Path.cwd())]
        else:
            raise MatrixError(
                f"no project in {Path.cwd()} (pyproject.toml, setup.py): run from its root, "
                "or say what to install with --install"
            )
        workdir = Path(args.workdir).resolve()
        check_workdir(workdir)
        for env in chosen:  # all of them first: exit 2 before anything is installed
            check_free(workdir / env)
        outcomes = [
            run_env(
                env,
                folder,
                args.python or python_of(env),
                installer,
                specs,
                pytest_args,
                workdir,
                args.recreate,
            )
            for env in chosen
        ]
    except MatrixError as exc:
        print(f"compatshim matrix: {exc}", file=sys.stderr)
        return 2
    print()
    print(summary(outcomes))
    return 0 if all(o.result == "passed" for o in outcomes) else 1
