"""CPython 3.14 and 3.15 for the matrix, from Debian's own packages, installed nowhere but a cache.

    python3 matrix/pythons.py [3.14] [3.15]   # prints each interpreter's path

No release of these machines' Debian (bookworm, glibc 2.36) ships them, and uv's and
python.org's downloads are out of reach; Debian's archive is not. Its newer suite (``sid``)
builds them against glibc >= 2.38, so ``apt-get install`` is not the way. Instead, with a
private apt configuration (its own sources, lists and cache; the system's apt state is not
read or written), the interpreter's packages, the newer ``libc6`` and the few libraries it
links are downloaded and unpacked (``dpkg-deb -x``) into one folder per version, and the
interpreter is pointed at the unpacked loader and libraries (``patchelf --set-interpreter``
and ``--force-rpath --set-rpath``: an RPATH, unlike a RUNPATH, also serves the extension
modules it loads). patchelf is the suite's own, run through that loader, so the host needs
only ``apt-get`` and ``dpkg-deb``. Debian's ``python3-pip-whl`` comes along for
``venv --without-pip`` envs (:func:`pip_wheel`).

``<cache>/<version>/bin/python<version>`` (cache: ``$COMPATSHIM_TEST_PYTHONS`` or
``~/.cache/compatshim-pythons``) appears only once the interpreter has imported ssl, ctypes,
sqlite3, lzma, bz2, zlib and readline; a second run finds it and does nothing. Where the
archive cannot be reached, :class:`Unreachable` says so and nothing is left behind: tox's
plugin (toxfile.py) then skips those envs with that reason.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

VERSIONS = ("3.14", "3.15")
SUITE = os.environ.get("COMPATSHIM_TEST_PYTHONS_SUITE", "sid")
ARCHIVE = os.environ.get("COMPATSHIM_TEST_PYTHONS_ARCHIVE", "http://deb.debian.org/debian")
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
# what the interpreter and its extension modules link, and patchelf's own runtime
LIBRARIES = (
    "libc6",
    "libgcc-s1",
    "libstdc++6",
    "libssl3t64",
    "libffi8",
    "libexpat1",
    "zlib1g",
    "libzstd1",
    "liblzma5",
    "libbz2-1.0",
    "libsqlite3-0",
    "libreadline8t64",
    "libncursesw6",
    "libtinfo6",
    "libuuid1",
    "patchelf",
    "python3-pip-whl",
)
MUST_IMPORT = ("ssl", "ctypes", "sqlite3", "lzma", "bz2", "zlib", "readline", "venv")
MULTIARCH = "x86_64-linux-gnu"
LOADER = f"usr/lib/{MULTIARCH}/ld-linux-x86-64.so.2"
LIBRARY_DIRS = (f"usr/lib/{MULTIARCH}", f"lib/{MULTIARCH}")


class Unreachable(RuntimeError):
    """The archive (or the tools to read it) is not available here: skip, do not fail."""


def cache_root() -> Path:
    return Path(
        os.environ.get("COMPATSHIM_TEST_PYTHONS") or Path.home() / ".cache/compatshim-pythons"
    )


def interpreter(version: str, root: Path | None = None) -> Path:
    """Where ``version``'s interpreter is, installed or not."""
    return (root or cache_root()) / version / "bin" / f"python{version}"


def installed(version: str, root: Path | None = None) -> Path | None:
    exe = interpreter(version, root)
    return exe if exe.is_file() and os.access(exe, os.X_OK) else None


def pip_wheel(version: str, root: Path | None = None) -> Path:
    """Debian's pip wheel unpacked beside ``version``'s interpreter (``venv --without-pip``)."""
    wheels = sorted(
        ((root or cache_root()) / version / "usr/share/python-wheels").glob("pip-*.whl")
    )
    if not wheels:
        raise FileNotFoundError(f"no pip wheel beside Python {version}: run matrix/pythons.py")
    return wheels[-1]


def ensure(version: str, root: Path | None = None, log: Path | None = None) -> Path:
    """``version``'s interpreter, installed first if it is not (a lock keeps runs apart)."""
    if version not in VERSIONS:
        raise ValueError(f"version: {version!r} is not one of {', '.join(VERSIONS)}")
    root = root or cache_root()
    found = installed(version, root)
    if found:
        return found
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root / ".lock"):
        found = installed(version, root)  # another run finished it while this one waited
        if found:
            return found
        _install(version, root, log)
    exe = installed(version, root)
    assert exe is not None
    return exe


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _run(args: list[str], what: str, log: Path | None, cwd: Path | None = None) -> str:
    done = subprocess.run(args, capture_output=True, text=True, check=False, cwd=cwd)
    output = done.stdout + done.stderr
    if log is not None:
        with log.open("a") as handle:
            handle.write(f"$ {' '.join(args)}\n{output}\n")
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed (exit {done.returncode}):\n{output[-2000:]}")
    return output


