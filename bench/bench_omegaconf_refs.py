"""Cost of bounding omegaconf node references at load (issue 26, case 11).

    python bench/bench_omegaconf_refs.py   (an env with omegaconf: resume-lightning2.6, zoo-*)

Three contenders on the same in-memory checkpoints, interleaved, medians:
``torch.load(weights_only=False)`` (what a user picks for DictConfig hparams: torch's
weights-only refuses them), ``compatshim.checkpoint.load``, and the same load with the
reference bound switched off (``_interp_size.charge_expansion`` replaced by a no-op), so
"bound / no bound" is what the check costs.
"""

from __future__ import annotations

import io
import json
from typing import Any, Callable

import torch
from _common import interleaved, median


def _files() -> dict[str, bytes]:
    from omegaconf import OmegaConf

    hydra = {
        "name": "run",
        "seed": 7,
        "data": {"root": "/data", "train": "${.root}/train", "val": "${data.root}/val"},
        "model": {"width": 256, "depth": 12, "heads": "${oc.select:model.h,8}"},
        "optim": {"lr": 3e-4, "betas": [0.9, 0.95], "warmup": "${trainer.max_steps}"},
        "trainer": {"max_steps": 1000, "run": "${name}-${seed}", "devices": 1},
        **{f"extra{i}": {"value": i, "ref": "${model.width}"} for i in range(40)},
    }
    many = {
        "root": "/data",
        "name": "run",
        "paths": {f"p{i}": f"${{root}}/{i}/${{..name}}" for i in range(3000)},
    }
    plain = {f"k{i}": {"lr": 0.1 * i, "name": f"layer{i}", "dims": [i, i + 1]} for i in range(1000)}
    weights = {"w": torch.randn(64, 64)}
    out = {}
    for label, content in (
        ("Hydra-style hparams, 48 references", hydra),
        ("3 000 paths, 6 000 references", many),
        ("1 000 sub-configs, no references", plain),
    ):
        buffer = io.BytesIO()
        torch.save({"state_dict": weights, "hyper_parameters": OmegaConf.create(content)}, buffer)
        out[label] = buffer.getvalue()
    return out


def main(repeats: int = 15) -> None:
    try:
        import omegaconf  # noqa: F401
    except ImportError:
        print("### omegaconf reference bound: skipped (omegaconf is not installed here)")
        return
    from compatshim.checkpoint import _omegaconf, load

    real = _omegaconf.charge_expansion

    def unbounded(data: bytes) -> Any:
        _omegaconf.charge_expansion = lambda *args: None  # type: ignore[assignment]
        try:
            return load(io.BytesIO(data))
        finally:
            _omegaconf.charge_expansion = real

    print(f"### omegaconf node-reference bound at load (torch {torch.__version__}, medians)")
    print()
    print(
        "| checkpoint | torch.load (unsafe) | compatshim | no bound | bound / no bound "
        "| compatshim / torch |"
    )
    print("|---|---|---|---|---|---|")
    figures = {}
    for name, data in _files().items():
        contenders: dict[str, Callable[[], object]] = {
            "torch": lambda d=data: torch.load(io.BytesIO(d), weights_only=False),
            "compatshim": lambda d=data: load(io.BytesIO(d)),
            "no bound": lambda d=data: unbounded(d),
        }
        m = {k: median(v) for k, v in interleaved(contenders, repeats).items()}
        ratio = m["compatshim"] / m["no bound"]
        figures[name] = ratio
        print(
            f"| {name}, {len(data) / 1e3:.0f} kB | {m['torch'] * 1e3:.1f} ms "
            f"| {m['compatshim'] * 1e3:.1f} ms | {m['no bound'] * 1e3:.1f} ms | {ratio:.3f} "
            f"| {m['compatshim'] / m['torch']:.2f} |"
        )
    print()
    print(
        f"{repeats} interleaved loads per contender. The bound walks every node once and "
        "follows each reference once (memoized); refused files (2**30 copies) stop in "
        "milliseconds instead of running omegaconf's resolution."
    )
    print(json.dumps({"bound_over_no_bound": figures}))


if __name__ == "__main__":
    main()
