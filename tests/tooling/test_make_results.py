"""matrix/make_results.py: a re-run env's row replaces the first run's and says so."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

SCRIPT = Path(__file__).resolve().parents[2] / "matrix" / "make_results.py"


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_results", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def junit(path: Path, failed: bool) -> None:
    body = "<failure message='boom'/>" if failed else ""
    path.write_text(
        "<testsuites><testsuite>"
        f"<testcase classname='tests.core.test_doctor' name='test_a'>{body}</testcase>"
        "</testsuite></testsuites>"
    )


def tox_result(path: Path, envs: dict[str, bool]) -> None:
    testenvs = {
        name: {"result": {"success": ok, "exit_code": 0 if ok else 1, "duration": 60.0}}
        for name, ok in envs.items()
    }
    testenvs["not-selected"] = {}
    path.write_text(json.dumps({"testenvs": testenvs}))


def test_rerun_rows_replace_the_first_run(tmp_path: Path) -> None:
    results = tmp_path / ".results"
    results.mkdir()
    (results / "run.json").write_text(json.dumps({"commit": "aaa111", "wall_s": 600}))
    assert load_script().run_summary({"wall_s": 600}, 2)[0].startswith("Run: ")
    tox_result(results / "tox-result.json", {"env-a": True, "env-b": False, "lint": True})
    junit(results / "env-a.xml", failed=False)
    junit(results / "env-b.xml", failed=False)  # the re-run's junit replaced the failing one
    tox_result(results / "tox-result-rerun-100.json", {"env-b": True})
    (results / "tox-result-rerun-100.commit").write_text("bbb222\n")
    out = tmp_path / "RESULTS.md"

    assert load_script().main([str(results), "aaa111", str(out)]) == 0

    text = out.read_text()
    rows: dict[str, str] = {}
    for line in text.splitlines():  # the first table; the versions table repeats the names
        if line.startswith("| env-"):
            rows.setdefault(line.split(" | ")[0][2:], line)
    assert "| ok |" in rows["env-a"] and "re-run" not in rows["env-a"]
    assert "| ok (re-run on bbb222) |" in rows["env-b"]
    assert "on commit aaa111" in text
    assert "not-selected" not in text
