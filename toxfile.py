"""tox inline plugin: the matrix envs come from matrix/*.txt; uv finds the wheels and
interpreters pip and pyenv know.

- The matrix. Every ``matrix/<env>.txt`` is a tox env of that name: tox.ini's
  ``env_list`` and the ``matrix`` label are made here (``lint`` plus one env per
  pin file), so a new release is one pin file. ``matrix/bench*.txt`` are the
  bench envs' pins (their sections are in tox.ini) and stay out of the matrix.
  The env's family is its name up to the first ``-`` (the ``[testenv]`` commands'
  factor). A name ending in ``-2.X`` or ``-3.X`` is refused: tox would read it as
  a Python version (``resume-lightning2.6.txt``, not ``resume-lightning-2.6.txt``).

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
"""

from __future__ import annotations

import configparser
import os
import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from tox.config.loader.memory import MemoryLoader
from tox.config.types import EnvList
from tox.plugin import impl
from tox.report import HandledError

if TYPE_CHECKING:
    from tox.config.sets import CoreConfigSet
    from tox.session.state import State

MATRIX_LABEL = "matrix"
ALSO_IN_MATRIX = ("lint",)  # envs of tox.ini's own that the matrix runs too
NOT_MATRIX = "bench"  # matrix/bench*.txt: pins of the bench envs defined in tox.ini
PYTHON_SUFFIX = re.compile(r"-([23]\.\d+)$")  # tox reads `-2.6` as "Python 2.6"
PYENV_RELEASE = re.compile(r"^3\.(\d+)\.(\d+)$")  # CPython releases only: no -dev, t, envs
LINK_DIR = Path(__file__).resolve().parent / ".tox" / ".pyenv-pythons"


def matrix_envs(folder: Path) -> list[str]:
    """One env per ``<env>.txt`` in ``folder`` (sorted), ``bench*.txt`` left out."""
    envs = []
    for pins in sorted(folder.glob("*.txt"), key=lambda path: path.stem):
        if pins.name.startswith(NOT_MATRIX):
            continue
        clash = PYTHON_SUFFIX.search(pins.stem)
        if clash:
            fixed = pins.stem[: clash.start()] + clash[1]
            raise HandledError(
                f"{pins}: tox reads a name ending in '-{clash[1]}' as Python {clash[1]}; "
                f"rename it {fixed}.txt"
            )
        envs.append(pins.stem)
    return envs


@impl
def tox_add_core_config(core_conf: CoreConfigSet, state: State) -> None:
    """``env_list`` and the ``matrix`` label: ``lint`` and each pin file's env (not in tox.ini)."""
    envs = [*ALSO_IN_MATRIX, *matrix_envs(Path(core_conf["tox_root"]) / "matrix")]
    core_conf.loaders.append(MemoryLoader(env_list=EnvList(envs)))
    for env in envs:
        state.conf.memory_seed_loaders[env].append(MemoryLoader(labels=[MATRIX_LABEL]))


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
    if str(LINK_DIR) not in path.split(os.pathsep):
        os.environ["PATH"] = os.pathsep.join([str(LINK_DIR), path]) if path else str(LINK_DIR)


if "UV_FIND_LINKS" not in os.environ:
    links = _pip_find_links()
    if links:
        os.environ["UV_FIND_LINKS"] = ",".join(links)

expose_pyenv_interpreters()
