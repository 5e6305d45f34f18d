"""Command line: ``compatshim doctor``, ``inspect``, ``scan``, ``matrix``, ``dcp-downgrade``,
``resume-check``.

Also ``python -m compatshim``.

Like any Unix tool, a command whose reader goes away (``compatshim inspect FILE |
head -1``) ends quietly: no ``BrokenPipeError`` traceback, nothing more written,
exit status 141 (128 + SIGPIPE, what the shell reports for ``yes | head -1``;
``set -o pipefail`` sees it as it sees any tool cut off by its reader). Python
ignores SIGPIPE, so the error arrives as an exception: it is caught here and
stdout pointed at the null device, so the interpreter's own flush at exit
cannot fail again (Python's documented recipe, "Note on SIGPIPE"). Output that
cannot be written for another reason (``> /dev/full``, a full disk, a dead NFS
mount) is said in one line on stderr, exit status 74 (``EX_IOERR``): never a
verdict's code, which a script would read as the answer.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import warnings
from typing import Any, Callable, Iterator, Sequence, TextIO

PIPE_CLOSED = 141  # 128 + SIGPIPE (13)
OUTPUT_LOST = 74  # sysexits.h EX_IOERR: stdout could not be written
EXIT_CODES_HELP = """\
severities and exit codes (docs/inspect.md):
  0  loadable     compatshim.checkpoint.load reads it (a DCP folder: torch's DCP load)
  1  needs-allow  load refuses only globals an allow entry admits (named, with the
                  line that allows each)
  2  unreadable   damaged (a budget bomb too: nothing of it runs), not a checkpoint,
                  a folder without a DCP .metadata, or not readable by this install
                  (also: a usage error; scan: no checkpoint found under the paths)
  3  dangerous    load refuses what nothing can allow (a denied global, a hostile
                  structure): treat it as an attack
--json prints a record on stdout whatever the outcome."""
# plain text, wrapped here: argparse would break "resume-check" at its hyphen (the module
# docstring is reST, not for a terminal)
DESCRIPTION = """\
Commands: matrix, doctor, inspect, scan, dcp-downgrade, resume-check.
Each takes --help."""
DOWNGRADE_EXIT_HELP = """\
exit codes (each failure named on stderr):
  0  written
  1  refused: the release cannot hold what SRC holds (or is before torch 2.1),
     or SRC's .metadata names what compatshim refuses to read
  2  SRC unreadable (no DCP .metadata, damaged), --torch not a release number,
     DST not a new or empty folder, or SRC itself (also: a usage error)"""
DOCTOR_EXIT_HELP = """\
exit codes (docs/doctor.md):
  0  every present breakage compatshim fixes is in force here
  1  one is not (not fixed, fixable but not in force, not probed), or a COMPATSHIM_*
     setting the job will not honour (each on a setting: line); the last line says why
  2  the live probes could not run (the reason and how to allow more time), or a
     --timeout / COMPATSHIM_DOCTOR_TIMEOUT that is not a positive number (also: a
     usage error)"""
RESUME_EXIT_HELP = """\
exit codes:
  0  the resume would succeed
  1  it would fail (each reason in the report)
  2  the folder unreadable, or --state not a usable module:function (also: a usage
     error)"""


def main(argv: Sequence[str] | None = None) -> int:
    try:
        try:
            with warnings.catch_warnings(), _escaping():  # all restored: main may be called
                warnings.showwarning = _one_line  # in-process
                with contextlib.redirect_stdout(_Output(sys.stdout)):  # type: ignore[type-var]
                    return _run(argv)
        finally:  # --help and usage errors too (argparse exits from inside)
            _output(sys.stdout.flush)
    except BrokenPipeError:
        _quiet_stdout()
        return PIPE_CLOSED
    except _OutputLost as lost:
        _quiet_stdout()
        print(f"compatshim: could not write the output: {lost.reason}", file=sys.stderr)
        return OUTPUT_LOST


class _OutputLost(Exception):
    def __init__(self, exc: OSError) -> None:
        super().__init__(exc)
        self.reason = exc.strerror or str(exc)


def _output(write: Callable[..., Any], *args: Any) -> Any:
    """``write(*args)`` on stdout, its failures told from a command's own (a file it reads):
    a closed pipe stays BrokenPipeError, any other OSError is _OutputLost."""
    try:
        return write(*args)
    except BrokenPipeError:
        raise
    except OSError as exc:
        raise _OutputLost(exc) from None


class _Output:
    """stdout through :func:`_output`: a proxy, as a failed write leaves nothing behind to
    test afterwards."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        return int(_output(self._stream.write, text))

    def flush(self) -> None:
        _output(self._stream.flush)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def _escaping() -> Iterator[None]:
    """Text the console cannot encode (a path in a cp1252 or ASCII log) printed escaped: a
    traceback and exit 1 said "needs-allow" (scan) or "refused" (dcp-downgrade)."""
    changed = []
    for stream in (sys.stdout, sys.stderr):
        if getattr(stream, "errors", None) == "strict" and hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
            changed.append(stream)
    try:
        yield
    finally:
        for stream in changed:
            stream.reconfigure(errors="strict")


def _one_line(message: Warning | str, category: type[Warning], filename: str, lineno: int,
              file: TextIO | None = None, line: str | None = None) -> None:  # fmt: skip
    """A warning on a command's stderr is its text (compatshim's start "compatshim: "), not
    Python's ``file:line: Category`` and a source line, which in a command point nowhere useful
    (a frame of the standard library, the console script's ``sys.exit(main())``)."""
    text = str(message)
    if category.__module__ != "builtins" or not text.startswith("compatshim: "):
        text = f"{category.__name__}: {text}"  # another library's: say what it is
    print(text, file=file or sys.stderr)


def _quiet_stdout() -> None:
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # no file descriptor (replaced stdout): nothing to flush
        pass


def _run(argv: Sequence[str] | None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["matrix"]:  # its own parser: all after `--` goes to pytest as it is
        from .matrix_cli import main as matrix_main

        return matrix_main(argv[1:])
    from . import __version__

    parser = argparse.ArgumentParser(
        prog="compatshim",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"compatshim {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("matrix", help="your tests on each pinned framework set (docs/matrix.md)")
    doctor = commands.add_parser(
        "doctor",
        help="installed frameworks; each known breakage: present, fixable, in force here",
        epilog=DOCTOR_EXIT_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    doctor.add_argument("--json", action="store_true", help="machine-readable output")
    doctor.add_argument(
        "-v", "--verbose", action="store_true", help="each row's full detail under it"
    )
    doctor.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="S",
        help="seconds allowed for the live probes (default: COMPATSHIM_DOCTOR_TIMEOUT, else 300)",
    )
    inspect = commands.add_parser(
        "inspect",
        help="what a checkpoint needs and holds, and whether compatshim can load it",
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    inspect.add_argument(
        "file",
        help="a torch.save file, pickle, safetensors file, numpy .npy/.npz file or DCP "
        "checkpoint folder",
    )
    inspect.add_argument("--json", action="store_true", help="machine-readable output")
    scan = commands.add_parser(
        "scan",
        help="a severity per checkpoint in files and folders (recursive), for CI",
        description="Inspect every checkpoint under the paths: each file named, and in "
        "folders (recursively) each DCP folder and each file with a checkpoint's suffix "
        "(.pt, .pth, .bin, .ckpt, .pkl, .safetensors, ...: docs/inspect.md).",
        epilog=EXIT_CODES_HELP + "\nscan exits with the worst path's code (the highest).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    scan.add_argument("paths", nargs="+", metavar="PATH", help="files and folders")
    scan.add_argument("--json", action="store_true", help="machine-readable output")
    downgrade = commands.add_parser(
        "dcp-downgrade",
        help="a DCP folder rewritten for an older torch (a new folder; exit 1 refused, "
        "2 unreadable)",
        description="Write DST: the DCP checkpoint folder SRC as the torch release --torch\n"
        "reads it. SRC is never changed.",
        epilog=DOWNGRADE_EXIT_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    downgrade.add_argument("src", metavar="SRC", help="the DCP checkpoint folder (never changed)")
    downgrade.add_argument(
        "dst", metavar="DST", help="the new folder (must not exist, or be empty)"
    )
    downgrade.add_argument("--torch", required=True, help="the release that will read it: 2.8")
    downgrade.add_argument("--copy", action="store_true", help="copy data files, not hard-link")
    resume = commands.add_parser(
        "resume-check",
        help="dry run of a DCP resume: what loads, is filled, missing, refused (exit 1 fails, "
        "2 unreadable)",
        epilog=RESUME_EXIT_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    resume.add_argument("folder", help="the DCP checkpoint folder")
    resume.add_argument(
        "--state", required=True, help="module:function returning the state dict to load into"
    )
    resume.add_argument(
        "--not-hardened", action="store_true", help="do not count hardened-mode refusals"
    )
    args, extra = parser.parse_known_args(argv)
    if extra:  # after the command: its usage, not the top level's list of commands
        after = argv.index(extra[0]) > argv.index(args.command)
        where = commands.choices[args.command] if after else parser
        where.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command == "dcp-downgrade":
        from .checkpoint._downgrade import main as downgrade_main

        return downgrade_main(args.src, args.dst, args.torch, link=not args.copy)
    if args.command == "resume-check":
        from .checkpoint._resume_plan import main as resume_main

        return resume_main(args.folder, args.state, hardened=not args.not_hardened)
    if args.command == "inspect":
        from .checkpoint.inspect_cli import main as inspect_main

        return inspect_main(args.file, as_json=args.json)
    if args.command == "scan":
        from .checkpoint.inspect_cli import scan_main

        return scan_main(args.paths, as_json=args.json)
    from . import doctor as doctor_module

    return doctor_module.main(as_json=args.json, timeout=args.timeout, verbose=args.verbose)
