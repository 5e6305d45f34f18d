"""Optimizer state saved under one torch release resumes under the running one (issue 25 item 3).

``fixtures/torch<release>`` were written by ``python -m tests.dcpresume.optim_job
FOLDER`` under torch 2.2.2 (the oldest with DCP's ``get_state_dict``; no
``flatten_optimizer_state_dict``, so no ``dcp-flat``), 2.4.1 and 2.15.0: AdamW and
Adam after two steps, as ``torch.save`` and as DCP folders (nested and flattened
optimizer state), and the parameters one uninterrupted step later. Every fixture is
resumed under the running torch, forwards and back, and the next step must equal
the uninterrupted one. Measured on 2.2.2, 2.4.1, 2.5.1, 2.11.0 and 2.15.0:

- a plain ``load_state_dict`` of ``torch.save``'d state needs nothing, either way;
- a plain ``dcp.load`` fails exactly where the running release expects a param-group
  key the saving one lacked (2.2.2 or 2.4.1 -> 2.15: ``Missing key in checkpoint
  state_dict: ...decoupled_weight_decay``, nested and flattened) until
  ``compatshim.optim.load_dcp``; every other pair (2.2.2 <-> 2.4.1/2.5.1, and 2.15 ->
  2.2.2/2.4.1/2.5.1, where the extra key is left in the checkpoint) needs nothing;
- back to 2.2.2, torch refuses every DCP folder written by 2.3+: its ``.metadata``
  names ``torch.distributed.checkpoint.metadata._MEM_FORMAT_ENCODING`` (2.3's home of
  ``TensorProperties``' memory-format enum), which 2.2's ``pickle.load`` cannot find;
  and it has no ``flatten_optimizer_state_dict`` to ask for a flattened template;
- torch 2.3 to 2.13 cannot read a 2.15 ``.metadata`` (``TensorProperties`` pickles one
  more field): torch's reader says "too many values to unpack", but ``dcp.load`` on
  torch 2.9 to 2.11 says only "metadata is None" until compatshim's
  ``torch-dcp-metadata-error`` puts the reason back (run on 2.11.0).
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed.checkpoint.state_dict")  # torch >= 2.2

import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint.state_dict import (  # noqa: E402
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)

import compatshim  # noqa: E402
from compatshim.optim import OptimizerStateError, adapt_state_dict, load_dcp  # noqa: E402
from compatshim.patches.torch_dcp_metadata_error import probe  # noqa: E402
from tests.dcpresume.optim_job import (  # noqa: E402
    FORMS,
    OPTIMIZERS,
    SAVED,
    build,
    dcp_kwargs,
    has_flatten,
    one_rank_group,
    step,
)

pytestmark = pytest.mark.timeout(120)
FIXTURES = Path(__file__).parent / "fixtures"


def _version(release: str) -> tuple[int, ...]:
    return tuple(map(int, release.split(".")))


RELEASES = sorted((p.name.removeprefix("torch") for p in FIXTURES.glob("torch*")), key=_version)
CASES = [
    (release, name, form)
    for release in RELEASES
    for name in sorted(OPTIMIZERS)
    for form in sorted(FORMS)
    if (FIXTURES / f"torch{release}" / name / form).is_dir()
]
# torch releases whose Adam/AdamW param groups hold a key 2.4.1's lack (2.7 added one)
NEWER_KEYS = "decoupled_weight_decay" in torch.optim.AdamW([torch.zeros(1)]).defaults
NO_FLATTEN = "this torch has no flatten_optimizer_state_dict (2.3+)"
RUNNING = _version(torch.__version__.split("+")[0])
_METADATA = sys.modules["torch.distributed.checkpoint.metadata"]
# a .metadata written by 2.3+ names this enum; torch 2.2 has it elsewhere, under another name
ENCODING = hasattr(_METADATA, "_MEM_FORMAT_ENCODING")
# TensorProperties pickles 6 fields (strides) from 2.14 or 2.15 (2.13.0: 5); older ones take 5
STRIDES = "strides" in _METADATA.TensorProperties.__dataclass_fields__
WHY_PATCH = "torch-dcp-metadata-error"
# whether the running torch's DCP load drops why its .metadata could not be read (2.9-2.11)
DROPS_WHY = probe(sys.modules["torch.distributed.checkpoint.state_dict_loader"])


def _refused_by_torch(release: str, load: Any, *, plain: bool = False) -> bool:
    """Whether this torch cannot read ``release``'s ``.metadata``; if so, check it says why
    (``plain``: ``load`` is torch's own ``dcp.load``)."""
    if not ENCODING and _version(release) >= (2, 3):
        why = "_MEM_FORMAT_ENCODING"  # AttributeError in pickle.load
    elif not STRIDES and _version(release) > (2, 13):
        why = "too many values to unpack"  # TensorProperties.__setstate__
    else:
        return False
    if plain and DROPS_WHY:  # torch 2.9-2.11 say only this; compatshim's patch says why
        with pytest.raises(BaseException, match="metadata is None"):
            load()
        compatshim.install(include=[WHY_PATCH])
        try:
            with pytest.raises(BaseException, match=why):
                load()
        finally:
            compatshim.uninstall([WHY_PATCH])
        return True
    with pytest.raises(BaseException, match=why):  # DCP wraps it in its own BaseException
        load()
    return True


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The one-rank gloo group torch 2.2's ``dcp.load`` needs (nothing on 2.3+), one per
    module: each teardown is a chance for 2.2's gloo deadlock (see ``one_rank_group``)."""
    with one_rank_group(tmp_path_factory.mktemp("group") / "store"):
        yield


def _folder(release: str, name: str, form: str = "") -> Path:
    return FIXTURES / f"torch{release}" / name / form


def _added_keys(release: str, name: str) -> set[str]:
    """Param-group keys the running release expects and ``release``'s save lacks."""
    saved = torch.load(_folder(release, name) / "plain.pt", weights_only=True)
    _, optimizer = build(name)
    return set(optimizer.defaults) - set(saved["optim"]["param_groups"][0])


def _missing_in_checkpoint(release: str, name: str, folder: Path) -> set[str]:
    """Added keys a DCP folder lacks: 2.3+ save param groups key by key; torch 2.2 saved
    the list as one item, which loads whole (torch's ``load_state_dict`` then fills it)."""
    saved = dcp.FileSystemReader(folder).read_metadata().state_dict_metadata
    return set() if "optim.param_groups" in saved else _added_keys(release, name)


def _resume_and_step(folder: Path, model: Any, optimizer: Any) -> None:
    step(model, optimizer, SAVED)
    want = torch.load(folder / "next.pt", weights_only=True)
    got = model.state_dict()
    for key in want:  # the next step equals the uninterrupted run under the saving torch
        torch.testing.assert_close(got[key], want[key], rtol=1e-6, atol=1e-7)


def _template(model: Any, optimizer: Any, flat: bool) -> tuple[dict[str, Any], Any]:
    options = StateDictOptions(**({"flatten_optimizer_state_dict": True} if flat else {}))
    model_sd, optim_sd = get_state_dict(model, optimizer, options=options)
    return {"model": model_sd, "optim": optim_sd}, options


def _set(model: Any, optimizer: Any, state: dict[str, Any], options: Any) -> None:
    set_state_dict(
        model,
        optimizer,
        model_state_dict=state["model"],
        optim_state_dict=state["optim"],
        options=options,
    )
    adamw = type(optimizer).__name__ == "AdamW"  # always decoupled; Adam coupled
    assert optimizer.param_groups[0].get("decoupled_weight_decay", adamw) is adamw
    assert {float(s["step"]) for s in optimizer.state.values()} == {float(SAVED)}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("release", RELEASES)
def test_plain_load_state_dict_needs_nothing(release: str, name: str) -> None:
    model, optimizer = build(name)
    saved = torch.load(_folder(release, name) / "plain.pt", weights_only=True)
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optim"])
    _resume_and_step(_folder(release, name), model, optimizer)


@pytest.mark.usefixtures("group")
@pytest.mark.parametrize(("release", "name", "form"), CASES)
def test_a_plain_dcp_load_fails_only_where_the_running_torch_added_a_key(
    release: str, name: str, form: str
) -> None:
    """The reported failure (pytorch 146157, torchtitan 886), nested and flattened alike;
    every other pair of releases needs nothing."""
    if FORMS[form] and not has_flatten():
        pytest.skip(NO_FLATTEN)
    model, optimizer = build(name)
    state, options = _template(model, optimizer, FORMS[form])
    folder = _folder(release, name, form)
    if _refused_by_torch(release, lambda: dcp.load(state, **dcp_kwargs(folder)), plain=True):
        return
    if RUNNING[:2] == (2, 4) and _version(release) < (2, 3):
        # 2.2/2.3 saved param_groups as one item; 2.4 plans it key by key (2.5 falls back)
        with pytest.raises(BaseException, match=r"Missing key in checkpoint.*param_groups\.0\."):
            dcp.load(state, **dcp_kwargs(folder))
        return
    added = _missing_in_checkpoint(release, name, folder)
    if added:
        with pytest.raises(BaseException, match=rf"Missing key in checkpoint.*{min(added)}"):
            dcp.load(state, **dcp_kwargs(folder))
        return
    dcp.load(state, **dcp_kwargs(folder))
    _set(model, optimizer, state, options)
    _resume_and_step(folder.parent, model, optimizer)


@pytest.mark.usefixtures("group")
@pytest.mark.parametrize(("release", "name", "form"), CASES)
def test_load_dcp_resumes_from_any_release(release: str, name: str, form: str) -> None:
    if FORMS[form] and not has_flatten():
        pytest.skip(NO_FLATTEN)
    model, optimizer = build(name)
    state, options = _template(model, optimizer, FORMS[form])
    folder = _folder(release, name, form)
    if _refused_by_torch(
        release, lambda: load_dcp(state, {"optim": optimizer}, **dcp_kwargs(folder))
    ):
        return
    filled = load_dcp(state, {"optim": optimizer}, **dcp_kwargs(folder))
    # every key compatshim filled is named, also inside torch 2.2's whole param_groups item
    assert {p.rpartition(".")[2] for p in filled} == _added_keys(release, name), filled
    assert all(p.startswith("optim.param_groups.") for p in filled), filled
    _set(model, optimizer, state, options)
    _resume_and_step(folder.parent, model, optimizer)


@pytest.mark.usefixtures("group")
@pytest.mark.skipif(has_flatten(), reason="this torch has flatten_optimizer_state_dict")
def test_a_flattened_checkpoint_has_no_reader_on_a_torch_without_flatten() -> None:
    """torch 2.2: no flattened option, and (written by 2.3+) no ``.metadata`` it can read."""
    with pytest.raises(TypeError, match="flatten_optimizer_state_dict"):
        StateDictOptions(flatten_optimizer_state_dict=True)  # type: ignore[call-arg]
    flat = [_folder(r, n, form) for r, n, form in CASES if FORMS[form]]
    assert flat, "no flattened fixture"
    for folder in flat:
        reader = dcp.FileSystemReader(folder)
        assert _refused_by_torch(folder.parent.parent.name[5:], reader.read_metadata), folder


@pytest.mark.usefixtures("group")
def test_a_key_no_release_added_still_fails_naming_it() -> None:
    model, optimizer = build("adamw")
    state, _ = _template(model, optimizer, False)
    state["model"]["extra.weight"] = torch.zeros(1)
    folder = _folder(RELEASES[0], "adamw", "dcp-nested")
    # 2.3+: "Missing key in checkpoint state_dict: model.extra.weight"; 2.2: a KeyError
    with pytest.raises(BaseException, match=r"(Missing key in checkpoint|KeyError).*extra\.weight"):
        load_dcp(state, {"optim": optimizer}, **dcp_kwargs(folder))
    assert isinstance(state["optim"]["param_groups"], list), "the template is left as it was"


def _sgd() -> Any:
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1, momentum=0.9)


