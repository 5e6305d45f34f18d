"""Hardened mode: ``COMPATSHIM_AUTO=1 COMPATSHIM_SAFE_LOAD=1`` makes every torch.load safe.

Each test starts a fresh interpreter the way a user's job starts (the start-up
hook arms compatshim), so the patch applies as it would in a process we do not
write. The child runs one scenario script and prints one ``RESULT`` JSON line.
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

TIMEOUT_S = 300
pytestmark = pytest.mark.timeout(TIMEOUT_S + 60)


# The start-up hook: an installed compatshim runs compatshim_auto.pth at interpreter start;
# from a source tree (PYTHONPATH=src), site.addsitedir runs the same .pth file.
def boot(hooked: str) -> str:
    """The child's first lines: run the source tree's .pth unless ``hooked`` (the module the
    hook imports) shows an installed hook already ran, then the script."""
    return (
        "import runpy, site, sys\n"
        f"if {hooked!r} not in sys.modules:\n"
        "    site.addsitedir(sys.argv[1])\n"
        "sys.argv = sys.argv[2:]\n"
        "sys.path.insert(0, __import__('os').path.dirname(sys.argv[0]))\n"
        "runpy.run_path(sys.argv[0], run_name='__main__')\n"
    )


BOOT = boot("compatshim.auto")


def _source_dir() -> str:
    import compatshim

    return str(Path(compatshim.__file__).resolve().parent.parent)


def run_child(script: Path, *args: str, **env_extra: str) -> dict[str, Any]:
    """Run ``script`` armed and hardened; its ``RESULT`` record (stderr under ``"stderr"``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COMPATSHIM_", "TORCH_FORCE"))}
    env.update({"COMPATSHIM_AUTO": "1", "COMPATSHIM_SAFE_LOAD": "1", **env_extra})
    done = subprocess.run(
        [sys.executable, "-c", BOOT, _source_dir(), str(script), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            result: dict[str, Any] = json.loads(line[len("RESULT ") :])
            result["stderr"] = done.stderr
            return result
    raise AssertionError(
        f"no result, exit {done.returncode}:\n{done.stdout}\n{done.stderr[-5000:]}"
    )


class Payload:
    """Pickles as ``os.system("touch MARKER")``: a poisoned checkpoint, never loaded here."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> Any:
        return (os.system, (f"touch {self.marker}",))


# The child: every line that calls torch.load is marked "# CALL" (warnings must name it).
CHILD = r"""
import fractions, decimal, io, json, pickle, sys, types, warnings

import torch

import compatshim
import compatshim.checkpoint

folder = sys.argv[1]
result = {"hardened": getattr(torch.load, "__compatshim_hardened__", None)}
(row,) = [r for r in compatshim.status() if r.name == "torch-load-safe-globals"]
result["fixed"] = row.fixed


def attempt(name, call):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        try:
            value = call()
        except pickle.UnpicklingError as exc:
            result[name] = {
                "error": type(exc).__name__,
                "unpickling_error": isinstance(exc, pickle.UnpicklingError),
                "refused": list(getattr(exc, "refused", ["<no refused attribute>"])),
                "message": str(exc),
            }
        else:
            result[name] = {"loaded": repr(value)[:200]}
    result[name]["warnings"] = [
        [w.category.__name__, w.filename, w.lineno, str(w.message)[:300]] for w in seen
    ]


clean = f"{folder}/clean.pt"
poisoned = f"{folder}/poisoned.pt"
state = torch.nn.Linear(3, 2).state_dict()
torch.save(state, clean)
loaded = torch.load(clean, weights_only=False)  # CALL
result["clean"] = all(torch.equal(loaded[k], state[k]) for k in state)
loaded = torch.load(clean, map_location="cpu", pickle_module=pickle, weights_only=False)  # CALL
result["clean_pickle_module"] = all(torch.equal(loaded[k], state[k]) for k in state)
with open(clean, "rb") as handle:
    handle.seek(0)
    result["clean_file_object"] = sorted(torch.load(handle, weights_only=False))  # CALL

attempt("poisoned_false", lambda: torch.load(poisoned, weights_only=False))  # CALL
attempt("poisoned_default", lambda: torch.load(poisoned))  # CALL
attempt("poisoned_pickle_module", lambda: torch.load(poisoned, pickle_module=pickle))  # CALL

for name, value in [
    ("fraction", fractions.Fraction(1, 3)),  # COMPATSHIM_ALLOW, from the parent
    ("decimal", decimal.Decimal("1.5")),  # COMPATSHIM_ALLOW_FILE, from the parent
    ("namespace", types.SimpleNamespace(a=1)),  # compatshim.checkpoint.allow below
]:
    torch.save({"v": value, "w": torch.ones(2)}, f"{folder}/{name}.pt")
attempt("fraction", lambda: torch.load(f"{folder}/fraction.pt", weights_only=False))  # CALL
attempt("decimal", lambda: torch.load(f"{folder}/decimal.pt", weights_only=False))  # CALL
namespace = f"{folder}/namespace.pt"
attempt("namespace_before", lambda: torch.load(namespace, weights_only=False))  # CALL
compatshim.checkpoint.allow("types.SimpleNamespace", reason="the test's own files")
compatshim.checkpoint.allow("types.SimpleNamespace", reason="twice is once")
attempt("namespace_after", lambda: torch.load(namespace, weights_only=False))  # CALL
result["allowed"] = [[e.qualname, e.source] for e in compatshim.checkpoint.allowed()]
lines = enumerate(open(__file__), 1)
result["calls"] = [n for n, line in lines if line.rstrip().endswith("# CALL")]
print("RESULT " + json.dumps(result))
"""


@pytest.fixture(scope="module")
def hardened(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path, Path]:
    folder = tmp_path_factory.mktemp("hardened")
    marker = folder / "MARKER"
    torch.save({"w": torch.ones(2), "payload": Payload(marker)}, folder / "poisoned.pt")
    script = folder / "child.py"
    script.write_text(CHILD)
    allow_file = folder / "allow.txt"
    allow_file.write_text("# trusted here\n\ndecimal.Decimal   # money in the test's files\n")
    result = run_child(
        script,
        str(folder),
        COMPATSHIM_ALLOW="fractions.Fraction",
        COMPATSHIM_ALLOW_FILE=str(allow_file),
    )
    return result, marker, script


def test_the_patch_applies_hardened(hardened: tuple[dict[str, Any], Path, Path]) -> None:
    result, _, _ = hardened
    assert result["hardened"] is True and result["fixed"] is True, result["stderr"][-3000:]


def test_a_clean_state_dict_loads_whatever_weights_only_says(
    hardened: tuple[dict[str, Any], Path, Path],
) -> None:
    result, _, _ = hardened
    assert result["clean"] and result["clean_pickle_module"]
    assert result["clean_file_object"] == ["bias", "weight"]


@pytest.mark.parametrize("call", ["poisoned_false", "poisoned_default", "poisoned_pickle_module"])
def test_a_poisoned_file_is_refused_and_never_runs(
    hardened: tuple[dict[str, Any], Path, Path], call: str
) -> None:
    result, marker, _ = hardened
    outcome = result[call]
    assert not marker.exists()
    assert outcome.get("error") == "UnsafeCheckpointError" and outcome["unpickling_error"]
    assert outcome["refused"] == [f"{os.system.__module__}.system"]
    message = outcome["message"]
    # PyG's fs.torch_load retries with weights_only=False when the error says add_safe_globals
    assert "add_safe_globals" not in message and "weights_only=False" not in message
    assert "may be malicious" in message and "COMPATSHIM_ALLOW=" not in message


def test_warnings_name_the_line_that_called_torch_load(
    hardened: tuple[dict[str, Any], Path, Path],
) -> None:
    result, _, script = hardened
    (warning,) = result["poisoned_false"]["warnings"]
    category, filename, lineno, message = warning
    assert category == "CheckpointRefusedWarning" and "poisoned.pt" in message
    assert Path(filename) == script and lineno in result["calls"]


def test_process_wide_entries_from_env_file_and_code(
    hardened: tuple[dict[str, Any], Path, Path],
) -> None:
    result, _, _ = hardened
    assert result["fraction"]["loaded"].startswith("{'v': Fraction(1, 3)")
    assert result["decimal"]["loaded"].startswith("{'v': Decimal('1.5')")
    assert result["namespace_before"]["refused"] == ["types.SimpleNamespace"]
    advice = result["namespace_before"]["message"]
    assert "COMPATSHIM_ALLOW=types.SimpleNamespace" in advice
    assert "compatshim.checkpoint.allow('types.SimpleNamespace'" in advice
    assert "add_safe_globals" not in advice and "weights_only=False" not in advice
    assert result["namespace_after"]["loaded"].startswith("{'v': namespace(a=1)")
    sources = dict(result["allowed"])
    assert sources["types.SimpleNamespace"] == "compatshim.checkpoint.allow"
    assert sources["fractions.Fraction"] == "COMPATSHIM_ALLOW"
    assert sources["decimal.Decimal"].endswith("allow.txt:3")
    assert len(result["allowed"]) == 3


def test_control_armed_only_the_payload_runs(tmp_path: Path) -> None:
    """Without COMPATSHIM_SAFE_LOAD the same file runs its payload: the refusals above are real."""
    marker = tmp_path / "MARKER"
    torch.save({"payload": Payload(marker)}, tmp_path / "poisoned.pt")
    script = tmp_path / "child.py"
    script.write_text(
        "import json, sys, torch\n"
        "torch.load(sys.argv[1] + '/poisoned.pt', weights_only=False)\n"
        "hardened = getattr(torch.load, '__compatshim_hardened__', False)\n"
        "print('RESULT ' + json.dumps({'hardened': hardened}))\n"
    )
    result = run_child(script, str(tmp_path), COMPATSHIM_SAFE_LOAD="0")
    assert result["hardened"] is False and marker.exists()


@pytest.mark.parametrize(
    "env,says",
    [
        ({}, "off: torch.load(weights_only=False)"),
        ({"COMPATSHIM_SAFE_LOAD": "1", "COMPATSHIM_AUTO": "1"}, "on: every torch.load"),
        (
            {"COMPATSHIM_SAFE_LOAD": "1", "COMPATSHIM_DISABLE": "torch_load_safe_globals"},
            "off: COMPATSHIM_SAFE_LOAD is set but COMPATSHIM_DISABLE",
        ),
    ],
)
def test_the_doctor_says_whether_hardened_mode_is_on(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], says: str
) -> None:
    from compatshim.checkpoint import doctor, process_allow

    for name in ("COMPATSHIM_SAFE_LOAD", "COMPATSHIM_AUTO", "COMPATSHIM_DISABLE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("COMPATSHIM_ALLOW", "fractions.Fraction")
    process_allow._reset()
    row = doctor.safe_load_row()
    assert row.name == "checkpoint-safe-load" and row.detail.startswith(says), row.detail
    assert row.extra["safe_load"] is says.startswith("on")
    assert "fractions.Fraction (COMPATSHIM_ALLOW)" in row.detail
    assert row.extra["allowed"][0]["qualname"] == "fractions.Fraction"
