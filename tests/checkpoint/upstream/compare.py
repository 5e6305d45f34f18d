"""Outcome of every test per mode from run_torch_serialization.sh's junit files; the
tests whose outcome differs between modes, with the first line of each failure.

    python compare.py OUT_DIR [plain armed hardened]
"""

from __future__ import annotations

import collections
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def outcomes(path: Path) -> dict[str, tuple[str, str]]:
    """test id -> (passed | failure | error | skipped, first line of the message)."""
    found = {}
    for case in ET.parse(path).iter("testcase"):
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome, message = child.tag, (child.get("message") or "").split("\n")[0]
                break
        found[f"{case.get('classname')}::{case.get('name')}"] = (outcome, message[:200])
    return found


def main(out: Path, modes: list[str]) -> int:
    runs = {mode: outcomes(out / f"{mode}.xml") for mode in modes}
    for mode, found in runs.items():
        counts = collections.Counter(outcome for outcome, _ in found.values())
        print(f"{mode}: {dict(sorted(counts.items()))}")
    differing = 0
    for test in sorted(set().union(*runs.values())):
        seen = [runs[mode].get(test, ("absent", "")) for mode in modes]
        if len({outcome for outcome, _ in seen}) > 1:
            differing += 1
            print(" | ".join(outcome for outcome, _ in seen), test)
            for mode, (outcome, message) in zip(modes, seen):
                if outcome in ("failure", "error"):
                    print(f"    {mode}: {message}")
    print(f"{differing} tests differ")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), sys.argv[2:] or ["plain", "armed", "hardened"]))
