"""One contract for every catalogue entry, run in the family envs tox adds this folder to.

A patch's contract depends only on its own distributions' releases and the
Python, so under tox each family takes it for the distributions it is about
(``COMPATSHIM_TEST_CONTRACT``, set per family in tox.ini: core takes torch's
patches, lightning Lightning's): torch's five patches are not run again in the
lightning and nuscenes envs, and the matrix's core envs still give them every
pinned torch. Without the variable (pytest run by hand) every patch is checked.

For each patch whose targets this env can import: install is idempotent and
uninstall restores every attribute of the target packages exactly; a hook never
raises into the import, also under ``-W error`` and with unreadable metadata;
on an unknown newer release the probe decides; the doctor has a row for it.
Each check runs in a fresh interpreter, so one patch's state cannot leak into
another's. Patches whose targets are not installed here are skipped with the
reason (they run in their family's env).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from compatshim import patches
from compatshim._engine.patch import Patch
from compatshim._engine.versions import installed_version

CATALOGUE = {patch.name: patch for patch in patches.CATALOGUE}
SRC = str(Path(__file__).resolve().parents[2] / "src")
TIMEOUT_S = 240

pytestmark = pytest.mark.timeout(2 * TIMEOUT_S)
UNGATED = {
    "python": "the interpreter's version is not read from metadata",
    "compatshim": "the patch gates each entry by its own distribution (compatshim.aliases.table)",
}


def _importable(patch: Patch, target: str) -> bool:
    """Installed as a distribution (``tests/`` on the path makes ``lightning`` a folder too)."""
    distribution = patch.distribution_for(target)
    if distribution != "python" and installed_version(distribution) is None:
        return False
    try:
        return importlib.util.find_spec(target.split(".")[0]) is not None
    except (ImportError, ValueError):
        return False


def _patch(name: str) -> Patch:
    patch = CATALOGUE[name]
    owned = os.environ.get("COMPATSHIM_TEST_CONTRACT")
    if owned and patch.distribution not in owned.split(","):
        reason = f"{patch.distribution}'s patches take it in another family (tox.ini sets {owned})"
        pytest.skip(f"the contract: {reason}")
    if not any(_importable(patch, t) for t in patch.targets):
        pytest.skip(f"none of {', '.join(patch.targets)} is installed in this env")
    broken = [t for t in patch.targets if _importable(patch, t) and not _imports_plainly(t)]
    if broken:  # e.g. lightning 2.3 under setuptools 82 needs removed-names to import at all
        pytest.skip(f"{', '.join(broken)} does not import in this env without compatshim")
    return patch


@functools.cache
def _imports_plainly(target: str, *flags: str) -> bool:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPATSHIM_")}
    done = subprocess.run(
        [sys.executable, *flags, "-c", f"import {target}"],
        capture_output=True,
        timeout=TIMEOUT_S,
        env=env,
    )
    return done.returncode == 0


def _folder_name(distribution: str) -> str:
    """How a wheel spells the distribution in its .dist-info folder (PEP 427: - becomes _)."""
    return distribution.replace("-", "_")


def _python(code: str, *, path_first: str | None = None, flags: tuple[str, ...] = ()) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPATSHIM_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (path_first, SRC, env.get("PYTHONPATH")) if p)
    done = subprocess.run(
        [sys.executable, *flags, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env=env,
    )
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stderr[-3000:]}"
    return done.stdout


SNAPSHOT = textwrap.dedent(
    """
    import sys, types

    def snapshot(roots):
        # every attribute of the root packages' modules and of every class they expose,
        # the import system's finders and module table: by identity
        found = {"sys.meta_path": {str(i): id(f) for i, f in enumerate(sys.meta_path)}}
        found["sys.modules"] = {
            k: id(v) for k, v in list(sys.modules.items()) if k.split(".")[0] in roots
        }
        classes = {}
        for name, module in list(sys.modules.items()):
            if not isinstance(module, types.ModuleType) or name.split(".")[0] not in roots:
                continue
            found[name] = {k: id(v) for k, v in list(vars(module).items())}
            for value in list(vars(module).values()):
                if isinstance(value, type):
                    classes[id(value)] = value
        for value in classes.values():
            key = f"{getattr(value, '__module__', '?')}:{value.__qualname__}:{id(value)}"
            found[key] = {k: id(v) for k, v in list(vars(value).items())}
        return found

    def changed(before, after):
        out = []
        for owner, names in before.items():
            now = after.get(owner, {})
            out += [f"{owner}.{k}" for k, v in names.items() if now.get(k) != v]
        return out
    """
)


def _imports(patch: Patch) -> str:
    return "\n".join(f"import {t}" for t in patch.targets if _importable(patch, t)) + "\n"


@pytest.mark.parametrize("name", sorted(CATALOGUE))
def test_install_twice_then_uninstall_restores_every_attribute(name: str) -> None:
    patch = _patch(name)
    # compatshim's own tables change by design (hooks, registry); what must come back is the
    # frameworks' objects and the import system (its finders are in the snapshot)
    roots = sorted({t.split(".")[0] for t in patch.targets} - {"compatshim"})
    out = _python(
        SNAPSHOT
        + _imports(patch)
        + f"""
