"""Turn the files of a matrix run (``.results/``) into ``matrix/RESULTS.md``.

One row per tox environment (a pinned release set) with its Python, torch and
outcome, one column per test module (an adapter or patch), each cell
pass/fail/skip counts with skip reasons listed below the table, plus the exact
resolved versions each env ran with. Inputs, all written by ``bash matrix/run``:

- ``<env>.xml`` (junit) and ``<env>.versions.json``, from ``tests/run_pytest.py``;
- ``tox-result.json`` (``tox --result-json``): every env tox ran, its exit code
  and duration, so an env that failed before its tests (install, missing pin
  file) is listed as such instead of vanishing from the table;
- ``run.json``: the run's commit, wall time and disk use;
- ``tox-result-rerun-<time>.json`` and ``.commit`` beside it, from ``MATRIX_RERUN=1 bash
  matrix/run -e ...``: envs run again later; their rows replace the first run's and say so.

Releases that could not be installed or run here are listed from
``matrix/*SKIPPED.md``.
"""

from __future__ import annotations

import datetime
import json
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
Counts = dict[str, dict[str, int]]
Reasons = dict[str, set[str]]


def _module_of(case: ET.Element) -> str:
    """``core.test_doctor`` -> ``core/doctor``; ``test_cai_zero`` -> ``cai_zero``."""
    parts = case.get("classname", "").split(".")
    for index, part in enumerate(parts):
        if part.startswith("test_"):
            name = part[len("test_") :]
            return f"{parts[index - 1]}/{name}" if index else name
    return ".".join(parts) or "?"


def read_env(xml_path: Path) -> tuple[Counts, Reasons]:
    counts: Counts = defaultdict(lambda: {"pass": 0, "fail": 0, "skip": 0})
    reasons: Reasons = defaultdict(set)
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        module = _module_of(case)
        skipped = case.find("skipped")
        if case.find("failure") is not None or case.find("error") is not None:
            counts[module]["fail"] += 1
        elif skipped is not None:
            counts[module]["skip"] += 1
            reasons[module].add((skipped.get("message") or "").strip()[:160])
        else:
            counts[module]["pass"] += 1
    return counts, reasons


def cell(c: dict[str, int]) -> str:
    if c["fail"]:
        return f"**FAIL {c['fail']}** / {c['pass']} pass"
    text = f"pass {c['pass']}"
    return text + (f", skip {c['skip']}" if c["skip"] else "")


def _json(path: Path) -> Any:
    return json.loads(path.read_text()) if path.is_file() else {}


def _python_of(tox_env: dict[str, Any]) -> str:
    info = tox_env.get("python") or {}
    version = info.get("version_info")
    return ".".join(map(str, version[:2])) if isinstance(version, list) else ""  # a spec only


def outcome(tox_env: dict[str, Any], has_junit: bool) -> str:
    """ok / FAIL, from tox's own exit code (the junit file alone misses set-up failures)."""
    result = tox_env.get("result")
    if not result:
        return "ok" if has_junit else "?"
    if result.get("success"):
        return "ok"
    if not has_junit:
        return f"**NOT RUN** (set-up failed, exit {result.get('exit_code')})"
    return f"**FAIL** (exit {result.get('exit_code')})"


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min"


def _gib(kib: float) -> str:
    return f"{kib / 1024 / 1024:.1f} GiB"


def run_summary(run: dict[str, Any], envs: int) -> list[str]:
    if not run:
        return []
    lines = [f"Run: `{run.get('command', 'bash matrix/run')}`, {envs} envs"]
    if "wall_s" in run:
        lines[0] += f", {_minutes(run['wall_s'])} wall time"
    if {"uv_cache_before_kib", "uv_cache_after_kib"} <= run.keys():
        growth = run["uv_cache_after_kib"] - run["uv_cache_before_kib"]
        lines[0] += (
            f"; uv cache {_gib(run['uv_cache_before_kib'])} -> {_gib(run['uv_cache_after_kib'])}"
            f" (+{_gib(growth)}, shared with other work on this machine)"
        )
    if "tox_kib" in run:
        lines[0] += f"; `.tox` {_gib(run['tox_kib'])} as `du` counts it"
        if "tox_beyond_cache_kib" in run:
            lines[0] += f", {_gib(run['tox_beyond_cache_kib'])} beyond the files it hard-links"
            lines[0] += " from the uv cache"
    if run.get("machine"):
        lines[0] += f"; {run['machine']}"
    return [lines[0] + ".", ""]


