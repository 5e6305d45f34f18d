"""A ``COMPATSHIM_*`` variable compatshim does not read is warned about once, with the nearest
known name (issue 38 item 5), in a fresh interpreter: the check runs when compatshim reads its
settings module, once per process, and costs nothing (no difflib) when every name is known."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from importlib import metadata
from pathlib import Path

import pytest

import compatshim
from compatshim import _settings
from tests.harness.sites import site_folders

SRC = str(Path(compatshim.__file__).resolve().parents[1])
pytestmark = pytest.mark.timeout(120)


def _python(
    code: str, action: str = "always", **variables: str
) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter without the start-up hook (``-S``: no ``.pth`` runs;
    the tree, then this interpreter's site-packages, on the path), so the names are checked
    when ``code`` imports compatshim; the hook's own check is tested below."""
    env = {k: v for k, v in os.environ.items() if k[:11].upper() != "COMPATSHIM_"}
    paths = dict.fromkeys((SRC, *site_folders()))
    env.update(PYTHONPATH=os.pathsep.join(paths), **variables)
    return subprocess.run(
        [sys.executable, "-S", "-W", action, "-c", textwrap.dedent(code)],
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
    # the warning lines (Python 3.13+ also prints the -c source line under each)
    lines = [line for line in done.stderr.splitlines() if "RuntimeWarning" in line]
    assert len(lines) == 3, done.stderr  # once each, though -W always repeats nothing for us
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


def test_a_switch_set_to_a_value_it_does_not_know_is_warned_once_with_what_it_reads() -> None:
    """``COMPATSHIM_AUTO=flase`` armed every patch in silence (the hook reads any value but
    the false ones as on); ``COMPATSHIM_LOG=verbose`` logged nothing in silence."""
    done = _python(
        "import compatshim.auto, compatshim.checkpoint",
        COMPATSHIM_AUTO="flase",
        COMPATSHIM_SAFE_LOAD="maybe",
        COMPATSHIM_LOG="verbose",
    )
    lines = [line for line in done.stderr.splitlines() if "RuntimeWarning" in line]
    assert done.returncode == 0 and len(lines) == 3, done.stderr
    assert "COMPATSHIM_AUTO='flase' is read as on (on: 1, true, yes, on;" in lines[0]
    assert "COMPATSHIM_SAFE_LOAD='maybe' is read as on" in lines[1]
    assert "COMPATSHIM_LOG='verbose' is ignored (known: debug)" in lines[2]
    quiet = _python("import compatshim", COMPATSHIM_AUTO=" Yes ", COMPATSHIM_SAFE_LOAD="off",
                    COMPATSHIM_LOG="DEBUG")  # fmt: skip
    assert quiet.returncode == 0 and "RuntimeWarning" not in quiet.stderr, quiet.stderr


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


# -- the start-up hook: a process that never imports compatshim (issue 38) ----------------------
@pytest.fixture(scope="module")
def hooked_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv whose site-packages holds the tree's start-up files as the wheel installs
    them (``.pth`` and ``.start``) and packaging; ``PYTHONPATH`` (see :func:`_hooked`) puts
    the tree's hook and package first, so every interpreter it starts runs this tree's hook."""
    venv = tmp_path_factory.mktemp("hooked") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    for name in ("compatshim_auto.pth", "compatshim_auto.start"):
        (Path(site) / name).write_bytes((Path(SRC) / name).read_bytes())
    for file in metadata.files("packaging") or ():  # compatshim's one dependency
        source = Path(str(file.locate()))
        if source.is_file() and not str(file).startswith(".."):
            (Path(site) / str(file)).parent.mkdir(parents=True, exist_ok=True)
            (Path(site) / str(file)).write_bytes(source.read_bytes())
    return python


def _hooked(
    python: Path, script: str, *flags: str, **variables: str
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith(("COMPATSHIM_", "PY"))}
    env.update(PYTHONPATH=SRC, **variables)
    return subprocess.run(
        [str(python), *flags, "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        env=env,
        timeout=100,
    )


NEVER_IMPORTS = """
import sys
print("hook ran:", "compatshim_auto" in sys.modules)
"""


def test_the_hook_warns_a_process_that_never_imports_compatshim(hooked_python: Path) -> None:
    done = _hooked(hooked_python, NEVER_IMPORTS, COMPATSHIM_AUOT="1")
    assert done.returncode == 0 and done.stdout.strip() == "hook ran: True", done.stderr
    assert done.stderr.count("RuntimeWarning") == 1, done.stderr
    assert (
        "RuntimeWarning: compatshim: COMPATSHIM_AUOT is not a compatshim setting, ignored; "
        "did you mean COMPATSHIM_AUTO?" in done.stderr
    )


def test_the_hook_warns_a_lowercase_slip_too_and_still_under_warnings_as_errors(
    hooked_python: Path,
) -> None:
    done = _hooked(hooked_python, NEVER_IMPORTS, "-W", "error", compatshim_safe_load="1")
    assert done.returncode == 0 and done.stdout.strip() == "hook ran: True", done.stderr
    assert done.stderr.count("compatshim_safe_load is not a compatshim setting") == 1
    assert done.stderr.rstrip().endswith("did you mean COMPATSHIM_SAFE_LOAD?"), done.stderr


@pytest.mark.parametrize("auto", ["", "1"])
def test_a_name_the_hook_warned_is_not_warned_again_when_compatshim_is_imported(
    hooked_python: Path, auto: str
) -> None:
    done = _hooked(
        hooked_python,
        """
        import compatshim, compatshim.checkpoint, compatshim.dist, compatshim.rng
        from compatshim import _settings
        _settings.unknown_names(), _settings.safe_load()
        print("IMPORTED")
        """,
        "-W",
        "always",
        COMPATSHIM_AUTO=auto,
        COMPATSHIM_DESYNC_TIMEOT="5",
    )
    assert done.returncode == 0 and done.stdout.strip() == "IMPORTED", done.stderr
    assert done.stderr.count("RuntimeWarning") == 1, done.stderr
    assert "COMPATSHIM_DESYNC_TIMEOT is not a compatshim setting" in done.stderr
    assert done.stderr.count("did you mean COMPATSHIM_DESYNC_TIMEOUT?") == 1


def test_the_hook_is_quiet_and_imports_nothing_for_known_and_test_suite_names(
    hooked_python: Path,
) -> None:
    done = _hooked(
        hooked_python,
        """
        import sys
        print(sorted(m for m in sys.modules if m.startswith(("compatshim", "difflib"))))
        """,
        "-W",
        "error",
        COMPATSHIM_DESYNC_TIMEOUT="5",
        COMPATSHIM_LOG="",
        COMPATSHIM_ALLOW="fractions.Fraction",
        COMPATSHIM_ALLOW_FILE="/nonexistent",
        COMPATSHIM_DISABLE="x",
        COMPATSHIM_DOCTOR_TIMEOUT="1",
        COMPATSHIM_AUTO="0",
        COMPATSHIM_TEST_ANYTHING="1",
        compatshim_test_lower="1",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['compatshim_auto']", done.stdout
    assert done.stderr == ""


def test_a_warning_at_start_up_names_the_start_up_not_the_hooks_own_line(
    hooked_python: Path,
) -> None:
    """Warned while the hook armed the patches, each warning was shown as
    ``compatshim_auto.py:60`` with the source line ``__import__("compatshim.auto")``: no line
    of the user's led there. It is now shown at ``<compatshim start-up hook>``."""
    done = _hooked(
        hooked_python,
        NEVER_IMPORTS,
        "-W",
        "always",
        COMPATSHIM_AUTO="flase",
        COMPATSHIM_AUOT="1",
        COMPATSHIM_DISABLE="no-such-patch",
    )
    assert done.returncode == 0 and done.stdout.strip() == "hook ran: True", done.stderr
    assert "compatshim_auto.py" not in done.stderr and "__import__" not in done.stderr
    lines = [line for line in done.stderr.splitlines() if "RuntimeWarning" in line]
    assert len(lines) == 3, done.stderr
    assert all(line.startswith("<compatshim start-up hook>:0: RuntimeWarning: ") for line in lines)
    said = "\n".join(lines)
    assert "COMPATSHIM_AUTO='flase' is read as on" in said, said
    assert "COMPATSHIM_AUOT is not a compatshim setting" in said, said
    assert "'no-such-patch' matches no patch" in said, said
    assert done.stderr.count("\n") == 3, done.stderr  # no source line under any


def test_the_hooks_list_of_names_is_the_settings_modules() -> None:
    """The hook repeats the names by hand (importing compatshim costs milliseconds)."""
    import compatshim_auto

    assert set(compatshim_auto._KNOWN) == set(_settings._known())
