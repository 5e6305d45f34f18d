"""Turn the junit files of a matrix run (``.results/<env>.xml``) into ``matrix/RESULTS.md``.

One row per tox environment (a pinned release set), one column per test module
(an adapter or patch), each cell pass/fail/skip counts with skip reasons listed
below the table, plus the exact resolved versions each env ran with. Releases
that could not be installed or run here are listed from ``matrix/*SKIPPED.md``.
"""

from __future__ import annotations

import datetime
import json
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _module_of(case: ET.Element) -> str:
    """``core.test_doctor`` -> ``core/doctor``; ``test_cai_zero`` -> ``cai_zero``."""
    parts = case.get("classname", "").split(".")
    for index, part in enumerate(parts):
        if part.startswith("test_"):
            name = part[len("test_") :]
            return f"{parts[index - 1]}/{name}" if index else name
    return ".".join(parts) or "?"


def read_env(xml_path: Path) -> tuple[dict[str, dict[str, int]], dict[str, set[str]]]:
    counts: dict[str, dict[str, int]] = defaultdict(lambda: {"pass": 0, "fail": 0, "skip": 0})
    reasons: dict[str, set[str]] = defaultdict(set)
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


def main(argv: list[str]) -> int:
    results = Path(argv[0]) if argv else ROOT / ".results"
    commit = argv[1] if len(argv) > 1 else "the working tree"
    envs = sorted(p.stem for p in results.glob("*.xml"))
    if not envs:
        print(f"no junit files in {results}", file=sys.stderr)
        return 1
    data = {env: read_env(results / f"{env}.xml") for env in envs}
    modules = sorted({m for counts, _ in data.values() for m in counts})
    lines = [
        "# Compatibility matrix results",
        "",
        f"Generated {datetime.date.today().isoformat()} by `python matrix/make_results.py` "
        f"from the junit files of `tox -m matrix` run on {commit} "
        "(CPU, real multi-process gloo groups; `lint` = ruff + mypy has no junit file).",
        "",
        "Rows are pinned release sets (tox envs, pins in `matrix/<env>.txt`); columns are test "
        "modules (one per adapter or patch). Empty cell: that family is not tested in that env.",
        "",
        "| env | " + " | ".join(modules) + " |",
        "|---|" + "---|" * len(modules),
    ]
    for env in envs:
        counts, _ = data[env]
        lines.append(
            f"| {env} | "
            + " | ".join(cell(counts[m]) if m in counts else "" for m in modules)
            + " |"
        )
    lines += ["", "## Skip reasons", ""]
    for env in envs:
        for module, why in sorted(data[env][1].items()):
            lines += [f"- {env} / {module}: " + "; ".join(sorted(r for r in why if r))]
    lines += ["", "## Resolved versions", "", "| env | versions |", "|---|---|"]
    for env in envs:
        vfile = results / f"{env}.versions.json"
        versions = json.loads(vfile.read_text()) if vfile.exists() else {}
        lines.append(f"| {env} | " + ", ".join(f"{k} {v}" for k, v in versions.items()) + " |")
    for skipped in sorted((ROOT / "matrix").glob("*SKIPPED.md")):
        lines += ["", skipped.read_text().strip()]
    gpu = ROOT / "matrix" / "GPU.md"
    if gpu.exists():
        lines += ["", gpu.read_text().strip()]
    out = ROOT / "matrix" / "RESULTS.md"
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out}: {len(envs)} envs, {len(modules)} test modules")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
