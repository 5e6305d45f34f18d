"""The EMA errors keep their public names wherever their code lives in ``compatshim.ema``."""

from __future__ import annotations

import pickle
import warnings

import pytest

torch = pytest.importorskip("torch")

import compatshim.ema as cema  # noqa: E402


def test_the_errors_are_named_by_the_public_package() -> None:
    assert cema.EmaMismatchError.__module__ == "compatshim.ema"
    assert cema.EmaWarning.__module__ == "compatshim.ema"


def test_a_mismatch_from_update_ema_pickles_under_the_public_name() -> None:
    """A mismatch raised across a process boundary (a rank, a worker) unpickles anywhere."""
    ema = torch.nn.Sequential(torch.nn.Linear(2, 2))
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    with pytest.raises(cema.EmaMismatchError) as raised:
        cema.update_ema(ema, model, decay=0.5)
    data = pickle.dumps(raised.value)
    assert b"compatshim.ema\n" in pickle.dumps(raised.value, protocol=2)
    again = pickle.loads(data)
    assert type(again) is cema.EmaMismatchError and str(again) == str(raised.value)


def test_the_warning_category_filters_by_its_public_name() -> None:
    model = torch.nn.Linear(2, 2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.filterwarnings("always", category=cema.EmaWarning)
        cema.update_ema(torch.nn.Linear(2, 2), model, exclude=["nothing.here"])
    assert [w.category for w in caught] == [cema.EmaWarning]
