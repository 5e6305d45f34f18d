"""Import overhead: ``import compatshim.auto`` over a bare interpreter, and ``import torch``
with compatshim's post-import hooks armed vs not.

Goals (issue 18): ``import compatshim.auto`` takes < 5 ms and imports no framework;
an armed ``import torch`` adds <= 5 ms over a plain one. Measured as an installed
wheel runs: compatshim's bytecode is compiled first, and the children may write
bytecode (``PYTHONDONTWRITEBYTECODE`` is dropped), so no sample compiles source.

Each sample is a fresh interpreter; the contenders alternate so machine noise
hits both alike. The first row is the import measured inside the child; the second
is the whole process as the operating system accounts it (user + system CPU of
``python -c "import compatshim.auto"`` minus that of the ``python -c pass`` run beside
it, paired), which also counts unmarshalling and interpreter teardown. The third is
what the start-up hook (``compatshim_auto.pth``) costs every process of the
environment that sets no ``COMPATSHIM_*`` variable: reading two variables and one
pass over the environment's names for a misspelt one. Times are taken inside the child,
as CPU time (``time.process_time``: what the import costs this process, unaffected by
other jobs on a shared machine; for the hooks, ``time.thread_time`` of the importing
thread, since the OpenBLAS workers numpy's import starts spin meanwhile and
``process_time`` would count their spinning as the hooks' cost) and wall time
(``perf_counter``: inflated whenever the machine is busy). A whole ``import torch``
(~1-2 s) varies by more than 5 ms between interpreters, so the armed/plain difference of
whole imports is shown for context only; the goal is judged on the time spent inside
compatshim's hooks during ``import torch``, measured in-process (probe, fix and
confirmation of every patch whose target torch imports).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from _common import compile_compatshim, median, table

CHILD = r"""
import sys, time, json
c0, t0 = time.process_time(), time.perf_counter()
{armed}
c1, t1 = time.process_time(), time.perf_counter()
{target}
c2, t2 = time.process_time(), time.perf_counter()
print(json.dumps({{"auto_cpu": c1 - c0, "auto_wall": t1 - t0,
                   "target_cpu": c2 - c1, "target_wall": t2 - t1,
                   "torch_loaded_by_auto": {torch_check}}}))
"""

HOOK_SHARE = r"""
import json, time
from compatshim._engine import registry
original = registry._on_import
spent = []
def timed(*args):  # the hooks run in the importing thread: its own CPU time, not the
    cpu, wall = time.thread_time(), time.perf_counter()  # process's (numpy's BLAS threads spin)
    original(*args)
    spent.append((time.thread_time() - cpu, time.perf_counter() - wall))
registry._on_import = timed
import compatshim.auto
before = len(spent)  # hooks run by install() itself belong to the auto import
cpu, wall = time.process_time(), time.perf_counter()
import torch
total_cpu, total_wall = time.process_time() - cpu, time.perf_counter() - wall
inside = spent[before:]
print(json.dumps({"hooks_cpu": sum(c for c, _ in inside), "hooks_wall": sum(w for _, w in inside),
                  "total_cpu": total_cpu, "total_wall": total_wall, "hooks": len(inside)}))
