"""``compatshim doctor``: what is installed, which known breakages apply, and are they fixed.

Each row says three things and never mixes them: the breakage is **present** in
this install; compatshim **can fix** it (probed in a child process with every patch
armed); the fix is **in force** in processes started with this environment, that is
what the start-up hook arms in them (``COMPATSHIM_AUTO=1``: every patch;
``COMPATSHIM_SAFE_LOAD=1``: the loading patches). The doctor runs in a process of
its own, started like the user's, so it reads that from its own registry; inside a
script, ``compatshim.status()`` tells that process.

Versions come from metadata (fast, imports nothing). The live probes import
frameworks, so they run in a child process with a time limit
(:mod:`compatshim._doctor_probe`); on a terminal a progress line on stderr says so
while they run. Exit code: 0 when every present breakage compatshim fixes is in
force; 1 with a one-line reason when one is not fixed, fixable but not in force, or
could not be probed, or when a ``COMPATSHIM_*`` setting would not be honoured in the job
(:func:`setting_problems`); 2 when the probes could not run. Rows fit 80 columns; each
row's full detail is under ``--verbose`` and in ``--json``.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import textwrap
import threading
import time
from typing import Any, Callable

from . import _settings
from ._engine.versions import installed_version
from ._records import DoctorRow, PatchStatus

DISTRIBUTIONS = (
    "torch",
    "numpy",
    "colossalai",
    "nuscenes-devkit",
    "lightning",
    "lightning-fabric",
    "transformers",
    "accelerate",
)


def versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {"python": platform.python_version()}
    found.update({name: installed_version(name) for name in DISTRIBUTIONS})
    return found


WIDTH = 80  # every line of the terminal report fits this many columns


class _Progress:
    """A live line on stderr while the probes run, cleared when they end; on a terminal
    only, so pipes, ``--json`` readers and CI logs get nothing they did not ask for."""

    TEXT = "compatshim doctor: live probes running in a child process"

    def __init__(self) -> None:
        try:
            self.on = sys.stderr.isatty()
        except (AttributeError, ValueError):
            self.on = False
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._tick, daemon=True)

    def _tick(self) -> None:
        started = time.monotonic()
        while True:
            seconds = time.monotonic() - started
            sys.stderr.write(f"\r{self.TEXT}... {seconds:.0f} s")
            sys.stderr.flush()
            if self.done.wait(0.5):
                return

    def __enter__(self) -> _Progress:
        if self.on:
            self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        if self.on:
            self.done.set()
            self.thread.join()
            # the line goes, overwritten with spaces: no escape code (TERM=dumb has none)
            sys.stderr.write("\r" + " " * (len(self.TEXT) + 12) + "\r")
            sys.stderr.flush()


def run_probes(timeout: float) -> dict[str, Any]:
    """Run the live probes in a child interpreter; never raises."""
    env = dict(os.environ)
    env.pop(_settings.AUTO, None)  # the child installs explicitly; COMPATSHIM_DISABLE is honoured
    try:
        with _Progress():
            done = subprocess.run(
                [sys.executable, "-m", "compatshim._doctor_probe"],
                capture_output=True,
                text=True,
                timeout=timeout,
                env=env,
            )
    except subprocess.TimeoutExpired:
        return {
            "error": f"live probes did not finish within {timeout:g}s; allow more with "
            f"--timeout S or {_settings.DOCTOR_TIMEOUT}=S (default "
            f"{_settings.DEFAULT_DOCTOR_TIMEOUT:g})"
        }
    try:
        report: dict[str, Any] = json.loads(done.stdout)
    except json.JSONDecodeError:
        tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
        return {"error": f"live probes exited {done.returncode}: " + " | ".join(tail)}
    return report


def _status(data: dict[str, Any]) -> PatchStatus:
    known = PatchStatus.__dataclass_fields__
    return PatchStatus(**{k: v for k, v in data.items() if k in known})


#: patches whose probe finds a defect only in hardened mode, and what stays unsafe without it
HARDENED_ONLY = {
    "torch-dcp-safe-metadata": (
        "torch.distributed.checkpoint reads a folder's .metadata with pickle.load, "
        "which runs any code in it"
    ),
    "numpy-load-hardened": (
        "numpy.load(allow_pickle=True) unpickles object arrays and pickle files with "
        "pickle.load, which runs any code in them"
    ),
}


def patch_row(patch: PatchStatus) -> DoctorRow:
    """The doctor's line for one patch, from its ``status()`` record."""
    version = patch.installed_version
    present = {"present": True, "absent": False}.get(patch.defect)
    where = f"{patch.distribution} {version}"
    # a hardened-only patch's probe finds no defect without SAFE_LOAD; the breakage is there
    # all the same, disabled or not (present must not change with COMPATSHIM_DISABLE)
    opt_in = (
        patch.applies
        and present is False
        and patch.name in HARDENED_ONLY
        and not _settings.safe_load()
    )
    if not patch.applies:
        detail = (
            f"{patch.distribution} not installed"
            if version is None
            else f"{where}: outside the releases the patch supports ({patch.requires})"
        )
    elif opt_in:
        detail = f"{where}: off unless {_settings.SAFE_LOAD}=1 ({HARDENED_ONLY[patch.name]})"
        if patch.disabled:
            detail += f"; disabled by {_settings.DISABLE}"
        return DoctorRow(  # the breakage is here; its fix is opt-in: not a failed verdict
            name=patch.name, kind="patch", applies=True, present=True, fixed=not patch.disabled,
            detail=detail, extra={"opt_in": True},
        )  # fmt: skip
    elif patch.disabled:
        state = {True: "present", False: "absent", None: "not probed"}[present]
        detail = f"{where}: defect {state}; disabled by {_settings.DISABLE}"
    elif present is None:
        detail = patch.error or "target not imported, not probed"
    elif not present:
        detail = f"{where}: defect absent, nothing to do"
    else:
        note = ""
        if not patch.in_range and patch.tested:
            note = f" ({patch.version_note or 'outside the tested range ' + patch.tested}; "
            note += "the probe decided)"
        detail = f"{where}: {patch.description}{note}"
    if patch.error and present is not None:
        detail += f" [error: {patch.error}]"
    if patch.used:  # entries a process used (in the user's process: compatshim.status())
        detail += f"; used: {', '.join(patch.used)}"
    return DoctorRow(
        name=patch.name,
        kind="patch",
        applies=patch.applies,
        present=present,
        fixed=(bool(patch.fixed) and not patch.disabled) if present else None,
        detail=detail,
        extra={"used": list(patch.used)} if patch.used else {},
    )


