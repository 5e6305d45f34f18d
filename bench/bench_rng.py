"""RNG state capture / restore / save / load: compatshim.rng against what users write today.

The alternative is the transformers-Trainer-style snippet most projects copy:
a dict of ``random.getstate()``, ``np.random.get_state()`` and
``torch.get_rng_state()``, written with ``torch.save`` and read back with
``torch.load(weights_only=False)`` (``weights_only=True`` refuses the numpy
entry on torch >= 2.6). compatshim does more per call (validation of every
part before any is set, a rollback snapshot, the restricted unpickler, an
fsynced atomic rename), so the ratios say what that safety costs.

Contenders alternate in one process; medians over ``repeats`` calls.
``main()`` prints a Markdown table and returns ratios (compatshim / ad hoc).
"""

from __future__ import annotations

import random
import tempfile
from pathlib import Path
from typing import Any, Callable

from _common import interleaved, median, ms, table


def ad_hoc_capture() -> dict[str, Any]:
    import numpy as np
    import torch

    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "cpu": torch.get_rng_state(),
    }


def ad_hoc_restore(state: dict[str, Any]) -> None:
    import numpy as np
    import torch

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["cpu"])


def main(repeats: int = 40) -> dict[str, float]:
    import torch

    import compatshim.rng as rng

    folder = Path(tempfile.mkdtemp(prefix="bench_rng_"))
    ours_file, theirs_file = folder / "rng.pt", folder / "rng_state.pth"
    state, plain = rng.capture(), ad_hoc_capture()
    rng.save(ours_file)
    torch.save(plain, theirs_file)

    def theirs_load() -> None:
        ad_hoc_restore(torch.load(theirs_file, weights_only=False))

    pairs: dict[str, tuple[Callable[[], object], Callable[[], object]]] = {
        "capture": (rng.capture, ad_hoc_capture),
        "restore": (lambda: rng.restore(state), lambda: ad_hoc_restore(plain)),
        "save": (lambda: rng.save(ours_file), lambda: torch.save(ad_hoc_capture(), theirs_file)),
        "load (read + restore)": (lambda: rng.load(ours_file), theirs_load),
        "read a transformers file": (
            lambda: rng.read(theirs_file),
            lambda: torch.load(theirs_file, weights_only=False),
        ),
    }
    rows, ratios = [], {}
    for name, (ours, theirs) in pairs.items():
        samples = interleaved({"ours": ours, "theirs": theirs}, repeats)
        a, b = median(samples["ours"]), median(samples["theirs"])
        ratios[name] = a / b
        rows.append((name, ms(a), ms(b), f"{a / b:.2f}x"))
    print("## compatshim.rng vs the ad-hoc transformers-style dict + torch.save/torch.load\n")
    print(table(("operation", "compatshim.rng", "ad hoc", "ratio"), rows))
    print(
        "\nAd hoc does no validation, no rollback, a full unpickle and a non-atomic write; "
        "compatshim's save also fsyncs the file and its folder."
    )
    for path in folder.iterdir():
        path.unlink()
    folder.rmdir()
    return ratios


if __name__ == "__main__":
    main()
