"""Run the 2-rank teardown scenario many times, armed and plain, and count runs that hang.

Not a test (pytest does not collect it): a race at process-group teardown shows
up in a few percent of runs at most, so one run proves little. This is how the
``SETTLE`` pause in ``compatshim/desync/_group_end.py`` was measured. Use a
lightning env's Python from the repository root, e.g.::

    .tox/lightning-2.6.6/bin/python tests/lightning/teardown_stress.py 60 --parallel 4

A hung run is killed after ``--grace`` seconds without progress; its output
(stacks dumped by faulthandler) goes to ``teardown-stress-<mode>-<n>.txt``.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[1])]  # the checkout root, for tests.lightning.fabric_runs
from tests.lightning.fabric_runs import Run, run_script  # noqa: E402


def one(number: int, armed: bool, grace: float, out: Path) -> tuple[str, bool, float]:
    mode = "armed" if armed else "plain"
    run: Run = run_script("healthy_teardown.py", "2", auto=armed, hard_timeout=120, grace=grace)
    bad = bool(run.survivors) or run.timed_out or run.returncode != 0
    if bad:
        report = out / f"teardown-stress-{mode}-{number}.txt"
        report.write_text(
            f"returncode={run.returncode} timed_out={run.timed_out} "
            f"survivors={run.survivors}\n{run.output}"
        )
    return mode, bad, run.elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=int, help="runs per mode")
    parser.add_argument("--parallel", type=int, default=3, help="runs at a time (load matters)")
    parser.add_argument(
        "--modes", default="armed,plain", help="comma-separated: armed, plain (default both)"
    )
    parser.add_argument("--grace", type=float, default=10.0)
    parser.add_argument("--out", type=Path, default=Path("."))
    args = parser.parse_args()
    names = args.modes.split(",")
    if not set(names) <= {"armed", "plain"}:
        parser.error(f"--modes takes armed and/or plain, not {args.modes!r}")
    modes = [name == "armed" for name in names]
    jobs = [(number, armed) for number in range(args.runs) for armed in modes]
    counts: Counter[tuple[str, bool]] = Counter()
    with ThreadPoolExecutor(args.parallel) as pool:
        futures = [pool.submit(one, n, armed, args.grace, args.out) for n, armed in jobs]
        for future in futures:
            mode, bad, elapsed = future.result()
            counts[(mode, bad)] += 1
            print(f"{mode} {'HUNG/FAILED' if bad else 'ok'} {elapsed:.1f}s", flush=True)
    for mode in sorted({mode for mode, _ in counts}):
        bad, total = counts[(mode, True)], counts[(mode, True)] + counts[(mode, False)]
        print(f"{mode}: {bad} of {total} bad")
    return 1 if any(bad for _, bad in counts) else 0


if __name__ == "__main__":
    sys.exit(main())