"""


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPATSHIM_")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def _run(code: str) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=_env()
    )
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def _child(armed: bool, target: str) -> dict[str, float]:
    return _run(
        CHILD.format(
            armed="import compatshim.auto" if armed else "pass",
            target=target,
            torch_check="False" if target else "'torch' in sys.modules",
        )
    )


HOOK = r"""
import json, sys, timeit
sys.path.insert(0, {folder!r})  # the hook beside the package measured (an editable install
sys.modules.pop("compatshim_auto", None)  # keeps an older copy in site-packages, run by now)
import compatshim_auto
n = 2000
print(json.dumps({{"hook_s": timeit.timeit(compatshim_auto.start, number=n) / n}}))
"""


def _ms(values: list[float]) -> str:
    return f"{median(values) * 1e3:.2f} ms"


def _whole(code: str) -> tuple[float, float]:
    """(CPU seconds as the OS accounts the finished child, wall seconds) of ``python -c``."""
    import resource
    import time

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, env=_env(), capture_output=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall


def _whole_process(repeats: int) -> list[object]:
    """The whole-process row: paired differences against a bare interpreter."""
    cpu: list[float] = []
    wall: list[float] = []
    for _ in range(repeats):
        armed, bare = _whole("import compatshim.auto"), _whole("pass")
        cpu.append(armed[0] - bare[0])
        wall.append(armed[1] - bare[1])
    return [
        "whole `python -c 'import compatshim.auto'` minus `python -c pass` (paired)",
        f"{_ms(cpu)} CPU",
        "< 5 ms",
        f"wall {_ms(wall)}; OS accounting, {repeats} pairs",
    ]


def main(repeats: int = 25) -> dict[str, float]:
    package = compile_compatshim(_env())
    _child(True, "")  # warm the file cache once
    auto = [_child(True, "") for _ in range(repeats)]
    leaked = any(sample["torch_loaded_by_auto"] for sample in auto)
    has_torch = (
        subprocess.run([sys.executable, "-c", "import torch"], capture_output=True).returncode == 0
    )
    auto_cpu = [s["auto_cpu"] for s in auto]
    rows = [
        [
            "`import compatshim.auto` (added to a bare interpreter)",
            f"{_ms(auto_cpu)} CPU",
            "< 5 ms",
            f"wall {_ms([s['auto_wall'] for s in auto])}; torch imported: {leaked}",
        ]
    ]
    if sys.platform != "win32":  # the resource module
        rows.append(_whole_process(repeats * 2))
    hook = [_run(HOOK.format(folder=os.path.dirname(package)))["hook_s"] for _ in range(5)]
    rows.append(
        [
            "start-up hook, a process with no `COMPATSHIM_*` variable",
            f"{median(hook) * 1e6:.1f} us",
            "",
            "every interpreter of the environment pays this (the misspelt-name check included)",
        ]
    )
    figures = {"auto_import_cpu_ms": median(auto_cpu) * 1e3, "hook_us": median(hook) * 1e6}
    if has_torch:
        plain: list[dict[str, float]] = []
        armed: list[dict[str, float]] = []
        for _ in range(repeats):
            plain.append(_child(False, "import torch"))
            armed.append(_child(True, "import torch"))
        shares = [_run(HOOK_SHARE) for _ in range(repeats)]
        hooks_cpu = [s["hooks_cpu"] for s in shares]
        figures["hooks_in_import_torch_cpu_ms"] = median(hooks_cpu) * 1e3
        plain_cpu = median([s["target_cpu"] for s in plain])
        armed_cpu = median([s["target_cpu"] for s in armed])
        figures["import_torch_armed_ratio_cpu"] = armed_cpu / plain_cpu
        rows.append(
            [
                "time inside compatshim's hooks during `import torch`",
                f"{_ms(hooks_cpu)} CPU (importing thread)",
                "<= 5 ms added",
                f"wall {_ms([s['hooks_wall'] for s in shares])}; "
                f"{median([s['hooks'] for s in shares]):.0f} hooks (probe, fix, confirmation), "
                f"{median([s['hooks_cpu'] / s['total_cpu'] for s in shares]):.2%} of the import",
            ]
        )
        rows.append(
            [
                "whole `import torch`, armed / plain (context: noise-bound)",
                f"{armed_cpu / plain_cpu:.3f}x CPU",
                "",
                f"CPU medians {armed_cpu * 1e3:.0f} ms / {plain_cpu * 1e3:.0f} ms; wall medians "
                f"{median([s['target_wall'] for s in armed]) * 1e3:.0f} ms / "
                f"{median([s['target_wall'] for s in plain]) * 1e3:.0f} ms",
            ]
        )
    print(f"### Import overhead ({repeats} fresh interpreters each, medians)\n")
    print(table(["measure", "result", "goal", "detail"], rows))
    return figures


if __name__ == "__main__":
    main()