def test_adapt_fills_added_keys_as_the_old_release_behaved_and_drops_unknown_ones() -> None:
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    saved = copy.deepcopy(optimizer.state_dict())
    group = saved["param_groups"][0]
    for key in ("capturable", "maximize", "decoupled_weight_decay"):
        group.pop(key, None)
    group["initial_lr"] = 0.1  # a scheduler's key: not the optimizer's to drop
    before = copy.deepcopy(saved)
    adapted = adapt_state_dict(saved, optimizer)
    assert saved == before, "the input is left unchanged"
    got = adapted["param_groups"][0]
    assert got["capturable"] is False and got["maximize"] is False
    assert got["initial_lr"] == 0.1
    if NEWER_KEYS:
        assert got["decoupled_weight_decay"] is True  # AdamW was always decoupled
    sgd = _sgd()
    newer = copy.deepcopy(sgd.state_dict())
    newer["param_groups"][0]["decoupled_weight_decay"] = False  # a key SGD does not know
    assert "decoupled_weight_decay" not in adapt_state_dict(newer, sgd)["param_groups"][0]


@pytest.mark.skipif(not has_flatten(), reason=NO_FLATTEN)
def test_adapt_handles_the_flattened_form() -> None:
    model, optimizer = build("adam")
    _, optim_sd = get_state_dict(
        model, optimizer, options=StateDictOptions(flatten_optimizer_state_dict=True)
    )
    fqn = "0.weight"
    optim_sd.pop(f"param_groups.{fqn}.maximize")
    adapted = adapt_state_dict(optim_sd, optimizer)
    assert adapted[f"param_groups.{fqn}.maximize"] is False
    assert adapted.keys() == {**optim_sd, f"param_groups.{fqn}.maximize": 0}.keys()


