"""Outcome counts of run_fabric_suite.sh, plain vs armed, and every test whose outcome differs.

``summarise.py OUT_DIR`` prints the table; ``summarise.py --runnable SETUP_XML`` lists the
standalone tests that a ``--setup-only`` pass did not skip (the ones to run one by one).
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path


def outcomes(xml: Path) -> dict[str, str]:
    found = {}
    for case in ET.parse(xml).iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        kinds = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
        found[name] = "failed" if {"failure", "error"} & set(kinds) else (kinds or ["passed"])[0]
    return found


def test_id(case: ET.Element) -> str:
    path = (case.get("classname") or "").replace(".", "/")
    parts = path.split("/")
    for cut in range(len(parts), 0, -1):  # classname is module path [+ class]
        module = "/".join(parts[:cut]) + ".py"
        if Path(module).exists():
            rest = parts[cut:]
            return "::".join([module, *rest, case.get("name") or ""])
    return f"{path}::{case.get('name')}"


def runnable(setup_xml: Path) -> list[str]:
    cases = ET.parse(setup_xml).iter("testcase")
    # a module that failed to collect is a testcase without a class name: not a test to run
    return [
        test_id(case) for case in cases if case.find("skipped") is None and case.get("classname")
    ]


def collect(out: Path, mode: str) -> dict[str, str]:
    found = outcomes(out / f"{mode}-suite.xml") if (out / f"{mode}-suite.xml").exists() else {}
    setup = out / f"{mode}-standalone-setup.xml"
    standalone = {}
    if setup.exists():
        standalone = {k: v for k, v in outcomes(setup).items() if v == "skipped"}
        for xml in sorted(out.glob(f"{mode}-standalone-[0-9]*.xml")):
            standalone.update(outcomes(xml))
    found.update({f"[standalone] {k}": v for k, v in standalone.items()})
    return found


def main() -> None:
    if sys.argv[1] == "--runnable":
        print("\n".join(runnable(Path(sys.argv[2]))))
        return
    out = Path(sys.argv[1])
    results = {mode: collect(out, mode) for mode in ("plain", "armed")}
    for mode, found in results.items():
        for part in ("suite", "standalone"):
            standalone = part == "standalone"
            mine = [v for k, v in found.items() if k.startswith("[standalone]") == standalone]
            print(f"{mode:5} {part:10} {dict(sorted(Counter(mine).items()))}")
    plain, armed = results["plain"], results["armed"]
    for name in sorted(set(plain) | set(armed)):
        if plain.get(name) != armed.get(name):
            print(f"DIFFERS {name}: plain {plain.get(name)}, armed {armed.get(name)}")


if __name__ == "__main__":
    main()
