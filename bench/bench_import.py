"""Import overhead: ``import compatshim.auto`` over a bare interpreter, and ``import torch``
with compatshim's post-import hooks armed vs not.

Goals (issue 2): auto adds < 5 ms and imports no framework; ``import torch`` with
hooks armed is <= 1.02x of unarmed. Each sample is a fresh interpreter; the
contenders alternate so machine noise hits both alike. The import time itself is
measured inside the child with ``perf_counter`` so interpreter start-up noise
does not drown a millisecond-sized difference.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from _common import median, table

CHILD = r"""
import sys, time, json
t0 = time.perf_counter()
{armed}
t1 = time.perf_counter()
{target}
t2 = time.perf_counter()
print(json.dumps({{"auto": t1 - t0, "target": t2 - t1,
                   "torch_loaded_by_auto": {torch_check}}}))
"""


def _child(armed: bool, target: str) -> dict[str, float]:
    code = CHILD.format(
        armed="import compatshim.auto" if armed else "pass",
        target=target,
        torch_check="False" if target else "'torch' in sys.modules",
    )
    env = dict(os.environ)
    env.pop("COMPATSHIM_AUTO", None)
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


HOOK_SHARE = r"""
import json, time
from compatshim._engine import registry
original = registry._on_import
spent = []
def timed(*args):
    start = time.perf_counter()
    original(*args)
    spent.append(time.perf_counter() - start)
registry._on_import = timed
import compatshim.auto
start = time.perf_counter()
import torch
print(json.dumps({"hooks": sum(spent), "total": time.perf_counter() - start}))
"""


def _hook_share() -> dict[str, float]:
    """Time spent inside compatshim's hooks during ``import torch``, measured in-process."""
    out = subprocess.run(
        [sys.executable, "-c", HOOK_SHARE], capture_output=True, text=True, check=True
    )
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main(repeats: int = 25) -> dict[str, float]:
    auto = [_child(True, "")["auto"] for _ in range(repeats)]
    leaked = _child(True, "")["torch_loaded_by_auto"]
    has_torch = (
        subprocess.run([sys.executable, "-c", "import torch"], capture_output=True).returncode == 0
    )
    torch_plain: list[float] = []
    torch_armed: list[float] = []
    if has_torch:
        for _ in range(repeats):
            torch_plain.append(_child(False, "import torch")["target"])
            torch_armed.append(_child(True, "import torch")["target"])
    rows = [
        [
            "`import compatshim.auto` (added to a bare interpreter)",
            f"{median(auto) * 1e3:.2f} ms",
            "goal < 5 ms",
            f"torch imported: {bool(leaked)}",
        ]
    ]
    ratios = {"auto_import_ms": median(auto) * 1e3}
    if has_torch:
        ratio = median(torch_armed) / median(torch_plain)
        ratios["import_torch_armed_ratio"] = ratio
        rows.append(
            [
                "`import torch`, hooks armed / not armed",
                f"{ratio:.3f}x",
                "goal <= 1.02x",
                f"medians {median(torch_armed) * 1e3:.0f} ms / {median(torch_plain) * 1e3:.0f} ms"
                " (whole-import noise here is a few %)",
            ]
        )
        shares = [_hook_share() for _ in range(5)]
        hook_ms = median([s["hooks"] for s in shares]) * 1e3
        share = median([s["hooks"] / s["total"] for s in shares])
        ratios["hook_share_of_import_torch"] = share
        rows.append(
            [
                "time inside compatshim's hooks during `import torch`",
                f"{hook_ms:.1f} ms",
                "",
                f"{share:.1%} of the import (probe + fix + confirm, measured in-process)",
            ]
        )
    print(f"### Import overhead ({repeats} fresh interpreters each, medians)\n")
    print(table(["measure", "result", "goal", "detail"], rows))
    return ratios


if __name__ == "__main__":
    main()
