"""The optimizer runs the cross-release tests share: the same model, data and steps on any torch.

``python -m tests.dcpresume.optim_job OUT`` (run under each release the tests
resume from: ``fixtures/torch<version>`` was written in the ``dcpresume-torch2.2``,
``dcpresume-torch2.4`` and ``dcpresume-torch2.15-py3.12`` envs) writes, per
optimizer, the state after ``SAVED`` steps as ``torch.save`` (``plain.pt``) and as
DCP folders (``dcp-nested``, and ``dcp-flat`` with ``flatten_optimizer_state_dict``
where the release has it: 2.3+), and the parameters one step later (``next.pt``):
the uninterrupted run a resume must continue.

torch 2.2's ``dcp.save``/``dcp.load`` take no ``checkpoint_id`` and need a process
group (``save`` also runs alone with ``no_dist=True``; ``load`` gathers keys even
then): :func:`dcp_kwargs` and :func:`one_rank_group` stand for that difference.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

SAVED = 2
FORMS = {"dcp-nested": False, "dcp-flat": True}  # folder -> flatten_optimizer_state_dict
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


def has_flatten() -> bool:
    """Whether this torch's ``StateDictOptions`` has ``flatten_optimizer_state_dict`` (2.3+)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return "flatten_optimizer_state_dict" in StateDictOptions.__dataclass_fields__


def grouped() -> bool:
    """Whether this torch's ``dcp.load`` needs a process group (2.2: no ``checkpoint_id``)."""
    import inspect

    import torch.distributed.checkpoint as dcp

    return "checkpoint_id" not in inspect.signature(dcp.load).parameters


def dcp_kwargs(folder: Path, *, save: bool = False) -> dict[str, Any]:
    """Where ``dcp.save``/``dcp.load`` find ``folder`` on this torch."""
    import torch.distributed.checkpoint as dcp

    if not grouped():
        return {"checkpoint_id": folder}
    if save:
        return {"storage_writer": dcp.FileSystemWriter(folder), "no_dist": True}
    return {"storage_reader": dcp.FileSystemReader(folder)}


@contextlib.contextmanager
def one_rank_group(store: Path) -> Iterator[None]:
    """A one-rank gloo group where this torch's ``dcp.load`` needs one (2.2), else nothing."""
    import torch.distributed as dist

    if not grouped() or dist.is_initialized():
        yield
        return
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    try:
        yield
    finally:
        # torch 2.2's ProcessGroupGloo destructor joins its worker holding the GIL while the
        # worker may still wait for the GIL to free the last collective's tensors (seen hung
        # in the test suite under load): let the worker finish first
        dist.barrier()
        time.sleep(0.2)
        dist.destroy_process_group()


def write(out: Path) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    forms = FORMS if has_flatten() else {"dcp-nested": False}
    for name in OPTIMIZERS:
        folder = out / name
        folder.mkdir(parents=True, exist_ok=True)
        model, optimizer = build(name)
        for index in range(SAVED):
            step(model, optimizer, index)
        torch.save(
            {"model": model.state_dict(), "optim": optimizer.state_dict()}, folder / "plain.pt"
        )
        for form, flat in forms.items():
            options = StateDictOptions(flatten_optimizer_state_dict=True) if flat else None
            model_sd, optim_sd = get_state_dict(model, optimizer, options=options)
            dcp.save({"model": model_sd, "optim": optim_sd}, **dcp_kwargs(folder / form, save=True))
        step(model, optimizer, SAVED)
        torch.save(model.state_dict(), folder / "next.pt")
    (out / "TORCH_VERSION").write_text(torch.__version__.split("+")[0] + "\n")


if __name__ == "__main__":
    write(Path(sys.argv[1]))