def test_adapt_refuses_a_missing_key_no_release_added() -> None:
    sgd = _sgd()
    saved = copy.deepcopy(sgd.state_dict())
    del saved["param_groups"][0]["momentum"]
    with pytest.raises(OptimizerStateError, match=r"\['momentum'\].*running torch \d"):
        adapt_state_dict(saved, sgd)


def test_another_optimizers_state_is_named_as_such() -> None:
    """AdamW's state mapped to an SGD: the message said only that SGD's keys were missing."""
    sgd = _sgd()
    adamw = torch.optim.AdamW(torch.nn.Linear(2, 2).parameters())
    saved = adamw.state_dict()
    saved["param_groups"][0]["initial_lr"] = 0.1  # a scheduler's: no hint of another class
    with pytest.raises(OptimizerStateError) as caught:
        adapt_state_dict(saved, sgd)
    message = str(caught.value)
    assert message.startswith(  # the likely cause first
        "compatshim.optim: the saved SGD state (at param_groups.0) looks saved by another "
        "optimizer or scheduler class: it holds ['amsgrad', 'betas', 'eps'], which no SGD"
    ), message
    assert "and lacks key(s) ['dampening', 'momentum', 'nesterov']" in message
    del saved["param_groups"][0]["betas"], saved["param_groups"][0]["eps"]
    del saved["param_groups"][0]["amsgrad"]
    with pytest.raises(OptimizerStateError) as caught:
        adapt_state_dict(saved, sgd)
    assert "another optimizer" not in str(caught.value)


