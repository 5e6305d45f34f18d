"""Write ``matrix/GPU.md`` from one run of ``matrix/gpu/leg.sh`` (its ``$OUT`` folder).

Reads ``suite.xml`` and ``gpu.xml`` (pytest's junit), each benchmark's output and the
machine itself (torch, CUDA, NCCL, ``nvidia-smi``), run by the leg's own interpreter. A
machine without a CUDA device gets a GPU.md that says so in its first line: a
rehearsal, never a GPU result.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

OUTCOMES = ("passed", "failed", "errors", "skipped")
BEGIN, END = "<!-- gpu-leg -->", "<!-- /gpu-leg -->"


def machine() -> dict[str, str]:
    """What the leg ran on; "-" where a part is missing."""
    found = {"python": platform.python_version(), "cores": str(os.cpu_count())}
    try:
        import torch
    except ImportError:
        return {**found, "torch": "not installed", "device": "no CUDA device (torch missing)"}
    found["torch"] = str(torch.__version__)
    found["cuda"] = str(torch.version.cuda or "-")
    if torch.cuda.is_available() and torch.cuda.device_count():
        count = torch.cuda.device_count()
        found["device"] = f"{count} x {torch.cuda.get_device_name(0)}"
        try:
            found["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception as exc:  # a build without NCCL: say so, do not fail the record
            found["nccl"] = f"- ({type(exc).__name__})"
    else:
        found["device"] = "no CUDA device"
    try:
        smi = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        found["driver"] = smi.stdout.strip().splitlines()[0] if smi.returncode == 0 else "-"
    except (OSError, subprocess.TimeoutExpired, IndexError):
        found["driver"] = "-"
    return found


def family(case: ET.Element) -> str:
    """``tests.rng.test_plan`` -> ``rng`` (a module skipped whole has its path as its name)."""
    parts = (case.get("classname") or case.get("name", "")).split(".")
    return parts[1] if len(parts) > 2 and parts[0] == "tests" else parts[0] or "?"


def outcome(case: ET.Element) -> str:
    if case.find("failure") is not None:
        return "failed"
    if case.find("error") is not None:
        return "errors"
    return "skipped" if case.find("skipped") is not None else "passed"


def read_junit(
    path: Path, modules: bool = True
) -> tuple[dict[str, dict[str, int]], list[tuple[str, str, str]], str]:
    """Counts per family, (test, outcome, first line of its message) per case, suite time.
    ``modules=False`` leaves out modules skipped whole at collection (no classname): both runs
    collect every module, so the suite's run alone counts those."""
    counts: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(OUTCOMES, 0))
    cases: list[tuple[str, str, str]] = []
    if not path.is_file():
        return counts, cases, "-"
    root = ET.parse(path).getroot()
    seconds = sum(float(s.get("time", 0)) for s in root.iter("testsuite"))
    for case in root.iter("testcase"):
        if not modules and not case.get("classname"):
            continue
        result = outcome(case)
        counts[family(case)][result] += 1
        detail = next(iter(case), None)
        message = (detail.get("message") or "") if detail is not None else ""
        name = "::".join(filter(None, (case.get("classname"), case.get("name"))))
        cases.append((name, result, message.strip().splitlines()[0][:160] if message else ""))
    return counts, cases, f"{seconds:.0f} s"


def totals(counts: dict[str, dict[str, int]]) -> dict[str, int]:
    return {key: sum(c[key] for c in counts.values()) for key in OUTCOMES}


def line(total: dict[str, int]) -> str:
    return ", ".join(f"{total[key]} {key}" for key in OUTCOMES)


def table(counts: dict[str, dict[str, int]]) -> list[str]:
    rows = ["| family | " + " | ".join(OUTCOMES) + " |", "|---" * (len(OUTCOMES) + 1) + "|"]
    for name in sorted(counts):
        rows.append(f"| {name} | " + " | ".join(str(counts[name][k]) for k in OUTCOMES) + " |")
    return rows


def bench_section(out: Path, name: str) -> list[str]:
    """The benchmark's Markdown as ``bench/run_all.py`` printed it, or why there is none."""
    text = (
        (out / f"{name}.txt").read_text(errors="replace") if (out / f"{name}.txt").is_file() else ""
    )
    rc = (out / f"{name}.rc").read_text().strip() if (out / f"{name}.rc").is_file() else "?"
    keep = [row for row in text.splitlines() if not row.startswith(("{", "== ", "wrote "))]
    head = f"### {name}" + (
        "" if rc == "0" else f" (exit {rc}{', timed out' if rc in ('124', '137') else ''})"
    )
    return [head, "", *(keep[-60:] or ["(no output)"]), ""]


def doctor_section(out: Path) -> list[str]:
    """``compatshim doctor`` as the leg ran it (COMPATSHIM_AUTO=1), or nothing if it did not."""
    text, rc = out / "doctor.txt", out / "doctor.rc"
    if not text.is_file():
        return []
    code = rc.read_text().strip() if rc.is_file() else "?"
    body = text.read_text(errors="replace").rstrip().splitlines()[-80:]
    head = f"### `COMPATSHIM_AUTO=1 python -m compatshim doctor`: exit {code}"
    return [head, "", "```text", *body, "```", ""]


def render(out: Path, command: str, seconds: str, benches: list[str]) -> str:
    info = machine()
    gpu = info["device"] != "no CUDA device" and not info["device"].startswith("no CUDA")
    suite, suite_cases, suite_time = read_junit(out / "suite.xml")
    marked, marked_cases, marked_time = read_junit(out / "gpu.xml", modules=False)
    combined: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(OUTCOMES, 0))
    for source in (suite, marked):  # the whole suite is both runs together
        for name, counts in source.items():
            for key in OUTCOMES:
                combined[name][key] += counts[key]
    whole = totals(combined)
    today = datetime.date.today().isoformat()
    lines = [BEGIN, "## The last run of the GPU leg", ""]
    if not gpu:
        lines += [
            f"**No CUDA device: a rehearsal of the leg on {today}, not a GPU result.** "
            "Every `gpu`/`multigpu` test skipped; nothing below was measured on a GPU.",
            "",
        ]
    lines += [
        f"Run {today} by `{command}` ({seconds} s in all).",
        "",
        "| device | driver, memory | torch | CUDA | NCCL | Python | cores |",
        "|---|---|---|---|---|---|---|",
        "| {device} | {driver} | {torch} | {cuda} | {nccl} | {python} | {cores} |".format(
            **{
                k: info.get(k, "-")
                for k in ("device", "driver", "torch", "cuda", "nccl", "python", "cores")
            }
        ),
        "",
        f"**Whole suite: {line(whole)}** (every test not marked gpu/multigpu in {suite_time}, "
        f"the gpu/multigpu tests in one process beside it in {marked_time}).",
        "",
        *table(combined),
        "",
        f"### gpu / multigpu tests: {line(totals(marked))}",
        "",
        "(Modules skipped whole at collection are counted once, in the table above.)",
        "",
        "| test | outcome | message |",
        "|---|---|---|",
        *(f"| `{n}` | {r} | {m.replace('|', '/')} |" for n, r, m in marked_cases),
        "",
    ]
    bad = [(n, r, m) for n, r, m in suite_cases + marked_cases if r in ("failed", "errors")]
    if bad:
        lines += ["### Failures", "", *(f"- `{n}` ({r}): {m}" for n, r, m in bad), ""]
    if not (out / "suite.xml").is_file():
        lines += ["The suite wrote no junit file (killed before its summary): see suite.txt.", ""]
    for run in ("suite", "gpu_tests"):  # 124/137: its own clock; 130: a signal to the leg
        rc = out / f"{run}.rc"
        if rc.is_file() and rc.read_text().strip() in ("124", "130", "137"):
            lines += [
                f"**`{run}` was stopped before it finished (its `GPU_SUITE_S` clock, or a "
                "signal to the leg): the counts above cover only the tests that ran.**",
                "",
            ]
    lines += doctor_section(out)
    lines += ["### Benchmarks", ""]
    for name in benches:
        lines += bench_section(out, name)
    if not benches:
        lines += ["None ran (`GPU_BENCHES` named none, or none it named is here).", ""]
    return "\n".join([*lines, END]) + "\n"


def put(path: Path, section: str) -> None:
    """Replace the leg's section of ``path`` (everything else is kept), or write it alone."""
    old = path.read_text() if path.is_file() else ""
    if BEGIN in old and END in old:
        head, rest = old.split(BEGIN, 1)
        path.write_text(head + section.rstrip("\n") + rest.split(END, 1)[1])
    else:
        path.write_text(section)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--command", required=True)
    parser.add_argument("--seconds", default="?")
    parser.add_argument("--benches", default="")
    parser.add_argument("--write", type=Path, nargs="+", required=True)
    args = parser.parse_args()
    text = render(args.out, args.command, args.seconds, args.benches.split())
    for path in args.write:
        put(path, text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