def _apt(apt_dir: Path) -> list[str]:
    """apt options that read and write only ``apt_dir`` (sources, lists, cache, status)."""
    sources = apt_dir / "sources.list"
    status = apt_dir / "status"
    if not sources.exists():
        (apt_dir / "lists/partial").mkdir(parents=True, exist_ok=True)
        (apt_dir / "cache/archives/partial").mkdir(parents=True, exist_ok=True)
        status.touch()
        sources.write_text(f"deb [signed-by={KEYRING}] {ARCHIVE} {SUITE} main\n")
    return [
        f"-oDir::Etc::sourcelist={sources}",
        "-oDir::Etc::sourceparts=/dev/null",
        f"-oDir::State::Lists={apt_dir / 'lists'}",
        f"-oDir::State::status={status}",
        f"-oDir::Cache={apt_dir / 'cache'}",
        "-oAPT::Architecture=amd64",
        "-oAPT::Architectures::=amd64",
        "-oAcquire::http::Timeout=20",
        "-oAcquire::Retries=2",
        "-oAcquire::Languages=none",
        "-oDebug::NoLocking=1",
    ]


def _download(version: str, work: Path, log: Path | None) -> list[Path]:
    for tool in ("apt-get", "dpkg-deb"):
        if shutil.which(tool) is None:
            raise Unreachable(f"{tool} not found: Python {version} comes from Debian's archive")
    if not Path(KEYRING).is_file():
        raise Unreachable(f"{KEYRING} not found: Debian's archive cannot be verified")
    apt = _apt(work / "apt")
    try:
        _run(["apt-get", *apt, "update"], f"apt-get update ({ARCHIVE} {SUITE})", log)
    except RuntimeError as exc:
        raise Unreachable(str(exc)) from exc
    # apt-get update exits 0 even when nothing could be fetched: the index is the proof
    if not any((work / "apt/lists").glob(f"*_dists_{SUITE}_*Packages*")):
        raise Unreachable(f"{ARCHIVE} ({SUITE}) cannot be reached: apt-get update fetched no index")
    packages = [
        f"python{version}-minimal",
        f"libpython{version}-minimal",
        f"libpython{version}-stdlib",
        *LIBRARIES,
    ]
    debs = work / "debs"
    debs.mkdir()
    try:
        _run(["apt-get", *apt, "download", *packages], f"apt-get download ({SUITE})", log, debs)
    except RuntimeError as exc:
        raise (Unreachable if "Failed to fetch" in str(exc) else RuntimeError)(str(exc)) from exc
    return sorted(debs.glob("*.deb"))


def _install(version: str, root: Path, log: Path | None) -> None:
    with tempfile.TemporaryDirectory(prefix=f".{version}-", dir=root) as scratch:
        work = Path(scratch)
        tree = work / "tree"
        tree.mkdir()
        for deb in _download(version, work, log):
            _run(["dpkg-deb", "-x", str(deb), str(tree)], f"dpkg-deb -x {deb.name}", log)
        _patch(version, tree, root / version, log)
        _check(version, tree, log)
        final = root / version
        if final.exists():  # a half-made folder from an interrupted run (never renamed into place)
            shutil.rmtree(final)
        os.replace(tree, final)


def _patch(version: str, tree: Path, final: Path, log: Path | None) -> None:
    """Point the interpreter at the unpacked loader and libraries, at their final paths."""
    loader = tree / LOADER
    if not loader.is_file():
        raise RuntimeError(f"libc6 from {SUITE} has no {LOADER}")
    libraries = os.pathsep.join(str(tree / d) for d in LIBRARY_DIRS if (tree / d).is_dir())
    patchelf = [str(loader), "--library-path", libraries, str(tree / "usr/bin/patchelf")]
    exe = tree / "usr/bin" / f"python{version}"
    rpath = os.pathsep.join(str(final / d) for d in LIBRARY_DIRS if (tree / d).is_dir())
    # this order, in two runs: patchelf 0.18 setting the RPATH after (or with) the interpreter
    # writes a binary that segfaults at start
    _run([*patchelf, "--force-rpath", "--set-rpath", rpath, str(exe)], "patchelf --set-rpath", log)
    _run([*patchelf, "--set-interpreter", str(final / LOADER), str(exe)], "patchelf", log)
    (tree / "bin").mkdir(exist_ok=True)
    (tree / "bin" / f"python{version}").symlink_to(f"../usr/bin/python{version}")


def _check(version: str, tree: Path, log: Path | None) -> None:
    """Run it (through the unpacked loader: the patched paths exist only once it is moved)."""
    loader = tree / LOADER
    libraries = os.pathsep.join(str(tree / d) for d in LIBRARY_DIRS if (tree / d).is_dir())
    exe = tree / "usr/bin" / f"python{version}"
    code = f"import sys, {', '.join(MUST_IMPORT)}; print(sys.version)"
    _run([str(loader), "--library-path", libraries, str(exe), "-c", code], f"Python {version}", log)


def main(argv: list[str]) -> int:
    status = 0
    for version in argv or VERSIONS:
        try:
            print(ensure(version))
        except Unreachable as exc:
            print(
                f"matrix/pythons.py: Python {version} not installed, skipped: {exc}",
                file=sys.stderr,
            )
            status = max(status, 3)
        except (RuntimeError, OSError, ValueError) as exc:
            print(
                f"matrix/pythons.py: Python {version} could not be installed: {exc}",
                file=sys.stderr,
            )
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
