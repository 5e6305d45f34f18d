"""compatshim.data on real gloo ranks: DDP, dropout 0.1, DistributedSampler, compatshim.rng.

2 ranks train 3 epochs of 36 samples (3 per rank and step) and save at epoch 1, step 2: the
model and optimizer (torch.save), every rank's RNG (compatshim.rng.save) and the data
position (compatshim.data.position). Resumed at 2 ranks, every later step's loss and
samples equal the uninterrupted run's, whether compatshim.data.resume comes before or after
compatshim.rng.load; ``iter(loader)`` after ``rng.load`` (the issue-39 ordering bug) is shown
to differ while the RNG report says exact. Resumed at 1 and 3 ranks, the epoch's samples are
each seen exactly once. Four ``run_ranks`` calls (8 processes): the machine has 2 cores.
"""

from __future__ import annotations

import itertools
import warnings
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from tests.harness.dist import run_ranks  # noqa: E402

pytestmark = pytest.mark.dist
TIMEOUT = 240.0
SAMPLES, BATCH, SAVE_EPOCH, SAVE_STEP, EPOCHS = 36, 3, 1, 2, 3


class Numbers(torch.utils.data.Dataset):  # type: ignore[misc]
    """Sample ``i`` is (i, a fixed input, a class): which samples a step saw is its batch's ids."""

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index: int) -> tuple[int, Any, int]:
        return index, torch.sin(torch.arange(8.0) * (index + 1)), index % 3


def build(batch: int = BATCH) -> tuple[Any, Any, Any, Any, Any, Any]:
    """DDP with dropout 0.1, its twin without dropout (the same weights), both optimizers."""
    torch.manual_seed(0)  # the same initial weights on every rank and every run
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Dropout(0.1), torch.nn.Linear(16, 3)
    )
    plain = torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Identity(), torch.nn.Linear(16, 3)
    )
    plain.load_state_dict(model.state_dict())
    ddp, twin = (torch.nn.parallel.DistributedDataParallel(m) for m in (model, plain))
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (model, plain)]
    sampler = torch.utils.data.DistributedSampler(Numbers(), shuffle=True, seed=5)
    loader = torch.utils.data.DataLoader(Numbers(), batch_size=batch, sampler=sampler)
    return ddp, twin, optimizers[0], optimizers[1], sampler, loader


def _train(ddp: Any, optimizer: Any, batch: Any) -> Any:
    _, inputs, targets = batch
    optimizer.zero_grad()
    loss = torch.nn.functional.cross_entropy(ddp(inputs), targets)
    loss.backward()
    optimizer.step()
    return loss.detach()


def step(models: tuple[Any, ...], batch: Any) -> dict[str, Any]:
    """One step of both models: this rank's samples and loss, and the twin's global mean loss."""
    ddp, twin, optimizer, twin_optimizer = models
    loss = _train(ddp, optimizer, batch)
    mean = _train(twin, twin_optimizer, batch) / torch.distributed.get_world_size()
    torch.distributed.all_reduce(mean)
    return {"ids": batch[0].tolist(), "loss": loss.item(), "global_plain": mean.item()}


def uninterrupted(rank: int, world_size: int, folder: str) -> list[dict[str, Any]]:
    """Train every epoch; save at (SAVE_EPOCH, SAVE_STEP); return every step from epoch 1 on."""
    import compatshim.data
    import compatshim.rng

    *models, sampler, loader = build()
    torch.manual_seed(100 + rank)  # per-rank dropout masks
    steps = []
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        for index, batch in enumerate(loader):
            if (epoch, index) == (SAVE_EPOCH, SAVE_STEP):
                data = compatshim.data.position(loader, epoch=epoch, batches=index)
                if rank == 0:
                    state = {
                        f"m{i}": (m.module if i < 2 else m).state_dict()
                        for i, m in enumerate(models)
                    }
                    torch.save({**state, "data": data}, f"{folder}/train.pt")
                compatshim.rng.save(f"{folder}/rng.pt")
                steps.append({"position": data})
            if epoch >= SAVE_EPOCH:
                steps.append({"epoch": epoch, "index": index, **step(tuple(models), batch)})
            else:
                step(tuple(models), batch)
    return steps


def _restored(folder: str, batch: int = BATCH) -> tuple[tuple[Any, ...], Any, Any, dict[str, Any]]:
    *models, sampler, loader = build(batch)
    saved = torch.load(f"{folder}/train.pt", weights_only=True)
    for index, model in enumerate(models):
        (model.module if index < 2 else model).load_state_dict(saved[f"m{index}"])
    return tuple(models), sampler, loader, saved["data"]


def _rng_load(folder: str) -> bool:
    import compatshim.rng

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", compatshim.rng.RNGStateWarning)  # 1 or 3 ranks: derived
        return compatshim.rng.load(f"{folder}/rng.pt").exact


def _train_on(models: tuple[Any, ...], sampler: Any, loader: Any, first: Any) -> list[Any]:
    """The rest of the saved epoch from ``first``, then the later epochs as the run does."""
    steps = [{"epoch": SAVE_EPOCH, **step(models, batch)} for batch in first]
    for epoch in range(SAVE_EPOCH + 1, EPOCHS):
        sampler.set_epoch(epoch)
        steps += [{"epoch": epoch, **step(models, batch)} for batch in loader]
    return steps