@pytest.mark.parametrize(
    ("state_dict", "error", "match"),
    [
        (None, TypeError, r"state_dict: expected an optimizer state dict .*got None"),
        ([1], TypeError, r"state_dict: expected an optimizer state dict .*got a list"),
        ({"param_groups": None}, ValueError, r"\['param_groups'\]: expected a list"),
        ({"param_groups": [None]}, ValueError, r"\['param_groups'\]\[0\]: expected a param gr"),
        ({"weight": 1}, ValueError, "holds no param groups.*is it an optimizer's state dict"),
        ({"param_groups.w.lr": 0.1, 3: 1}, ValueError, "string keys, got 3"),
    ],
)
def test_adapt_names_a_bad_state_dict(state_dict: Any, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        adapt_state_dict(state_dict, _sgd())


def test_adapt_names_a_bad_optimizer() -> None:
    saved = _sgd().state_dict()
    for bad in (None, "adamw", torch.nn.Linear(1, 1)):
        with pytest.raises(TypeError, match=r"optimizer: expected a torch.optim.Optimizer"):
            adapt_state_dict(saved, bad)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda s, o: load_dcp(None, {"optim": o}, checkpoint_id="x"), TypeError, "state_dict:"),
        (lambda s, o: load_dcp(s, o, checkpoint_id="x"), TypeError, r"optimizers: .*\{'optim'"),
        (lambda s, o: load_dcp(s, {"opt": o}, checkpoint_id="x"), ValueError, "'opt' is not a"),
        (lambda s, o: load_dcp(s, {"optim": None}, checkpoint_id="x"), TypeError, r"\['optim'\]"),
        (lambda s, o: load_dcp(s, {"model": o}, checkpoint_id="x"), ValueError, "no param gr"),
        (lambda s, o: load_dcp(s, {"optim": o}), ValueError, "checkpoint_id: pass the checkpoint"),
        (lambda s, o: load_dcp(s, {"optim": o}, checkpoint_id=3), TypeError, "checkpoint_id: exp"),
        (lambda s, o: load_dcp(s, {"optim": o}, storage_reader="/x"), TypeError, "storage_reader:"),
    ],
)
def test_load_dcp_names_a_bad_argument_before_reading(
    call: Any, error: type, match: str, tmp_path: Path
) -> None:
    """Raised before the checkpoint is read or the template changed."""
    model, optimizer = build("adamw")
    state, _ = _template(model, optimizer, False)
    before = copy.deepcopy(state)
    with pytest.raises(error, match=match):
        call(state, optimizer)
    assert state.keys() == before.keys()
    assert state["optim"]["param_groups"] == before["optim"]["param_groups"]