def tox_results(results: Path) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """Every env tox ran, newest run winning; and, per re-run env, the commit it re-ran on."""
    tox_envs: dict[str, dict[str, Any]] = {}
    rerun: dict[str, str] = {}
    reruns = sorted(results.glob("tox-result-rerun-*.json"))
    for path in [results / "tox-result.json", *reruns]:
        found = _json(path).get("testenvs", {})
        # the JSON lists every configured env; those this run did not select have no result
        ran = {n: e for n, e in found.items() if "result" in e and not n.startswith(".")}
        tox_envs.update(ran)
        if path in reruns:
            marker = path.with_suffix(".commit")
            commit = marker.read_text().strip() if marker.is_file() else "a later commit"
            rerun.update(dict.fromkeys(ran, commit))
    return tox_envs, rerun


def main(argv: list[str]) -> int:
    results = Path(argv[0]) if argv else ROOT / ".results"
    run = _json(results / "run.json")
    commit = argv[1] if len(argv) > 1 else run.get("commit", "the working tree")
    tox_envs, rerun = tox_results(results)
    junit = {p.stem for p in results.glob("*.xml")}
    envs = sorted(junit | {name for name in tox_envs if name != "lint"})
    if not envs:
        print(f"no junit files or tox results in {results}", file=sys.stderr)
        return 1
    empty: tuple[Counts, Reasons] = ({}, {})
    data = {env: read_env(results / f"{env}.xml") if env in junit else empty for env in envs}
    versions = {env: _json(results / f"{env}.versions.json") for env in envs}
    modules = sorted({m for counts, _ in data.values() for m in counts})
    lint = outcome(tox_envs["lint"], True) if "lint" in tox_envs else "not run"
    lines = [
        "# Compatibility matrix results",
        "",
        f"Generated {datetime.date.today().isoformat()} by `python matrix/make_results.py` "
        f"from the junit files of the run below, on commit {commit} "
        f"(CPU, real multi-process gloo groups). `lint` (ruff + mypy): {lint}.",
        "",
        *run_summary(run, len(envs)),
        "Rows are pinned release sets (tox envs, pins in `matrix/<env>.txt`); columns are test "
        "modules (one per adapter or patch). Empty cell: that family is not tested in that env.",
        "",
        "| env | python | torch | result | time | " + " | ".join(modules) + " |",
        "|---|---|---|---|---|" + "---|" * len(modules),
    ]
    for env in envs:
        counts, _ = data[env]
        tox_env = tox_envs.get(env, {})
        python = versions[env].get("python") or _python_of(tox_env)
        seconds = (tox_env.get("result") or {}).get("duration")
        result = outcome(tox_env, env in junit)
        if env in rerun:
            result += f" (re-run on {rerun[env]})"
        lines.append(
            f"| {env} | {python} | {versions[env].get('torch', '')} "
            f"| {result} | {_minutes(seconds) if seconds else ''} | "
            + " | ".join(cell(counts[m]) if m in counts else "" for m in modules)
            + " |"
        )
    lines += ["", "## Skip reasons", ""]
    for env in envs:
        for module, why in sorted(data[env][1].items()):
            lines += [f"- {env} / {module}: " + "; ".join(sorted(r for r in why if r))]
    lines += ["", "## Resolved versions", "", "| env | versions |", "|---|---|"]
    for env in envs:
        found = versions[env] or {"(none recorded)": "the env failed before its tests"}
        lines.append(f"| {env} | " + ", ".join(f"{k} {v}" for k, v in found.items()) + " |")
    for skipped in sorted((ROOT / "matrix").glob("*SKIPPED.md")):
        lines += ["", skipped.read_text().strip()]
    gpu = ROOT / "matrix" / "GPU.md"
    if gpu.exists():
        lines += ["", gpu.read_text().strip()]
    history = ROOT / "matrix" / "HISTORY.md"  # dated runs and their cost, kept by hand
    if history.exists():
        lines += ["", history.read_text().strip()]
    out = Path(argv[2]) if len(argv) > 2 else ROOT / "matrix" / "RESULTS.md"
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out}: {len(envs)} envs, {len(modules)} test modules")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
