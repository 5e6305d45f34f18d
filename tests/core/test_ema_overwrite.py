"""``torch.__future__.set_overwrite_module_params_on_conversion(True)``: ``.to()`` / ``.double()``
put new Parameter objects into ``module._parameters`` without any hook; the EMA must follow
the model's new parameters, not the orphaned ones."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from compatshim.ema import update_ema  # noqa: E402


@pytest.fixture
def overwrite() -> object:
    future = torch.__future__
    before = future.get_overwrite_module_params_on_conversion()
    future.set_overwrite_module_params_on_conversion(True)
    yield
    future.set_overwrite_module_params_on_conversion(before)


def test_ema_follows_parameters_replaced_by_a_conversion(overwrite: object) -> None:
    model = torch.nn.Linear(3, 2)
    ema = torch.nn.Linear(3, 2)
    ema.load_state_dict(model.state_dict())
    update_ema(ema, model, decay=0.5)  # the pairing is cached here
    old = model.weight
    model.double()
    ema.double()
    assert model.weight is not old  # the flag's effect: a new Parameter object
    with torch.no_grad():
        model.weight.add_(1.0)
    expected = ema.weight.detach().clone() * 0.5 + model.weight.detach() * 0.5
    update_ema(ema, model, decay=0.5)
    torch.testing.assert_close(ema.weight.detach(), expected)