ARM = "COMPATSHIM_AUTO=1 or `import compatshim.auto` first in the script"
# COMPATSHIM_AUTO=1 set, nothing armed: the start-up hook is missing from this interpreter
NO_HOOK = (
    "install compatshim into this interpreter's site-packages (its start-up hook is missing) "
    "or `import compatshim.auto` first in the script"
)


def _arm() -> str:
    from ._engine.safe_load import armed_at_import

    hookless = _settings.safe_load() and (armed_at_import or "compatshim_auto" not in sys.modules)
    return NO_HOOK if _settings.auto() or hookless else ARM


def armed_here() -> set[str]:
    """The patches armed in this process by the start-up hook, which arms the same in every
    process started with this environment and interpreter (not those ``import compatshim``
    armed because the hook did not run)."""
    from ._engine import registry
    from ._engine.safe_load import armed_at_import

    return set(registry.armed()) - set(armed_at_import)


def in_force(table: list[DoctorRow], armed: set[str]) -> None:
    """Fill each row's ``in_force`` (and ``extra["arm"]``, the line that arms it) from
    ``armed``: the patches armed in processes started with this environment."""
    for row in table:
        if row.name == "checkpoint-safe-load":
            if row.extra.get("safe_load"):
                row.in_force = "torch-load-safe-globals" in armed
                if not row.in_force:
                    row.extra["arm"] = "`import compatshim.auto` first in the script"
            continue
        if row.kind != "patch" or not row.applies or not row.present:
            continue
        if row.extra.get("opt_in"):
            row.in_force = False
            row.extra["arm"] = f"{_settings.SAFE_LOAD}=1 (hardened mode, opt-in)"
            if not row.fixed:  # disabled
                row.extra["arm"] += f", and remove it from {_settings.DISABLE}"
            continue
        if not row.fixed:
            row.in_force = False
            if "disabled by" in row.detail:
                row.extra["arm"] = f"remove it from {_settings.DISABLE}"
            continue
        row.in_force = row.name in armed
        if not row.in_force:
            row.extra["arm"] = _arm()