def resumed_same_size(rank: int, world_size: int, folder: str) -> dict[str, Any]:
    """Three resumes of the same checkpoint on 2 ranks: the two orders of the API, and the bug."""
    import compatshim.data

    out: dict[str, Any] = {}
    models, sampler, loader, data = _restored(folder)
    out["rng_exact"] = _rng_load(folder)
    rest = compatshim.data.resume(loader, data)  # after rng.load: the risky order
    out["resume_after_rng"] = _train_on(models, sampler, loader, rest)
    out["skipped"] = rest.skipped

    models, sampler, loader, data = _restored(folder)
    rest = compatshim.data.resume(loader, data)
    _rng_load(folder)
    out["resume_before_rng"] = _train_on(models, sampler, loader, rest)

    # the ordering bug: the iterator built after rng.load draws its base seed from the
    # restored generator (what the user wrote; skipping the batches is not the point)
    models, sampler, loader, data = _restored(folder)
    out["bug_rng_exact"] = _rng_load(folder)
    sampler.set_epoch(data["epoch"])
    plain = itertools.islice(iter(loader), data["batches"], None)
    out["iter_after_rng"] = step(models, next(plain))
    return out


def resumed_other_size(rank: int, world_size: int, folder: str) -> dict[str, Any]:
    """The rest of the run at this world size, with the same global batch (6 samples a step)."""
    import compatshim.data

    models, sampler, loader, data = _restored(folder, batch=2 * BATCH // world_size)
    _rng_load(folder)
    rest = compatshim.data.resume(loader, data)
    first = next(rest)
    again = compatshim.data.position(loader, epoch=data["epoch"], batches=1)
    steps = _train_on(models, sampler, loader, itertools.chain([first], rest))
    return {
        "steps": steps,
        "again": again,
        "repeated": list(rest.repeated),
        "dropped": list(rest.dropped),
        "batches": len(rest),
    }


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[list[dict[str, Any]]]]:
    folder = tmp_path_factory.mktemp("data_position")
    return folder, run_ranks(uninterrupted, 2, args=(str(folder),), timeout=TIMEOUT)


def after_save(run: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The uninterrupted steps from the save on, without their step numbers."""
    at = next(i for i, s in enumerate(run) if "position" in s)
    return [{k: v for k, v in s.items() if k != "index"} for s in run[at + 1 :]]


def seen_before_save(runs: list[list[dict[str, Any]]]) -> list[int]:
    return [
        i
        for run in runs
        for s in run
        if "position" not in s
        for i in s["ids"]
        if s["epoch"] == SAVE_EPOCH and s["index"] < SAVE_STEP
    ]


@pytest.mark.timeout(600)
def test_same_world_size_continues_bit_for_bit(saved: tuple[Path, Any]) -> None:
    folder, runs = saved
    positions = [next(s["position"] for s in run if "position" in s) for run in runs]
    assert positions[0] == positions[1]  # one copy serves every rank (as DCP keeps it)
    results = run_ranks(resumed_same_size, 2, args=(str(folder),), timeout=TIMEOUT)
    for rank, result in enumerate(results):
        expected = after_save(runs[rank])
        assert result["rng_exact"] and result["skipped"] == SAVE_STEP
        assert result["resume_after_rng"] == expected  # samples, order and dropout masks
        assert result["resume_before_rng"] == expected
        # the bug it replaces: same samples, another first loss, and the report said exact
        bug = result["iter_after_rng"]
        assert result["bug_rng_exact"] and bug["ids"] == expected[0]["ids"]
        assert bug["loss"] != expected[0]["loss"]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("world_size", [1, 3])
def test_another_world_size_sees_each_sample_once(saved: tuple[Path, Any], world_size: int) -> None:
    folder, runs = saved
    results = run_ranks(resumed_other_size, world_size, args=(str(folder),), timeout=TIMEOUT)
    rest = [[s for s in r["steps"] if s["epoch"] == SAVE_EPOCH] for r in results]
    seen = seen_before_save(runs) + [i for steps in rest for s in steps for i in s["ids"]]
    assert sorted(seen) == list(range(SAMPLES))  # 12 before the save, 24 after: once each
    assert all(r["repeated"] == r["dropped"] == [] for r in results)
    assert len({r["batches"] for r in results}) == 1  # every rank steps as often
    again = [r["again"] for r in results]
    assert all(a == again[0] for a in again)
    assert again[0]["consumed"] == 12 + 2 * BATCH and again[0]["world_size"] == world_size
    # without per-rank randomness, the same global batch gives the same steps within rounding,
    # through the rest of the saved epoch and the next one (each step: the same 6 samples)
    expected = [s["global_plain"] for s in after_save(runs[0])]
    got = [s["global_plain"] for s in results[0]["steps"]]
    assert got == pytest.approx(expected, rel=1e-5, abs=1e-6)
    merged = [sorted(i for r in results for i in r["steps"][n]["ids"]) for n in range(len(got))]
    uninterrupted = [
        sorted(a["ids"] + b["ids"]) for a, b in zip(after_save(runs[0]), after_save(runs[1]))
    ]
    assert merged == uninterrupted
