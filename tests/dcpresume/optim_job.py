"""The optimizer runs the cross-release tests share: the same model, data and steps on any torch.

``python -m tests.dcpresume.optim_job OUT`` (run under an older torch, e.g. the
``dcpresume-torch2.4`` env) writes, per optimizer, the state after ``SAVED``
steps as ``torch.save`` (``plain.pt``) and as DCP folders (``dcp-nested``,
``dcp-flat``: ``flatten_optimizer_state_dict``), and the parameters one step
later (``next.pt``): the uninterrupted run a resume must continue.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

SAVED = 2
OPTIMIZERS = {  # weight decay large enough that coupled vs decoupled shows in one step
    "adamw": lambda params: torch.optim.AdamW(params, lr=0.05, weight_decay=0.5),
    "adam": lambda params: torch.optim.Adam(params, lr=0.05, weight_decay=0.5),
}


def build(name: str) -> tuple[torch.nn.Module, Any]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))
    return model, OPTIMIZERS[name](model.parameters())


def step(model: torch.nn.Module, optimizer: Any, index: int) -> None:
    gen = torch.Generator().manual_seed(100 + index)
    x, y = torch.randn(5, 4, generator=gen), torch.randn(5, 2, generator=gen)
    optimizer.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    optimizer.step()


def write(out: Path) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    for name in OPTIMIZERS:
        folder = out / name
        folder.mkdir(parents=True, exist_ok=True)
        model, optimizer = build(name)
        for index in range(SAVED):
            step(model, optimizer, index)
        torch.save({"model": model.state_dict(), "optim": optimizer.state_dict()},
                   folder / "plain.pt")
        for form, flat in (("dcp-nested", False), ("dcp-flat", True)):
            options = StateDictOptions(flatten_optimizer_state_dict=flat)
            model_sd, optim_sd = get_state_dict(model, optimizer, options=options)
            dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=folder / form)
        step(model, optimizer, SAVED)
        torch.save(model.state_dict(), folder / "next.pt")
    (out / "TORCH_VERSION").write_text(torch.__version__.split("+")[0] + "\n")


if __name__ == "__main__":
    write(Path(sys.argv[1]))
