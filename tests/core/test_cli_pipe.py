"""The command line behaves like a Unix tool: a reader that closes the pipe early
(``compatshim inspect FILE | head -1``) ends every subcommand quietly, exit status 141."""

from __future__ import annotations

import os
import pickle
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

PIPE_CLOSED = 141


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cli") / "small.pkl"
    path.write_bytes(pickle.dumps({"a": list(range(3))}, protocol=2))
    return path


COMMANDS = {
    "inspect": ["inspect", "{file}"],
    "inspect-json": ["inspect", "--json", "{file}"],
    "doctor": ["doctor"],
    "doctor-json": ["doctor", "--json"],
    "help": ["--help"],
    "inspect-help": ["inspect", "--help"],
}


def _args(name: str, small: Path) -> list[str]:
    return [a.format(file=small) for a in COMMANDS[name]]


def _run_into(stdout: Any, name: str, small: Path) -> subprocess.CompletedProcess[str]:
    """The command ``name`` in a child process, its stdout given (a pipe, /dev/full)."""
    return subprocess.run(
        [sys.executable, "-m", "compatshim", *_args(name, small)],
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_a_closed_pipe_ends_quietly(name: str, small: Path) -> None:
    """stdout is a real pipe whose read end is already closed: the first write fails."""
    read, write = os.pipe()
    os.close(read)
    try:
        done = _run_into(write, name, small)
    finally:
        os.close(write)
    # argparse's --help swallows its own write errors (OSError) and exits 0
    expected = (0, PIPE_CLOSED) if name.endswith("help") else (PIPE_CLOSED,)
    assert done.returncode in expected, done.stderr
    assert "Traceback" not in done.stderr and "BrokenPipeError" not in done.stderr
    assert "Exception ignored" not in done.stderr


@pytest.mark.parametrize("name", ["inspect", "inspect-json", "doctor"])
def test_head_gets_the_first_line_and_nothing_else_is_said(name: str, small: Path) -> None:
    command = shlex.join([sys.executable, "-m", "compatshim", *_args(name, small)])
    done = subprocess.run(
        ["bash", "-c", f'{command} 2>&1 | head -1; echo "status=${{PIPESTATUS[0]}}"'],
        capture_output=True,
        text=True,
        timeout=300,
    )
    first, status = done.stdout.splitlines()
    assert first in (f"{small}: pickle", "{", "compatshim doctor")
    # 141 when the reader closed before the last write; 0/1 when everything fit in the pipe
    assert status in (f"status={PIPE_CLOSED}", "status=0", "status=1"), done.stdout
    assert done.stderr == ""


def test_the_module_and_the_console_script_share_the_exit_status(small: Path) -> None:
    from compatshim import cli

    assert cli.PIPE_CLOSED == PIPE_CLOSED
    assert cli.main(["inspect", str(small)]) == 0


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full (Linux has one)")
@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_output_that_cannot_be_written_is_one_line_and_exit_74(name: str, small: Path) -> None:
    """``> /dev/full`` (a full disk): every write fails with ENOSPC, not a closed pipe."""
    with open("/dev/full", "w") as full:
        done = _run_into(full, name, small)
    from compatshim import cli

    assert done.returncode == cli.OUTPUT_LOST == 74, done.stderr
    assert done.stderr.splitlines()[-1:] == [
        "compatshim: could not write the output: No space left on device"
    ], done.stderr
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr
