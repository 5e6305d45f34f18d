"""Run ``bench/bench_*.py`` and keep their Markdown in ``bench/RESULTS.md``.

Each benchmark runs in its own interpreter (they import different frameworks);
inside each, contenders run side by side. A run replaces only the sections of
the benchmarks it ran, so benchmarks that need another torch or a framework
(``tox -e bench-torch2.13``, ``tox -e bench-lightning2.6``, ``tox -e
bench-deepspeed0.19``) and the rest (``tox -e bench``) share one file. Each
section records the date, machine, torch and load average it was measured at,
because ratios are only comparable on the same kind of machine and the machines
are shared.
"""

from __future__ import annotations

import datetime
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "RESULTS.md"
HEADER = """# Benchmark results

Written by `python bench/run_all.py [bench_name ...]` (`tox -e bench`, `tox -e bench-torch2.13`,
`tox -e bench-lightning2.6`, `tox -e bench-deepspeed0.19`); a run replaces only the sections of
the benchmarks it ran.

Shared, noisy machines: every figure is a median over interleaved repeats, and the ratios
(compatshim vs the alternative a user would pick, run side by side) are what to compare.
"""
SECTION = re.compile(r"<!-- bench:(\w+) -->\n.*?<!-- /bench:\1 -->\n", re.S)


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        import torch

        torch_line = f"torch {torch.__version__}, {torch.get_num_threads()} intra-op threads"
        if torch.cuda.is_available():
            torch_line += f", GPU {torch.cuda.get_device_name(0)}"
    except ImportError:
        torch_line = "torch not installed"
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    python = platform.python_version()
    return f"{cpu}; {os.cpu_count()} cores; {mem:.0f} GiB RAM; Python {python}; {torch_line}"


def run_one(name: str, where: str) -> tuple[str, bool]:
    """One benchmark's section (Markdown between markers) and whether it succeeded."""
    print(f"== {name}", flush=True)
    before = os.getloadavg()[0]
    done = subprocess.run(
        [sys.executable, str(HERE / f"{name}.py")], capture_output=True, text=True, cwd=HERE
    )
    print(done.stdout, flush=True)
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-15:])
        print(tail, file=sys.stderr)
        body = f"### {name}: FAILED (exit {done.returncode})\n\n```\n{tail}\n```"
    else:
        # each bench's main() also prints its ratios as a JSON line: keep only the Markdown
        body = "\n".join(
            line for line in done.stdout.strip().splitlines() if not line.startswith("{")
        )
    # the machine is shared: the load average says how much else ran beside the benchmark
    load = f"load average {before:.1f} at start, {os.getloadavg()[0]:.1f} at end"
    stamp = f"_{name}, {datetime.date.today().isoformat()}: {where}; {load}_"
    section = f"<!-- bench:{name} -->\n{body}\n\n{stamp}\n<!-- /bench:{name} -->\n"
    return section, done.returncode == 0


def merge(old: str, new: dict[str, str]) -> str:
    """RESULTS.md with ``new`` sections replacing (or added after) the old ones, sorted by name."""
    sections = {m[1]: m[0] for m in SECTION.finditer(old)}
    sections.update(new)
    return HEADER + "".join(f"\n{sections[name]}" for name in sorted(sections))


def main(argv: list[str]) -> int:
    selected = argv or sorted(p.stem for p in HERE.glob("bench_*.py"))
    where = machine()
    new, failed = {}, []
    for name in selected:
        new[name], ok = run_one(name, where)
        if not ok:
            failed.append(name)
    old = RESULTS.read_text() if RESULTS.exists() else ""
    RESULTS.write_text(merge(old, new))
    print(f"wrote {RESULTS}; failed: {failed or 'none'}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
