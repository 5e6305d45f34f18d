"""RestoreReport.moved(): a draw between the restore and the first resumed step is named
(issue 39 item 3).

``iter(loader)`` draws the workers' base seed from torch's CPU generator, even with
``num_workers=0``: built after ``compatshim.rng.load``, it moves the restored stream on, so
the first resumed step differs from the uninterrupted run's while ``report.exact`` is True
(the restore itself was exact). ``report.moved()`` says so; ``compatshim.data.resume`` builds
the iterator without drawing.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import DataLoader, DistributedSampler, TensorDataset  # noqa: E402

import compatshim.data as cd  # noqa: E402
import compatshim.rng as rng  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def _loader() -> DataLoader[tuple[torch.Tensor, ...]]:
    data = TensorDataset(torch.arange(12))
    return DataLoader(data, batch_size=3, sampler=DistributedSampler(data, 1, 0, seed=1))


def test_iter_after_load_is_named_while_the_restore_was_exact(tmp_path: Path) -> None:
    rng.save(tmp_path / "rng.pt")
    report = rng.load(tmp_path / "rng.pt")
    assert report.exact and report.moved() == ()
    iter(_loader())  # the resume order the issue found: the base seed is drawn after the restore
    assert report.exact  # what the report said, and still says, about the restore
    assert report.moved() == ("torch_cpu",)


def test_data_resume_after_load_draws_nothing(tmp_path: Path) -> None:
    loader = _loader()
    position = cd.position(loader, epoch=0, batches=1)
    rng.save(tmp_path / "rng.pt")
    report = rng.load(tmp_path / "rng.pt")
    rest = cd.resume(loader, position)
    assert report.moved() == ()
    next(rest)  # the data itself draws nothing here either
    assert report.moved() == ()


def test_every_generator_set_is_watched() -> None:
    report = rng.restore(rng.capture())
    random.random()
    torch.rand(1)
    assert set(report.moved()) == {"python", "torch_cpu"}
    assert report == rng.restore(rng.capture())  # the marks do not make reports differ