def rows(report: dict[str, Any], armed: set[str] | None = None) -> list[DoctorRow]:
    """One uniform row per patch and adapter check, then the removed names that apply;
    ``in_force`` from ``armed`` (default: what this process's start-up armed)."""
    out = [patch_row(_status(patch)) for patch in report.get("patches", [])]
    missing = report.get("missing")
    for row in out if missing else ():  # no patch could be armed in the probes' child
        if row.present and not row.fixed:
            row.detail += f" [not fixable here: {missing}]"
    out.extend(DoctorRow.from_dict(row) for row in report.get("adapters", []))
    out.extend(removed_rows())
    in_force(out, armed_here() if armed is None else armed)
    return out


def removed_rows() -> list[DoctorRow]:
    """A row per removed name compatshim cannot provide (``aliases.table.REMOVED``) whose
    distribution is installed at a release without it: present, ``fixed`` None (nothing
    compatshim could provide), so it does not fail the verdict; read from metadata only."""
    from ._engine.versions import contains
    from .aliases.table import REMOVED

    out = []
    for entry in REMOVED:
        version = installed_version(entry.distribution)
        if version is None or not contains(entry.removed, version):
            continue
        out.append(
            DoctorRow(
                name=entry.name,
                kind="hazard",
                applies=True,
                present=True,
                fixed=None,
                detail=(
                    f"{entry.distribution} {version} removed it ({entry.distribution}"
                    f"{entry.removed}); code importing it fails and compatshim provides no alias "
                    f"(no replacement keeps its meaning): use {entry.instead}"
                ),
                extra={"evidence": entry.evidence},
            )
        )
    return out


def setting_problems() -> list[str]:
    """``COMPATSHIM_*`` settings of this environment that the job's processes will reject or
    ignore when they read them (a sync point raises on a malformed desync timeout, mid-run;
    every load skips an allow file it cannot read, with a warning): said here, before it."""
    problems = []
    try:
        _settings.desync_timeout()
    except _settings.SettingError as exc:
        problems.append(
            f"{exc}: compatshim.dist's sync points, watchdog and the lightning-fabric-desync "
            "patch raise it when they start"
        )
    problems += [
        f"{name} is not a compatshim setting, ignored; {_settings.hint(name)}"
        for name in _settings.unknown_names()
    ]
    # a switch set to a value it does not know (COMPATSHIM_LOG=verbose logs nothing) and a
    # COMPATSHIM_DISABLE entry naming no patch: each process warns, the doctor said "ok"
    problems += [line.removeprefix("compatshim: ") for line in _settings.malformed()]
    problems += _disable_problems()
    problems += _allow_problems()
    return problems


def settings_read() -> list[dict[str, str]]:
    """Each ``COMPATSHIM_*`` variable set here that compatshim reads: its value and what the
    job's processes read it as (one they reject or ignore is also a ``setting:`` line)."""
    out = []
    for name in _settings._known():
        if name in os.environ:
            out.append({"name": name, "value": os.environ[name], "read_as": _reading(name)})
    return out


