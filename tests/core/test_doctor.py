"""``compatshim doctor`` against the real torch of this env: versions from metadata, live
probes in a child process, and an exit code that says whether every applicable breakage
is fixed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest


def _source_dir() -> str:
    import compatshim

    return str(Path(compatshim.__file__).resolve().parent.parent)


def _doctor(*args: str, cwd: Path | None = None, **env: str) -> tuple[int, str]:
    """``compatshim doctor`` started as a user's process is: only ``env``'s compatshim
    settings, and this tree's start-up hook first on the path (an editable install keeps a
    copy of it in site-packages)."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("COMPATSHIM_")}
    full_env["PYTHONPATH"] = os.pathsep.join(
        p for p in (_source_dir(), full_env.get("PYTHONPATH")) if p
    )
    full_env.update(env)
    done = subprocess.run(
        [sys.executable, "-m", "compatshim", "doctor", *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=300,
        cwd=cwd,
    )
    return done.returncode, done.stdout


def _check(payload: dict[str, Any], name: str) -> dict[str, Any]:
    return next(row for row in payload["checks"] if row["name"] == name)


def test_versions_come_from_metadata_without_imports() -> None:
    code = (
        "import sys; from compatshim import doctor; v = doctor.versions(); "
        "assert v['torch'], v; assert 'torch' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_json_report_on_this_install() -> None:
    import torch

    code, out = _doctor("--json")
    payload = json.loads(out)
    # metadata may omit the local label torch.__version__ carries (2.4.1 vs 2.4.1+cu121)
    assert torch.__version__.startswith(payload["versions"]["torch"])
    assert payload["report"]["devices"]["cuda_devices"] == (
        torch.cuda.device_count() if torch.cuda.is_available() else 0
    )
    row = _check(payload, "torch-processgroup-copy")
    assert row["applies"] and row["present"] is True and row["fixed"] is True, row
    assert row["fixable"] is True and row["in_force"] is False, row  # nothing armed it
    assert code == payload["exit"] == (0 if "ok:" in payload["reason"] else 1)


def test_terminal_table_and_exit_zero_when_in_force() -> None:
    code, out = _doctor(COMPATSHIM_AUTO="1")
    assert "torch-processgroup-copy" in out
    said = " ".join(out.strip().split("\n\n")[-1].split())  # the verdict, wrapped at 80
    assert said.startswith("ok:") and "in force here" in said, out
    if "torch-dcp-safe-metadata         patch    yes" in out:  # opt-in: said, not failed
        assert "hardened mode is off (opt-in: COMPATSHIM_SAFE_LOAD=1)" in said, said
    assert code == 0


def test_disabling_an_opt_in_patch_leaves_its_breakage_present() -> None:
    """``numpy-load-hardened`` showed present "yes", but "no" once ``COMPATSHIM_DISABLE``
    named it, though the breakage was still there. Disabling it (never armed without
    ``COMPATSHIM_SAFE_LOAD=1``) changes neither the row's present nor the verdict."""
    seen = {}
    for disabled in ("", "numpy-load-hardened"):
        code, out = _doctor("--json", COMPATSHIM_AUTO="1", COMPATSHIM_DISABLE=disabled)
        payload = json.loads(out)
        row = _check(payload, "numpy-load-hardened")
        seen[disabled] = (row["present"], row["in_force"], code)
        if disabled:
            assert "disabled by COMPATSHIM_DISABLE" in row["detail"], row
    assert seen[""] == seen["numpy-load-hardened"] == (True, False, 0), seen


def test_settings_the_job_would_reject_or_ignore_fail_the_verdict(tmp_path: Path) -> None:
    """``COMPATSHIM_DESYNC_TIMEOUT=5m`` (the first sync point raises ``SettingError``, mid-run),
    an allow file that is not there (every load ignores it) and a misspelt name were "ok:",
    exit 0: the doctor, run before the job, is where they must be said."""
    code, out = _doctor(COMPATSHIM_AUTO="1", COMPATSHIM_DESYNC_TIMEOUT="60")
    assert code == 0, out  # a valid value is no problem
    missing = str(tmp_path / "allow.txt")
    code, out = _doctor(
        "--json",
        COMPATSHIM_AUTO="1",
        COMPATSHIM_DESYNC_TIMEOUT="5m",
        COMPATSHIM_ALLOW_FILE=missing,
        COMPATSHIM_SAFELOAD="1",
    )
    payload = json.loads(out)
    assert code == payload["exit"] == 1, payload["reason"]
    reason = payload["reason"]
    assert reason.startswith("3 COMPATSHIM_* setting(s) the job will not honour"), reason
    assert "COMPATSHIM_DESYNC_TIMEOUT='5m' is not a number of seconds" in reason, reason
    assert f"COMPATSHIM_ALLOW_FILE={missing!r} is ignored: FileNotFoundError" in reason, reason
    assert "did you mean COMPATSHIM_SAFE_LOAD?" in reason, reason
    assert len(payload["report"]["settings"]) == 3


def test_switch_values_and_disable_entries_the_job_would_ignore_fail_the_verdict() -> None:
    """``COMPATSHIM_AUTO=flase`` (armed all the same), ``COMPATSHIM_LOG=verbose`` (logs
    nothing) and a ``COMPATSHIM_DISABLE`` entry naming no patch: every process of the job warns
    about each, yet the doctor said "ok:", exit 0, and named none of them."""
    code, out = _doctor(COMPATSHIM_AUTO="on", COMPATSHIM_LOG="DEBUG")
    assert code == 0, out  # known values, any case
    code, out = _doctor(
        "--json",
        COMPATSHIM_AUTO="flase",
        COMPATSHIM_LOG="verbose",
        COMPATSHIM_DISABLE="no-such-patch",
    )
    payload = json.loads(out)
    assert code == payload["exit"] == 1, payload["reason"]
    reason = payload["reason"]
    assert reason.startswith("3 COMPATSHIM_* setting(s) the job will not honour"), reason
    assert "COMPATSHIM_AUTO='flase' is read as on (on: 1, true, yes, on;" in reason, reason
    assert "COMPATSHIM_LOG='verbose' is ignored (known: debug)" in reason, reason
    assert "COMPATSHIM_DISABLE entry 'no-such-patch' matches no patch" in reason, reason
    assert "torch-processgroup-copy" in reason  # the known names
    assert all(not line.startswith("compatshim:") for line in payload["report"]["settings"])


def test_allow_entries_every_load_would_skip_fail_the_verdict(tmp_path: Path) -> None:
    """A malformed or denied ``COMPATSHIM_ALLOW`` entry, and the same in the allow file: the
    job's first load that consults them warns and skips each, yet the doctor said "ok:"."""
    allow_file = tmp_path / "allow.txt"
    allow_file.write_text("collections.Counter  # fine\nmod.Name trusted\nbuiltins.eval\n")
    code, out = _doctor(
        "--json",
        COMPATSHIM_AUTO="1",
        COMPATSHIM_ALLOW="not-a-name posix.system collections.OrderedDict",
        COMPATSHIM_ALLOW_FILE=str(allow_file),
    )
    payload = json.loads(out)
    assert code == payload["exit"] == 1, payload["reason"]
    settings = payload["report"]["settings"]
    assert len(settings) == 4, settings
    assert "COMPATSHIM_ALLOW: 'not-a-name' is not a 'module.name' global" in settings[0]
    assert settings[1].startswith("posix.system (COMPATSHIM_ALLOW) is ignored: denied")
    assert f"{allow_file}:2: 'mod.Name trusted' is more than one" in settings[2], settings
    assert settings[3].startswith(f"builtins.eval ({allow_file}:3) is ignored: denied")
    code, out = _doctor(COMPATSHIM_AUTO="1", COMPATSHIM_ALLOW="collections.OrderedDict  # mine")
    assert code == 0, out  # entries a load takes are no problem


def test_each_setting_is_reported_as_the_job_reads_it() -> None:
    """A valid ``COMPATSHIM_DESYNC_TIMEOUT``, ``COMPATSHIM_LOG``, allow entries or a
    ``COMPATSHIM_DISABLE`` spelling slip took effect in the job, but the doctor said nothing of
    them: what the user set, and what compatshim reads it as, was nowhere in its report."""
    env = {
        "COMPATSHIM_AUTO": "1",
        "COMPATSHIM_DESYNC_TIMEOUT": "60",
        "COMPATSHIM_LOG": "debug",
        "COMPATSHIM_DISABLE": "Numpy_Core_Names",
        "COMPATSHIM_ALLOW": "collections.Counter  # mine",
    }
    code, out = _doctor("--json", **env)
    read = {item["name"]: item for item in json.loads(out)["report"]["settings_read"]}
    assert set(read) == set(env), read
    assert read["COMPATSHIM_AUTO"]["read_as"].startswith("on: every patch armed")
    assert read["COMPATSHIM_DESYNC_TIMEOUT"]["read_as"].startswith("60 s before a desync")
    assert read["COMPATSHIM_LOG"]["read_as"].startswith("debug: each decision")
    assert read["COMPATSHIM_DISABLE"] == {
        "name": "COMPATSHIM_DISABLE",
        "value": "Numpy_Core_Names",
        "read_as": "left off: numpy-core-names",
    }
    assert read["COMPATSHIM_ALLOW"]["read_as"] == "admits 1: collections.Counter"
    code, out = _doctor(**env)
    assert code == 1, out  # numpy-core-names left off: present, not fixed
    section = out.split("Settings (as the job's processes read them):\n")[1].split("\n\n")[0]
    assert "  COMPATSHIM_DESYNC_TIMEOUT='60': 60 s before" in section, out
    assert len(section.splitlines()) == len(env), section


def test_an_allow_file_every_load_ignores_is_said_ignored_with_the_loads_reason(
    tmp_path: Path,
) -> None:
    """The doctor judged the allow file by its own check (a readable regular file), not by the
    loads' reader: a file over the 1 MiB cap, which every load ignores, was read as "admits
    nothing" beside a setting: line. Each kind of file a load ignores is said ignored, with
    the reason the loads give; an empty file admits nothing."""
    big = tmp_path / "big.txt"
    big.write_text("collections.Counter\n" + "# padding\n" * 120_000)
    cases = [(big, "SettingError: larger than 1048576 bytes"), (tmp_path, "not a regular file")]
    if hasattr(os, "mkfifo"):
        os.mkfifo(tmp_path / "fifo")
        cases.append((tmp_path / "fifo", "SettingError: not a regular file"))
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    for path, why in cases:
        code, out = _doctor("--json", COMPATSHIM_AUTO="1", COMPATSHIM_ALLOW_FILE=str(path))
        payload = json.loads(out)
        read = {item["name"]: item for item in payload["report"]["settings_read"]}
        assert read["COMPATSHIM_ALLOW_FILE"]["read_as"].startswith("ignored"), (path, read)
        assert code == 1 and len(payload["report"]["settings"]) == 1, payload
        assert why in payload["report"]["settings"][0], payload
    code, out = _doctor("--json", COMPATSHIM_AUTO="1", COMPATSHIM_ALLOW_FILE=str(empty))
    payload = json.loads(out)
    read = {item["name"]: item for item in payload["report"]["settings_read"]}
    assert code == 0 and read["COMPATSHIM_ALLOW_FILE"]["read_as"] == "admits nothing", payload


def test_an_allow_entry_naming_no_installed_module_is_said_so(tmp_path: Path) -> None:
    """``COMPATSHIM_ALLOW=mypgk.Config`` (a typo) was read as "admits 1: mypgk.Config": a load
    that meets the file's real name refuses it all the same. A module of the current folder
    and the job's ``__main__`` are not flagged; nothing is imported to find out."""
    (tmp_path / "localmod.py").write_text("raise SystemExit('imported')\n")
    env = {"COMPATSHIM_ALLOW": "collections.Counter, mypgk.Config, localmod.A, __main__.Run"}
    _, out = _doctor("--json", cwd=tmp_path, **env)
    read = {item["name"]: item for item in json.loads(out)["report"]["settings_read"]}
    assert read["COMPATSHIM_ALLOW"]["read_as"] == (
        "admits 4: collections.Counter, mypgk.Config (no module 'mypgk' found here), "
        "localmod.A, __main__.Run"
    ), read


def test_present_and_fixable_but_not_in_force_fails_and_says_how_to_arm() -> None:
    """Issue 38: the user's script has no ``import compatshim.auto`` and no
    ``COMPATSHIM_AUTO``: its breakages are not fixed, so the doctor must not say "ok"."""
    code, out = _doctor()
    lines = out.strip().splitlines()
    assert code == 1, out
    assert not any(line.startswith("ok:") for line in lines), out
    verdict = " ".join(lines[len(lines) - 1 - lines[::-1].index("") + 1 :])  # the last paragraph
    assert "NOT in force" in verdict and "import compatshim.auto" in verdict, verdict
    at = next(i for i, ln in enumerate(lines) if ln.split()[:1] == ["torch-processgroup-copy"])
    assert lines[at].split()[1:] == ["patch", "yes", "yes", "no"], lines[at]
    assert lines[at + 1].strip().startswith("arm: COMPATSHIM_AUTO=1"), lines[at + 1]


def test_rows_fit_80_columns_and_verbose_shows_each_detail() -> None:
    _, out = _doctor("--verbose")
    too_wide = [line for line in out.splitlines() if len(line) > 80]
    assert too_wide == [], too_wide
    assert "copy.deepcopy shares ProcessGroups" in out  # torch-processgroup-copy's detail
    _, short = _doctor()
    assert max(len(line) for line in short.splitlines()) <= 80
    assert "copy.deepcopy shares ProcessGroups" not in short and "--verbose" in short


def test_safe_load_alone_is_in_force_for_the_loading_patches() -> None:
    code, out = _doctor("--json", COMPATSHIM_SAFE_LOAD="1")
    payload = json.loads(out)
    assert _check(payload, "checkpoint-safe-load")["in_force"] is True
    assert _check(payload, "torch-load-safe-globals")["in_force"] is True
    assert _check(payload, "torch-processgroup-copy")["in_force"] is False  # not a loading patch
    assert code == 1 and "NOT in force" in payload["reason"]


def test_the_version() -> None:
    import compatshim

    done = subprocess.run(
        [sys.executable, "-m", "compatshim", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (done.returncode, done.stdout.strip()) == (0, f"compatshim {compatshim.__version__}")


@pytest.mark.skipif(sys.platform == "win32", reason="needs a pseudo-terminal")
@pytest.mark.timeout(360)
def test_a_progress_line_on_a_terminal_while_the_probes_run() -> None:
    """stderr on a terminal: a live line while the child probes, then cleared (with spaces,
    no escape code); stdout (a pipe) carries the report alone."""
    import pty

    primary, secondary = pty.openpty()
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPATSHIM_")}
    try:
        done = subprocess.run(
            [sys.executable, "-m", "compatshim", "doctor"],
            stdout=subprocess.PIPE,
            stderr=secondary,
            text=True,
            env=env,
            timeout=300,
        )
        os.close(secondary)
        said = b""
        while True:
            try:
                chunk = os.read(primary, 65536)
            except OSError:  # the terminal's other end is closed: all read
                break
            if not chunk:
                break
            said += chunk
    finally:
        os.close(primary)
    assert b"compatshim doctor: live probes running in a child process..." in said, said
    # cleared with spaces: ESC [ K printed as text on TERM=dumb terminals
    assert said.rstrip(b" ").endswith(b"\r") and said.endswith(b" \r"), said[-80:]
    assert b"\x1b" not in said, said[-80:]
    assert "live probes running" not in done.stdout


def test_disabled_patch_is_reported_present_and_unfixed() -> None:
    code, out = _doctor("--json", COMPATSHIM_DISABLE="torch-processgroup-copy")
    payload = json.loads(out)
    row = _check(payload, "torch-processgroup-copy")
    assert row["present"] is True and not row["fixed"]
    assert "disabled" in row["detail"]
    assert code == 1 and "torch-processgroup-copy" in payload["reason"]


@pytest.mark.parametrize("argv", [["doctor", "--help"], ["--help"]])
def test_cli_help(argv: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "compatshim", *argv], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and "doctor" in done.stdout


def test_help_is_plain_text_and_names_every_command_and_exit_code(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """In-process: the top-level description names each subcommand (matrix too) without reST
    markup; doctor, dcp-downgrade and resume-check say they exit 2 as well as 1 (the doctor's
    help named no exit code)."""
    from compatshim.cli import main

    def shown(*argv: str) -> str:
        with pytest.raises(SystemExit) as done:
            main(list(argv))
        assert done.value.code == 0
        return capsys.readouterr().out

    top = shown("--help")
    description = top.split("\n\n")[1]  # after the usage, which lists the names anyway
    assert "``" not in top
    for name in ("matrix", "doctor", "inspect", "scan", "dcp-downgrade", "resume-check"):
        assert name in description, description
    for command in ("doctor", "dcp-downgrade", "resume-check"):
        text = shown(command, "--help")
        assert all(f"\n  {code}  " in text for code in "012"), text


@pytest.mark.parametrize(
    "argv",
    [["doctor", "--bogus"], ["inspect", "f.pt", "--bogus"], ["scan", "--bogus", "d"]],
)
def test_an_unknown_option_shows_the_subcommands_usage(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """``compatshim doctor --bogus`` printed the top level's usage (the list of commands), not
    the doctor's options."""
    from compatshim.cli import main

    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: compatshim {argv[0]} "), err
    assert err.rstrip().endswith(f"compatshim {argv[0]}: error: unrecognized arguments: --bogus")
    with pytest.raises(SystemExit):
        main(["--bogus", *(arg for arg in argv if arg != "--bogus")])  # the top level's
    assert capsys.readouterr().err.startswith("usage: compatshim [-h]")


def test_a_probe_timeout_is_reported_as_given(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--timeout 0.4`` is said as 0.4s, not rounded to 0s."""
    from compatshim import doctor

    def late(*args: Any, **kwargs: Any) -> Any:
        raise subprocess.TimeoutExpired(args[0], kwargs["timeout"])

    monkeypatch.setattr(doctor.subprocess, "run", late)
    assert doctor.run_probes(0.4)["error"].startswith("live probes did not finish within 0.4s;")
    assert "within 30s;" in doctor.run_probes(30.0)["error"]


def test_a_probe_timeout_says_how_to_allow_more(monkeypatch: pytest.MonkeyPatch) -> None:
    """Exit 2 "did not finish within 1s" said nothing of the two ways to give the probes
    more time (a first run after an install, a slow shared machine)."""
    from compatshim import doctor

    def late(*args: Any, **kwargs: Any) -> Any:
        raise subprocess.TimeoutExpired(args[0], kwargs["timeout"])

    monkeypatch.setattr(doctor.subprocess, "run", late)
    error = doctor.run_probes(1.0)["error"]
    assert "--timeout S" in error and "COMPATSHIM_DOCTOR_TIMEOUT=S" in error, error
    assert doctor.verdict([], {"error": error})[0] == 2


def test_a_bad_timeout_setting_is_still_a_json_record() -> None:
    """``--json`` with ``COMPATSHIM_DOCTOR_TIMEOUT=abc`` printed nothing on stdout: the
    docs' ``json.loads(done.stdout)`` failed instead of reading exit 2 and the reason."""
    code, out = _doctor("--json", COMPATSHIM_DOCTOR_TIMEOUT="abc")
    report = json.loads(out)
    assert code == report["exit"] == 2 and "COMPATSHIM_DOCTOR_TIMEOUT" in report["reason"]


def test_a_bad_timeout_option_names_the_option() -> None:
    """``--timeout -1`` said "timeout: expected a positive, finite number of seconds": the
    option is ``--timeout``."""
    code, out = _doctor("--json", "--timeout", "-1")
    reason = json.loads(out)["reason"]
    assert code == 2 and "compatshim doctor: --timeout: expected a positive" in reason, reason


def test_doctor_lists_the_checkpoint_patches_and_adapter() -> None:
    _, out = _doctor("--json")
    payload = json.loads(out)
    names = {row["name"] for row in payload["checks"]}
    assert {"torch-load-safe-globals", "numpy-core-names", "checkpoint"} <= names, names
    adapter = _check(payload, "checkpoint")
    assert adapter["applies"] and "allow-listed globals" in adapter["detail"], adapter
    loader = _check(payload, "torch-load-safe-globals")
    # weights-only by default from torch 2.6: there the patch has something to fix
    assert loader["present"] in (True, False) and (loader["fixed"] is True or not loader["present"])


@pytest.mark.parametrize("version,reported", [("5.24.0", True), ("5.23.0", False)])
def test_a_removed_name_without_alias_is_a_row_that_does_not_fail_the_verdict(
    tmp_path: Any, version: str, reported: bool
) -> None:
    """transformers 5.24 removed ``modeling_attn_mask_utils`` and nothing keeps its meaning:
    the doctor names the break from metadata (a distribution's dist-info, nothing imported)."""
    info = tmp_path / f"transformers-{version}.dist-info"
    info.mkdir()
    metadata = f"Metadata-Version: 2.1\nName: transformers\nVersion: {version}\n"
    (info / "METADATA").write_text(metadata)
    code = (
        f"import sys, json; sys.path.insert(0, {str(tmp_path)!r})\n"
        "from compatshim import doctor\n"
        "rows = doctor.removed_rows()\n"
        "print(json.dumps([r.as_dict() for r in rows]))\n"
        "print(json.dumps(doctor.verdict(rows, {})))\n"
        "assert 'transformers' not in sys.modules\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    rows_line, verdict_line = done.stdout.splitlines()
    rows = json.loads(rows_line)
    assert json.loads(verdict_line)[0] == 0
    if not reported:
        assert rows == []
        return
    (row,) = rows
    assert row["name"] == "transformers.modeling_attn_mask_utils" and row["kind"] == "hazard"
    assert row["present"] is True and row["fixed"] is None
    assert f"transformers {version} removed it" in row["detail"]
    assert "transformers.masking_utils" in row["detail"]
    assert "5.24.0 wheel" in row["extra"]["evidence"]


def _bare_lib(tmp_path: Path) -> Path:
    """A folder holding only compatshim and ``packaging`` (links): on PYTHONPATH, what a
    bare venv sees. Not ``_source_dir()``: from an installed copy, that is the test env's
    whole site-packages, torch and numpy with it."""
    import packaging

    import compatshim

    lib = tmp_path / "lib"
    lib.mkdir()
    for package in (compatshim, packaging):
        where = Path(package.__file__).resolve().parent
        (lib / where.name).symlink_to(where, target_is_directory=True)
    return lib


def _hookless_doctor(tmp_path: Path, **settings: str) -> subprocess.CompletedProcess[str]:
    """``compatshim doctor`` from a source tree (PYTHONPATH) in a bare venv whose
    site-packages lacks compatshim's start-up hook (``packaging`` beside the source)."""
    import venv

    venv.create(tmp_path / "env", with_pip=False)
    lib = _bare_lib(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COMPATSHIM_", "PYTHON"))}
    env.update(PYTHONPATH=str(lib), **settings)
    python = tmp_path / "env" / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    return subprocess.run(
        [str(python), "-m", "compatshim", "doctor"],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip


def test_auto_set_where_the_start_up_hook_never_runs_says_so(tmp_path: Path) -> None:
    """compatshim imported from a source tree (PYTHONPATH) into an interpreter whose
    site-packages lacks its start-up hook, COMPATSHIM_AUTO=1 already set: "arm:
    COMPATSHIM_AUTO=1" was the advice; the hook is what is missing."""
    done = _hookless_doctor(tmp_path, COMPATSHIM_AUTO="1")
    last = done.stdout.strip().splitlines()[-1]
    if done.returncode == 0:
        pytest.skip(f"nothing fixable applies to a bare Python {sys.version_info[:2]}: {last}")
    said = " ".join(done.stdout.split())  # the verdict is wrapped at 80 columns
    assert "COMPATSHIM_AUTO=1 is set but the start-up hook did not run" in said, done
    assert "arm: COMPATSHIM_AUTO=1" not in said, done.stdout


def test_a_framework_that_is_not_installed_is_no_import_problem(tmp_path: Path) -> None:
    """In an environment without numpy or torch, the doctor printed "note: importing numpy
    failed: ModuleNotFoundError(...)" and the same for torch.distributed (removed-names'
    targets), as if something were broken; only a failing import of an installed package is
    a note."""
    import venv

    venv.create(tmp_path / "env", with_pip=False)
    lib = _bare_lib(tmp_path)
    (lib / "numpy").mkdir()  # installed by no metadata, so no row applies for it: a target
    (lib / "numpy" / "__init__.py").write_text("raise ImportError('numpy is broken (test)')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COMPATSHIM_", "PYTHON"))}
    env.update(PYTHONPATH=str(lib))
    python = tmp_path / "env" / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    done = subprocess.run(
        [str(python), "-m", "compatshim", "doctor", "--json"],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    problems = json.loads(done.stdout)["report"]["import_problems"]
    assert [p["target"] for p in problems] == ["numpy"], problems  # broken, not missing
    assert "numpy is broken (test)" in problems[0]["error"], problems


def test_safe_load_set_where_the_start_up_hook_never_runs_says_so(tmp_path: Path) -> None:
    """The same interpreter with COMPATSHIM_SAFE_LOAD=1: each row said the hook is missing,
    but the verdict line said "arm: COMPATSHIM_AUTO=1 or ...", which arms nothing there."""
    done = _hookless_doctor(tmp_path, COMPATSHIM_SAFE_LOAD="1")
    last = done.stdout.strip().splitlines()[-1]
    if done.returncode == 0:
        pytest.skip(f"nothing fixable applies to a bare Python {sys.version_info[:2]}: {last}")
    verdict = " ".join(done.stdout.split("\n\n")[-1].split())
    assert "fixable but NOT in force here" in verdict, done
    assert "its start-up hook is missing" in verdict, verdict
    assert "arm: COMPATSHIM_AUTO=1" not in verdict, verdict


def test_without_packaging_the_verdict_says_why_nothing_is_fixable(tmp_path: Path) -> None:
    """An install that lacks ``packaging`` (pip --no-deps): every present breakage read
    "fixable no" with no reason anywhere; the verdict names the dependency and the fix."""
    shadow = tmp_path / "packaging"
    shadow.mkdir()
    (shadow / "__init__.py").write_text("raise ImportError('No module named packaging (test)')\n")
    code, out = _doctor("--json", PYTHONPATH=os.pathsep.join((str(tmp_path), _source_dir())))
    payload = json.loads(out)
    unfixed = [r for r in payload["checks"] if r["present"] and r["fixable"] is False]
    if not unfixed:
        pytest.skip(f"no fixable breakage applies to this install: {payload['reason']}")
    assert code == 1, payload["reason"]
    assert "can arm no patch in this environment" in payload["reason"], payload["reason"]
    assert "-m pip install packaging" in payload["reason"], payload["reason"]
    assert all("not fixable here: its dependency packaging" in r["detail"] for r in unfixed)
