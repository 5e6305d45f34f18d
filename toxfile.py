"""tox inline plugin: the matrix envs come from matrix/*.txt; uv finds the wheels and
interpreters pip and pyenv know.

- The matrix. Every ``matrix/<env>.txt`` is a tox env of that name: tox.ini's
  ``env_list`` and the ``matrix`` label are made here (``lint`` plus one env per
  pin file), so a new release is one pin file. ``matrix/bench*.txt`` are the
  bench envs' pins (their sections are in tox.ini) and stay out of the matrix.
  The env's family is its name up to the first ``-`` (the ``[testenv]`` commands'
  factor). A name ending in ``-2.X`` or ``-3.X`` is refused: tox would read it as
  a Python version (``resume-lightning2.6.txt``, not ``resume-lightning-2.6.txt``).
  The env's description (``tox l``) is the first sentence of the pin file's comment.

Two gaps between these machines and uv, closed here and nowhere else:

- Wheels. Machines here carry a CPU build of torch in a local folder that pip
  knows as ``find-links`` (``PIP_FIND_LINKS`` or pip.conf). uv reads neither,
  so it is passed on as ``UV_FIND_LINKS`` when the folder exists.
- Interpreters. The matrix runs envs on Python 3.9-3.13 (``py3.X`` factors,
  ``base_python``). pyenv installs them under ``$PYENV_ROOT/versions/3.X.Y``,
  but puts only its shims on PATH, and a shim for a version that is not
  selected (``pyenv global``) exits 127; uv stops at such a shim instead of
  looking further. So for each pyenv-installed minor version that PATH does
  not already offer as a real interpreter, a link named ``python3.X`` to the
  newest installed patch release goes into ``.tox/.pyenv-pythons``, and that
  folder is put first on PATH. Only versioned names are linked: ``python``
  and ``python3`` keep resolving as before. Without pyenv nothing changes and
  uv's own discovery (PATH, uv-managed Pythons) decides.
- Python 3.14 and 3.15. No pyenv or uv download reaches them here; matrix/pythons.py
  installs them from Debian's archive into a cache outside the checkout. Their ``bin``
  folders go on PATH once installed; an env on 3.14/3.15 (``py3.14`` factor or
  ``base_python``) that this run will run installs its interpreter first (once, ~20 s;
  nothing when cached). Where the archive cannot be reached, the env is skipped with the
  reason (its ``platform`` is set to a pattern no platform matches, which tox reports as a
  skip), never run elsewhere; any other install failure is logged and the env fails.
"""

from __future__ import annotations

import configparser
import importlib.util
import logging
import os
import re
import shutil
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from tox.config.loader.memory import MemoryLoader
from tox.config.types import EnvList
from tox.plugin import impl
from tox.report import HandledError

if TYPE_CHECKING:
    from tox.config.sets import CoreConfigSet, EnvConfigSet
    from tox.session.state import State

MATRIX_LABEL = "matrix"
ALSO_IN_MATRIX = ("lint",)  # envs of tox.ini's own that the matrix runs too
PYTHON_SUFFIX = re.compile(r"-([23]\.\d+)$")  # tox reads `-2.6` as "Python 2.6"
PYENV_RELEASE = re.compile(r"^3\.(\d+)\.(\d+)$")  # CPython releases only: no -dev, t, envs
LINK_DIR = Path(__file__).resolve().parent / ".tox" / ".pyenv-pythons"
RUN_COMMANDS = {"legacy", "le", "run", "r", "run-parallel", "p", "exec", "e", "devenv", "d"}


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


HERE = Path(__file__).resolve().parent
# matrix/pythons.py: the one owner of how 3.14/3.15 are installed (a script, not a package)
pythons = _load("compatshim_matrix_pythons", HERE / "matrix" / "pythons.py")
# compatshim's matrix command: the one reader of the pin folder (tox's interpreter need not
# have compatshim installed: loaded by path, it imports only the standard library)
pin_files = _load("compatshim_matrix_cli", HERE / "src" / "compatshim" / "matrix_cli.py")
describe = pin_files.describe


def matrix_envs(folder: Path) -> list[str]:
    """One env per pin set in ``folder`` (``<env>.txt``, sorted; ``bench*.txt`` left out)."""
    envs: list[str] = pin_files.pin_sets(folder)
    for env in envs:
        clash = PYTHON_SUFFIX.search(env)
        if clash:
            fixed = env[: clash.start()] + clash[1]
            raise HandledError(
                f"{folder / env}.txt: tox reads a name ending in '-{clash[1]}' as Python "
                f"{clash[1]}; rename it {fixed}.txt"
            )
    return envs


@impl
def tox_add_core_config(core_conf: CoreConfigSet, state: State) -> None:
    """``env_list`` and the ``matrix`` label: ``lint`` and each pin file's env (not in tox.ini),
    each pin file's env described by its first comment line."""
    folder = Path(core_conf["tox_root"]) / "matrix"
    envs = [*ALSO_IN_MATRIX, *matrix_envs(folder)]
    core_conf.loaders.append(MemoryLoader(env_list=EnvList(envs)))
    for env in envs:
        seed = {"labels": [MATRIX_LABEL]}
        if env not in ALSO_IN_MATRIX:
            seed["description"] = describe(folder / f"{env}.txt")
        state.conf.memory_seed_loaders[env].append(MemoryLoader(**seed))