def _reading(name: str) -> str:
    if name in (_settings.AUTO, _settings.SAFE_LOAD):
        if not _settings.truthy(os.environ.get(name)):
            return "off"
        # a value outside the known ones arms all the same (its setting: line says so)
        if name == _settings.AUTO:
            return "on: every patch armed at interpreter start"
        return "on: hardened loading, the loading patches armed at interpreter start"
    if name == _settings.DISABLE:
        return _disable_reading()
    if name == _settings.DESYNC_TIMEOUT:
        return _seconds(_settings.desync_timeout, "before a desync or hang is a DesyncError")
    if name == _settings.DOCTOR_TIMEOUT:
        return _seconds(_settings.doctor_timeout, "for the doctor's live probes, unless --timeout")
    if name == _settings.LOG:
        level = _settings.log_level()
        if level not in _settings.LOG_LEVELS:
            return "ignored: nothing is logged (its setting: line says why)"
        return "debug: each decision printed on stderr" if level else "off"
    return _allow_reading(name)


def _seconds(read: Callable[[], float], what: str) -> str:
    try:
        return f"{read():g} s {what}"
    except _settings.SettingError:
        return "not a usable number of seconds (its setting: line says why)"


def _disable_reading() -> str:
    from ._engine.registry import disable_entries
    from .patches import CATALOGUE

    names = [name for _, name in disable_entries(p.name for p in CATALOGUE) if name]
    return f"left off: {', '.join(dict.fromkeys(names))}" if names else "no patch left off"


def _allow_reading(name: str) -> str:
    """What the allow entries of one source admit, read as a load reads them."""
    import warnings

    from .checkpoint import process_allow

    path = _settings.allow_file()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # said on setting: lines
        if name == _settings.ALLOW:
            read = process_allow._from_environment()
        elif path is None:
            return "no file"
        else:
            try:
                read = process_allow._read_file(path)
            except (OSError, ValueError):
                return "ignored (its setting: line says why)"
        entries = [_unfound(allowed.qualname) for _, allowed in read.values()]
    if not entries:
        return "admits nothing"
    return f"admits {len(entries)}: {', '.join(entries)}"


def _unfound(qualname: str) -> str:
    """``qualname``, said to name no module found from here where its top-level one is not
    installed nor in the current folder (a typo admits nothing). Looked up, never imported;
    ``__main__`` is the job's script, unknown here."""
    import importlib.machinery
    import importlib.util

    top = qualname.split(".", 1)[0]
    if not top.isidentifier() or top == "__main__" or top in sys.modules:
        return qualname
    try:
        found = importlib.util.find_spec(top) or importlib.machinery.PathFinder.find_spec(
            top, [os.getcwd()]
        )
    except (ImportError, ValueError, OSError):
        return qualname
    return qualname if found is not None else f"{qualname} (no module {top!r} found here)"


def _allow_problems() -> list[str]:
    """The ``COMPATSHIM_ALLOW`` (and allow file) entries every load skips, malformed or
    denied, and an allow file every load ignores: read as a load reads them (nothing they name
    is imported), each warning the job's first load would give said here instead."""
    if not _settings.allow_text().strip() and _settings.allow_file() is None:
        return []
    import warnings

    from .checkpoint import process_allow

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        process_allow._from_environment()
        process_allow._from_file()  # a file every load ignores: its own warning, the job's words
    said = [str(warning.message) for warning in caught]
    return [text.removeprefix("compatshim: ") for text in said if text.startswith("compatshim: ")]


def _disable_problems() -> list[str]:
    """The ``COMPATSHIM_DISABLE`` entries that name no patch (spelling slips such as
    ``torch_processgroup_copy`` are honoured, as the registry honours them)."""
    from ._engine.registry import disable_entries
    from .patches import CATALOGUE

    known = sorted(patch.name for patch in CATALOGUE)
    return [
        f"{_settings.DISABLE} entry {raw!r} matches no patch, ignored; known patches: "
        + ", ".join(known)
        for raw, name in disable_entries(known)
        if name is None
    ]