import compatshim
roots = {roots!r}
before = snapshot(roots)
first = compatshim.install(include=[{name!r}])
second = compatshim.install(include=[{name!r}])
row = next(s for s in compatshim.status() if s.name == {name!r})
installed = snapshot(roots)
compatshim.uninstall([{name!r}])
after = snapshot(roots)
import json
print(json.dumps({{"changed": changed(before, after), "applied": row.applied,
    "fixed": row.fixed, "defect": row.defect, "error": row.error,
    "touched": len(changed(before, installed)), "second": list(second)}}))
"""
    )
    result = json.loads(out.strip().splitlines()[-1])
    assert result["error"] is None, result
    assert result["changed"] == [], result
    if result["applied"]:
        assert result["fixed"] is True, result
        assert result["touched"] > 0, result  # it did change something while installed


@pytest.mark.parametrize("name", sorted(CATALOGUE))
def test_never_raises_into_the_import_under_w_error_with_unreadable_metadata(
    name: str, tmp_path: Path
) -> None:
    patch = _patch(name)
    if patch.distribution in UNGATED:
        pytest.skip(UNGATED[patch.distribution])
    failing = [t for t in patch.targets if not _imports_plainly(t, "-W", "error")]
    if failing:  # the framework's own import warns (nuscenes 1.1.11: pyparsing): not ours
        pytest.skip(f"{', '.join(failing)} fails under -W error without compatshim too")
    for distribution in patch.distributions():  # a target may be gated by its own
        (tmp_path / f"{_folder_name(distribution)}-not.a.version.dist-info").mkdir()
    out = _python(
        "import compatshim\n"
        f"compatshim.install(include=[{name!r}])\n"
        + _imports(patch)
        + f"\nrow = next(s for s in compatshim.status() if s.name == {name!r})\n"
        "print(repr(row.version_note), row.range_position)\n",
        path_first=str(tmp_path),
        flags=("-W", "error"),
    )
    assert "not a PEP 440 version" in out, out


@pytest.mark.parametrize("name", sorted(CATALOGUE))
def test_on_an_unknown_newer_release_the_probe_decides(name: str, tmp_path: Path) -> None:
    patch = _patch(name)
    if patch.distribution in UNGATED:
        pytest.skip(UNGATED[patch.distribution])
    for distribution in patch.distributions():
        (tmp_path / f"{_folder_name(distribution)}-999.0.dist-info").mkdir()
    out = _python(
        "import compatshim, json\n"
        f"compatshim.install(include=[{name!r}])\n"
        + _imports(patch)
        + f"\nrow = next(s for s in compatshim.status() if s.name == {name!r})\n"
        "print(json.dumps([row.installed_version, row.range_position, row.defect,"
        " row.applied, row.fixed]))\n",
        path_first=str(tmp_path),
    )
    version, position, defect, applied, fixed = json.loads(out.strip().splitlines()[-1])
    assert version == "999.0"
    if position == "unsupported":
        assert not applied  # outside `requires`: left alone, as declared
        return
    assert position == "untested"
    assert defect in ("present", "absent"), defect  # decided by the probe, not the version
    assert applied == (defect == "present")
    if applied:
        assert fixed is True


@functools.cache
def _doctor_checks() -> list[dict[str, Any]]:
    """The doctor's rows in this env (one run serves every entry: it reports them all)."""
    out = _python("import sys\nfrom compatshim.cli import main\nmain(['doctor', '--json'])\n")
    checks: list[dict[str, Any]] = json.loads(out[out.index("{") :])["checks"]
    return checks


@pytest.mark.parametrize("name", sorted(CATALOGUE))
def test_the_doctor_has_a_row_for_it(name: str) -> None:
    _patch(name)
    checks = _doctor_checks()
    assert [c for c in checks if c["name"] == name and c["kind"] == "patch"], checks


def test_every_patch_has_its_tests_where_the_naming_rule_says() -> None:
    """``tests/<family>/test_patch_<module>[_part].py``: one place to look for a patch's tests."""
    MODULES = [patch.fix_module.rpartition(".")[2] for patch in patches.CATALOGUE]
    tests = Path(__file__).resolve().parents[1]
    missing = [m for m in MODULES if not list(tests.glob(f"*/test_patch_{m}*.py"))]
    assert missing == [], f"no tests/<family>/test_patch_<module>.py for {missing}"


@pytest.mark.parametrize("name", sorted(CATALOGUE))
def test_its_code_loads_only_when_a_target_is_imported(name: str) -> None:
    """The declaration is a table row: ``install()`` imports a fix module only for a target
    that is already imported (start-up cost does not grow with the catalogue)."""
    patch = CATALOGUE[name]
    assert importlib.util.find_spec(patch.fix_module) is not None, patch.fix_module
    out = _python(
        "import sys, json\nimport compatshim\n"
        f"compatshim.install(include=[{name!r}])\n"
        f"print(json.dumps([{patch.fix_module!r} in sys.modules,"
        f" [t for t in {patch.targets!r} if t in sys.modules]]))\n"
    )
    loaded, imported_targets = json.loads(out.strip().splitlines()[-1])
    assert loaded == bool(imported_targets), (loaded, imported_targets)
