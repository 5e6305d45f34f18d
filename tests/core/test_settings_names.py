"""A ``COMPATSHIM_*`` variable compatshim does not read is warned about once, with the nearest
known name (issue 38 item 5), in a fresh interpreter: the check runs when compatshim reads its
settings module, once per process, and costs nothing (no difflib) when every name is known."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import compatshim
from compatshim import _settings

SRC = str(Path(compatshim.__file__).resolve().parents[1])
pytestmark = pytest.mark.timeout(120)


def _python(
    code: str, action: str = "always", **variables: str
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k[:11].upper() != "COMPATSHIM_"}
    env.update(PYTHONPATH=SRC, **variables)
    return subprocess.run(
        [sys.executable, "-W", action, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=env,
        timeout=100,
    )


def test_a_misspelt_name_is_warned_once_with_the_nearest_known_name() -> None:
    done = _python(
        """
        import compatshim
        import compatshim.checkpoint, compatshim.dist, compatshim.rng
        from compatshim import _settings
        _settings.safe_load(), _settings.desync_timeout()
        """,
        COMPATSHIM_SAFELOAD="1",
        compatshim_auto="1",
        COMPATSHIM_DESYNC_TIMEOT="5",
    )
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 3, lines  # once each, though -W always repeats nothing for us
    # at the user's import line, not at compatshim's own file
    assert all(line.startswith("<string>:2: RuntimeWarning: compatshim: ") for line in lines)
    assert "COMPATSHIM_DESYNC_TIMEOT is not a compatshim setting" in lines[0]
    assert lines[0].endswith("did you mean COMPATSHIM_DESYNC_TIMEOUT?")
    assert lines[1].endswith("did you mean COMPATSHIM_SAFE_LOAD?"), lines
    assert "compatshim_auto is not" in lines[2] and lines[2].endswith("COMPATSHIM_AUTO?")


def test_a_name_near_nothing_lists_the_known_ones() -> None:
    done = _python("import compatshim", COMPATSHIM_HARDENED="1")
    assert done.returncode == 0 and done.stderr.count("RuntimeWarning") == 1, done.stderr
    assert "COMPATSHIM_HARDENED is not a compatshim setting, ignored; known: " in done.stderr
    assert all(name in done.stderr for name in (_settings.SAFE_LOAD, _settings.ALLOW_FILE))


def test_known_and_test_suite_names_are_quiet_and_cost_no_difflib() -> None:
    done = _python(
        """
        import sys, warnings
        warnings.simplefilter("error")
        import compatshim.auto, compatshim.checkpoint
        assert "difflib" not in sys.modules, "difflib imported with every name known"
        print("QUIET")
        """,
        COMPATSHIM_DESYNC_TIMEOUT="5",
        COMPATSHIM_LOG="",
        COMPATSHIM_ALLOW="fractions.Fraction",
        COMPATSHIM_TEST_ANYTHING="1",  # tox and the harness set these
    )
    assert done.returncode == 0 and done.stdout.strip() == "QUIET", done.stderr
    assert done.stderr == ""


def test_an_unknown_name_under_warnings_as_errors_still_imports() -> None:
    done = _python("import compatshim.auto; print('IMPORTED')", "error", COMPATSHIM_AUTOO="1")
    assert done.returncode == 0 and done.stdout.strip() == "IMPORTED", done.stderr
    assert "COMPATSHIM_AUTOO is not a compatshim setting" in done.stderr


def test_every_setting_is_known() -> None:
    known = _settings._known()
    assert set(known) >= {
        _settings.AUTO,
        _settings.DISABLE,
        _settings.DESYNC_TIMEOUT,
        _settings.DOCTOR_TIMEOUT,
        _settings.LOG,
        _settings.SAFE_LOAD,
        _settings.ALLOW,
        _settings.ALLOW_FILE,
    }
    assert all(not name.endswith("_") for name in known)