def _names(table: list[DoctorRow]) -> str:
    return ", ".join(r.name for r in table)


def verdict(
    table: list[DoctorRow], report: dict[str, Any], settings: list[str] | None = None
) -> tuple[int, str]:
    """The exit code and its one-line reason; it follows what is in force, and ``settings``
    (:func:`setting_problems`) fail it too."""
    if "error" in report:
        return 2, f"could not run the live probes: {report['error']}"
    code, reason = _verdict(table, report)
    if code == 0 and settings:
        return 1, f"{len(settings)} COMPATSHIM_* setting(s) the job will not honour: " + "; ".join(
            settings
        )
    return code, reason


def _verdict(table: list[DoctorRow], report: dict[str, Any]) -> tuple[int, str]:
    # fixed None on a present row: a removed name compatshim cannot provide (reported only)
    unfixed = [  # an opt-in fix disabled: nothing was asked for, so nothing failed
        r
        for r in table
        if r.applies and r.present and r.fixed is False and not r.extra.get("opt_in")
    ]
    unknown = [r for r in table if r.applies and r.present is None and r.kind == "patch"]
    idle = [
        r
        for r in table
        if r.applies and r.present and r.fixed and r.in_force is False and not r.extra.get("opt_in")
    ]
    unsafe = [r for r in table if r.name == "checkpoint-safe-load" and r.in_force is False]
    if unfixed and report.get("missing"):
        return 1, (
            f"{len(unfixed)} applicable breakage(s) not fixed ({_names(unfixed)}): compatshim "
            f"can arm no patch in this environment: {report['missing']}"
        )
    if unfixed:
        return 1, f"{len(unfixed)} applicable breakage(s) not fixed: {_names(unfixed)}"
    if unknown:
        return 1, f"could not probe: {_names(unknown)}"
    if unsafe:
        return 1, (
            f"{_settings.SAFE_LOAD}=1 is set but NOT in force in processes started with this "
            "environment (the start-up hook did not run in this interpreter): "
            "`import compatshim.auto` first in the script"
        )
    if idle and _settings.auto():  # set, yet not armed: the hook did not run, as above
        return 1, (
            f"{len(idle)} breakage(s) fixable but NOT in force here: {_names(idle)}; "
            f"{_settings.AUTO}=1 is set but the start-up hook did not run in this interpreter: "
            f"{NO_HOOK}"
        )
    if idle:  # the rows' own line: COMPATSHIM_AUTO=1 is no way out where the hook is missing
        return 1, (
            f"{len(idle)} breakage(s) fixable but NOT in force here: {_names(idle)}; arm: {_arm()}"
        )
    armed = [r for r in table if r.applies and r.present and r.in_force]
    handled = [r for r in table if r.applies and r.present and r.fixed and r.in_force is None]
    if not armed and not handled:
        return 0, "ok: no known breakage applies to this install"
    said = f"ok: {len(armed)} breakage(s) in force here"
    if handled:
        said += f"; {len(handled)} more handled when compatshim's API is called"
    if any(r.extra.get("opt_in") for r in table):
        said += f"; hardened mode is off (opt-in: {_settings.SAFE_LOAD}=1)"
    return 0, said


def _mark(value: Any) -> str:
    return {True: "yes", False: "no", None: "-"}.get(value, str(value))


def _wrapped(text: str, indent: int, hang: int = 0) -> list[str]:
    """``text`` wrapped to ``WIDTH`` at ``indent``; ``hang`` more for its later lines."""
    pad = " " * indent
    lines = textwrap.wrap(
        text,
        WIDTH,
        initial_indent=pad,
        subsequent_indent=pad + " " * hang,
        break_on_hyphens=False,  # patch names stay whole
    )
    return lines or [pad]


LEGEND = (
    "present: the breakage is in this install. fixable: compatshim fixes it (probed in a "
    "child process with every patch armed but those COMPATSHIM_DISABLE names). in force: "
    "armed in processes started with this environment, by the start-up hook "
    "(COMPATSHIM_AUTO=1: every patch; COMPATSHIM_SAFE_LOAD=1: the loading patches); in a "
    "script, compatshim.status() tells that process."
)


