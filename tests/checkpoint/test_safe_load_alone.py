"""``COMPATSHIM_SAFE_LOAD=1`` on its own protects the process (issue 38, item 1).

Each case starts a fresh interpreter with ``COMPATSHIM_SAFE_LOAD`` set and
``COMPATSHIM_AUTO`` unset, the way a user who sets only the safety switch starts a job.
The start-up hook runs from the installed wheel's ``compatshim_auto.pth``; the
tree under test comes first on ``PYTHONPATH``, so that ``.pth`` line imports this
tree's hook (an editable install keeps a copy of it in site-packages), and where
compatshim is not installed at all the child runs the tree's ``.pth`` by hand.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from tests.checkpoint.test_hardened import Payload, _source_dir, boot  # noqa: E402
from tests.harness.sites import site_folders  # noqa: E402

TIMEOUT_S = 240
pytestmark = pytest.mark.timeout(TIMEOUT_S + 60)

# test_hardened's start-up, keyed on the hook module rather than compatshim.auto (which
# SAFE_LOAD alone does not import)
BOOT = boot("compatshim_auto")


def run(script: Path, *args: str, **env_extra: str) -> subprocess.CompletedProcess[str]:
    """``script`` in a fresh interpreter whose only compatshim setting is ``env_extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COMPATSHIM_", "TORCH_FORCE"))}
    source = _source_dir()
    env["PYTHONPATH"] = os.pathsep.join(p for p in (source, env.get("PYTHONPATH")) if p)
    env.update(env_extra)
    return subprocess.run(
        [sys.executable, "-c", BOOT, source, str(script), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )


def result_of(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            found: dict[str, Any] = json.loads(line[len("RESULT ") :])
            return found
    raise AssertionError(f"no result, exit {done.returncode}:\n{done.stdout}\n{done.stderr}")


LOAD = r"""
import json, pickle, sys
import torch

folder = sys.argv[1]
outcome = {"hardened": getattr(torch.load, "__compatshim_hardened__", False)}
try:
    torch.load(folder + "/poisoned.pt", weights_only=False)
    outcome["error"] = None
except pickle.UnpicklingError as exc:
    outcome["error"] = type(exc).__name__
    outcome["message"] = str(exc)
    outcome["refused"] = list(getattr(exc, "refused", ()))
print("RESULT " + json.dumps(outcome))
"""


@pytest.mark.parametrize("value", ["1", "yes"])
def test_safe_load_alone_refuses_a_payload_in_a_fresh_interpreter(
    tmp_path: Path, value: str
) -> None:
    """The issue's case: only ``COMPATSHIM_SAFE_LOAD`` is set, no ``import compatshim``,
    and ``torch.load(..., weights_only=False)`` of a file whose ``__reduce__`` calls
    ``os.system``: the payload never runs, the refusal names the global."""
    marker = tmp_path / "MARKER"
    torch.save({"payload": Payload(marker)}, tmp_path / "poisoned.pt")
    script = tmp_path / "child.py"
    script.write_text(LOAD)
    done = run(script, str(tmp_path), COMPATSHIM_SAFE_LOAD=value)
    result = result_of(done)
    assert not marker.exists(), "the payload ran"
    assert result["hardened"] is True, result
    assert result["error"] is not None and "posix.system" in " ".join(result["refused"]), result
    assert "Traceback" not in done.stderr, done.stderr


def test_safe_load_off_leaves_torch_alone(tmp_path: Path) -> None:
    """The control: neither variable set, the start-up hook arms nothing (and the payload,
    loaded with torch's full unpickler as the caller asked, runs: this is what the switch is
    for)."""
    marker = tmp_path / "MARKER"
    torch.save({"payload": Payload(marker)}, tmp_path / "poisoned.pt")
    script = tmp_path / "child.py"
    script.write_text(LOAD)
    result = result_of(run(script, str(tmp_path), COMPATSHIM_SAFE_LOAD="0"))
    assert result["hardened"] is False and result["error"] is None and marker.exists()


ARMED = r"""
import json, sys
import numpy, torch
import torch.distributed.checkpoint.filesystem
import compatshim

rows = {r.name: r for r in compatshim.status()}
print("RESULT " + json.dumps({
    "armed": sorted(n for n, r in rows.items() if r.armed),
    "auto": "compatshim.auto" in sys.modules,
}))
"""


def test_safe_load_alone_arms_exactly_the_loading_patches(tmp_path: Path) -> None:
    """Without ``COMPATSHIM_AUTO``, the switch arms the three loading patches and nothing
    else: the other patches stay the user's choice."""
    pytest.importorskip("numpy")
    script = tmp_path / "child.py"
    script.write_text(ARMED)
    result = result_of(run(script, COMPATSHIM_SAFE_LOAD="1"))
    assert result == {
        "armed": ["numpy-load-hardened", "torch-dcp-safe-metadata", "torch-load-safe-globals"],
        "auto": False,
    }


def test_safe_load_with_a_disabled_loading_patch_says_so_at_start_up(tmp_path: Path) -> None:
    """A process where hardening cannot be in force says so, once, on stderr, before any
    load: here ``COMPATSHIM_DISABLE`` names the torch.load patch."""
    script = tmp_path / "child.py"
    script.write_text("import torch\nprint('RESULT {}')\n")
    done = run(script, COMPATSHIM_SAFE_LOAD="1", COMPATSHIM_DISABLE="torch-load-safe-globals")
    result_of(done)
    lines = [ln for ln in done.stderr.splitlines() if "COMPATSHIM_SAFE_LOAD" in ln]
    assert len(lines) == 1, done.stderr
    assert "NOT in force" in lines[0] and "torch-load-safe-globals" in lines[0], lines


def test_safe_load_when_compatshim_cannot_be_imported_says_so(tmp_path: Path) -> None:
    """The hook runs, but the package it would arm cannot be imported (a broken install):
    one loud line on stderr, no traceback from site.py, and the process still starts."""
    shadow = tmp_path / "shadow"
    (shadow / "compatshim").mkdir(parents=True)
    (shadow / "compatshim" / "__init__.py").write_text("raise ImportError('broken install')\n")
    hook = Path(_source_dir()) / "compatshim_auto.py"
    (shadow / "compatshim_auto.py").write_text(hook.read_text(encoding="utf-8"))
    script = tmp_path / "child.py"
    script.write_text("print('RESULT {}')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPATSHIM_")}
    env.update(COMPATSHIM_SAFE_LOAD="1", PYTHONPATH=str(shadow))
    code = (
        "import sys\n"
        "if 'compatshim_auto' not in sys.modules:  # compatshim is not installed here\n"
        "    import compatshim_auto; compatshim_auto.start()\n"
        f"exec(open({str(script)!r}).read())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=TIMEOUT_S
    )
    result_of(done)
    lines = [ln for ln in done.stderr.splitlines() if "COMPATSHIM_SAFE_LOAD" in ln]
    assert len(lines) == 1, done.stderr
    assert "NOT in force" in lines[0] and "broken install" in lines[0], lines
    assert "Traceback" not in done.stderr, done.stderr


LATE = r"""
import sys
import torch
import compatshim

compatshim.uninstall()  # as if compatshim had not been armed at start-up
if sys.argv[1] == "stale":
    from torch import load as early  # a reference taken before hardening
compatshim.install(include=["torch-load-safe-globals"])
compatshim.install(include=["torch-load-safe-globals"])
print("RESULT {}")
"""


@pytest.mark.parametrize("case", ["stale", "clean"])
def test_a_torch_load_reference_taken_before_hardening_is_named_once(
    tmp_path: Path, case: str
) -> None:
    """Armed after ``import torch`` while a module holds torch's own ``load``: that module's
    weights-only loads bypass hardening, which is said once on stderr, naming the module;
    with no such reference, nothing is said."""
    script = tmp_path / "child.py"
    script.write_text(LATE)
    done = run(script, case, COMPATSHIM_SAFE_LOAD="1")
    result_of(done)
    said = [ln for ln in done.stderr.splitlines() if "COMPATSHIM_SAFE_LOAD" in ln]
    assert "uninstall() disarmed" in said[0], done.stderr  # the script's own uninstall()
    lines = said[1:]
    if case == "clean":
        assert lines == [], done.stderr
    else:
        assert len(lines) == 1 and "NOT fully in force" in lines[0], done.stderr
        assert "__main__" in lines[0], lines


TWICE = r"""
import compatshim

compatshim.uninstall()  # disarms what the start-up hook armed: said
compatshim.uninstall()  # nothing left to disarm: silent
compatshim.install()
compatshim.uninstall()  # disarms them again: said again
print("RESULT {}")
"""


def test_every_uninstall_that_disarms_the_loading_patches_says_so(tmp_path: Path) -> None:
    """The notice was said once per process: after ``install()``, a second ``uninstall()``
    ended hardened mode silently."""
    script = tmp_path / "child.py"
    script.write_text(TWICE)
    done = run(script, COMPATSHIM_SAFE_LOAD="1")
    result_of(done)
    said = [ln for ln in done.stderr.splitlines() if "uninstall() disarmed" in ln]
    assert len(said) == 2, done.stderr
    assert all("torch-load-safe-globals" in line for line in said), said


HOOKLESS = r"""
import io, json, sys, types
import torch

buf = io.BytesIO()
torch.save({"ns": types.SimpleNamespace(a=1)}, buf)


def hardened():
    buf.seek(0)
    try:
        torch.load(buf, weights_only=False)
    except Exception:
        return True
    return False


found = {"hook": "compatshim_auto" in sys.modules, "before": hardened()}
import compatshim

found["after_import"] = hardened()
compatshim.uninstall()
found["after_uninstall"] = hardened()
print("RESULT " + json.dumps(found))
"""


def test_where_the_start_up_hook_never_runs_import_compatshim_arms_and_says_so(
    tmp_path: Path,
) -> None:
    """compatshim on PYTHONPATH (or ``pip --target``): no ``.pth`` is read there, so the
    start-up hook never ran and ``COMPATSHIM_SAFE_LOAD=1`` was silently off, even after
    ``import compatshim``. Now the import arms the loading patches and says that earlier
    loads were not hardened; an ``uninstall()`` that disarms them says so too (it was
    silent: a library's uninstall() ended hardened mode)."""

    script = tmp_path / "child.py"
    script.write_text(HOOKLESS)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COMPATSHIM_", "PYTHON"))}
    paths = [_source_dir(), *site_folders()]  # as plain folders: no .pth is read
    env.update(PYTHONPATH=os.pathsep.join(paths), COMPATSHIM_SAFE_LOAD="1")
    done = subprocess.run(
        [sys.executable, "-S", str(script)],
        env=env, capture_output=True, text=True, timeout=TIMEOUT_S,
    )  # fmt: skip
    result = result_of(done)
    assert result == {
        "hook": False, "before": False, "after_import": True, "after_uninstall": False
    }, (result, done.stderr)  # fmt: skip
    assert "start-up hook did not run in this interpreter" in done.stderr, done.stderr
    assert "loads before `import compatshim` were not hardened" in done.stderr
    assert "compatshim.uninstall() disarmed torch-load-safe-globals" in done.stderr