def debian_python(env_conf: EnvConfigSet) -> str | None:
    """``"3.14"`` or ``"3.15"`` where the env runs on a Python matrix/pythons.py installs."""
    for spec in env_conf["base_python"]:
        match = re.fullmatch(r"(?:py|python)?(3\.\d+)", str(spec))
        if match and match[1] in pythons.VERSIONS:
            return str(match[1])
    return None


def runs(env_conf: EnvConfigSet, state: State) -> bool:
    """Whether this tox run will run the env (tox defines every env, selected or not)."""
    options = state.conf.options
    if getattr(options, "command", None) not in RUN_COMMANDS:
        return False  # tox list, config, depends, ...
    name = env_conf.name
    labels = set(getattr(options, "labels", None) or [])
    factor_sets = getattr(options, "factors", None) or []
    if labels or factor_sets:
        core_labels = state.conf.core["labels"]
        return (
            bool(labels & set(env_conf["labels"]))
            or any(name in core_labels.get(label, ()) for label in labels)
            or any(set(group) <= set(name.split("-")) for group in factor_sets)
        )
    chosen = getattr(options, "env", None)
    if chosen is None or chosen.is_all or chosen.is_default_list:
        return True
    return name in chosen


def put_on_path(folder: Path) -> None:
    path = os.environ.get("PATH", "")
    if str(folder) not in path.split(os.pathsep):
        os.environ["PATH"] = os.pathsep.join([str(folder), path]) if path else str(folder)


@impl
def tox_add_env_config(env_conf: EnvConfigSet, state: State) -> None:
    """Install the 3.14/3.15 interpreter of an env this run runs; skip it where it cannot be."""
    version = debian_python(env_conf)
    if version is None or not runs(env_conf, state):
        return
    try:
        exe = pythons.ensure(version)
    except pythons.Unreachable as exc:
        reason = f"Python {version} is not installed: {exc}".splitlines()[0]
        logging.warning("%s: skipped: %s (matrix/pythons.py)", env_conf.name, reason)
        pattern = re.sub(r"[^\w .:,/-]", " ", reason)  # a pattern no platform name matches
        env_conf.loaders.insert(0, MemoryLoader(platform=pattern))
        return
    except (RuntimeError, OSError) as exc:
        logging.error(
            "%s: matrix/pythons.py could not install Python %s: %s", env_conf.name, version, exc
        )
        return
    put_on_path(exe.parent)


def expose_debian_pythons() -> None:
    """The ``bin`` folder of each interpreter matrix/pythons.py has installed goes on PATH."""
    for version in pythons.VERSIONS:
        exe = pythons.installed(version)
        if exe is not None:
            put_on_path(exe.parent)


def _pip_find_links() -> list[str]:
    found = os.environ.get("PIP_FIND_LINKS", "").split()
    for conf in (
        Path("/etc/pip.conf"),
        Path.home() / ".config/pip/pip.conf",
        Path.home() / ".pip/pip.conf",
    ):
        parser = configparser.ConfigParser()
        try:
            parser.read(conf)
        except configparser.Error:
            continue
        found += parser.get("global", "find-links", fallback="").split()
    return [link for link in dict.fromkeys(found) if Path(link).is_dir()]


def pyenv_root() -> Path:
    return Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv")


def pyenv_interpreters(root: Path) -> dict[str, Path]:
    """``{"python3.12": <root>/versions/3.12.1/bin/python3.12, ...}``, newest patch per minor."""
    newest: dict[int, tuple[int, Path]] = {}
    versions = root / "versions"
    if not versions.is_dir():
        return {}
    for folder in versions.iterdir():
        match = PYENV_RELEASE.match(folder.name)
        if not match or folder.is_symlink():  # pyenv-virtualenv envs are symlinks
            continue
        minor, patch = int(match[1]), int(match[2])
        exe = folder / "bin" / f"python3.{minor}"
        if exe.is_file() and os.access(exe, os.X_OK) and patch >= newest.get(minor, (-1,))[0]:
            newest[minor] = (patch, exe)
    return {f"python3.{minor}": exe for minor, (_, exe) in sorted(newest.items())}


def missing_from_path(found: dict[str, Path], root: Path, path: str) -> dict[str, Path]:
    """The interpreters PATH does not offer itself: absent, or only as a pyenv shim."""
    shims = (root / "shims").resolve()
    missing = {}
    for name, exe in found.items():
        on_path = shutil.which(name, path=path)
        if on_path is None or Path(on_path).resolve().parent == shims:
            missing[name] = exe
    return missing


def link_interpreters(interpreters: dict[str, Path], folder: Path) -> None:
    """One ``python3.X`` link per interpreter, replaced atomically (tox runs may overlap)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, exe in interpreters.items():
        link = folder / name
        if link.is_symlink() and Path(os.readlink(link)) == exe:
            continue
        staging = folder / f".{name}.{os.getpid()}"
        staging.unlink(missing_ok=True)
        staging.symlink_to(exe)
        os.replace(staging, link)


def expose_pyenv_interpreters() -> None:
    root = pyenv_root()
    path = os.environ.get("PATH", "")
    missing = missing_from_path(pyenv_interpreters(root), root, path)
    if not missing:
        return
    try:
        link_interpreters(missing, LINK_DIR)
    except OSError:  # read-only checkout: leave discovery to uv
        return
    put_on_path(LINK_DIR)


if "UV_FIND_LINKS" not in os.environ:
    links = _pip_find_links()
    if links:
        os.environ["UV_FIND_LINKS"] = ",".join(links)

expose_pyenv_interpreters()
expose_debian_pythons()