def render_head(ver: dict[str, str | None]) -> str:
    """What is known before the probes run (metadata only)."""
    lines = ["compatshim doctor", "", "Installed (from metadata):"]
    width = max(len(k) for k in ver)
    lines += [f"  {name:<{width}}  {version or 'not installed'}" for name, version in ver.items()]
    return "\n".join(lines)


def render_body(report: dict[str, Any], table: list[DoctorRow], verbose: bool = False) -> str:
    """The devices, one row per check (80 columns), and under ``verbose`` each detail."""
    lines: list[str] = []
    devices = report.get("devices") or {}
    if devices:
        lines += ["", "Devices:"]
        lines += [f"  {key}: {value}" for key, value in devices.items()]
    read = report.get("settings_read") or []
    if read:
        lines += ["", "Settings (as the job's processes read them):"]
        for item in read:
            lines += _wrapped(f"{item['name']}={item['value']!r}: {item['read_as']}", 2, 4)
    lines += ["", "Breakages and adapters:", *_wrapped(LEGEND, 2), ""]
    header = ("check", "kind", "present", "fixable", "in force")
    widths = [0, 7, 7, 7, 8]
    widths[0] = WIDTH - 2 - sum(widths[1:]) - 2 * (len(widths) - 1)
    widths[0] = min(widths[0], max(len(r.name) for r in table) if table else 5)
    for cells in [header]:
        lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip())
    for r in table:
        name = r.name if len(r.name) <= widths[0] else r.name[: widths[0] - 3] + "..."
        cells = (name, r.kind, _mark(r.present), _mark(r.fixed), _mark(r.in_force))
        lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip())
        arm = r.extra.get("arm")
        if arm:
            lines += _wrapped(f"arm: {arm}", 6)
        if verbose:
            lines += _wrapped(r.detail, 6)
    for problem in report.get("import_problems", []):
        note = f"note: importing {problem['target']} failed: {problem['error']}"
        lines += _wrapped(note, 2, 4)
    for problem in report.get("settings", []):
        lines += _wrapped(f"setting: {problem}", 2, 4)
    if not verbose:
        lines += ["", "Each row's detail: compatshim doctor --verbose (or --json)."]
    return "\n".join(lines)


def render(
    ver: dict[str, str | None],
    report: dict[str, Any],
    table: list[DoctorRow],
    verbose: bool = False,
) -> str:
    return render_head(ver) + "\n" + render_body(report, table, verbose)


def main(as_json: bool = False, timeout: float | None = None, verbose: bool = False) -> int:
    try:
        timeout = _settings.doctor_timeout(timeout)
    except _settings.SettingError as exc:
        print(f"compatshim doctor: {exc}", file=sys.stderr)
        if as_json:  # a reader of --json gets a record whatever happens
            print(json.dumps({"versions": versions(), "checks": [], "exit": 2,
                              "reason": f"compatshim doctor: {exc}"}, indent=2))  # fmt: skip
        return 2
    ver = versions()
    if not as_json:  # what metadata says, at once; the probes take seconds
        print(render_head(ver), flush=True)
    report = run_probes(timeout)
    report["settings"] = setting_problems()  # first: it records the allow entries' warnings
    report["settings_read"] = settings_read()  # (once a process), this reads them quietly
    table = rows(report)
    code, reason = verdict(table, report, report["settings"])
    if as_json:
        payload = {
            "versions": ver,
            "report": report,
            "checks": [{**row.as_dict(), "fixable": row.fixed} for row in table],
            "in_force_means": LEGEND,
            "exit": code,
            "reason": reason,
        }
        print(json.dumps(payload, indent=2, default=str))
    else:
        print(render_body(report, table, verbose))
        print()
        print("\n".join(_wrapped(reason, 0)))
    return code
