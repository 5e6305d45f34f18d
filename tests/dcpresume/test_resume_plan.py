"""The dry run of a DCP resume (issue 39 item 4): ``plan_resume`` and ``compatshim resume-check``.

A folder saved here with DCP alone (no process group) holds a model, a scheduler state
written without the key the running torch's schedulers have and another release lacks
(``_is_initial`` from 2.8, ``verbose`` before), a config object hardened mode refuses,
and a plain int. The template asks for a key the folder lacks, too. The plan must name
each entry as the real load then does: what ``compatshim.optim.load_dcp`` fills is what
it returns, and the missing key is what ``dcp.load`` names.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed.checkpoint.state_dict")  # torch >= 2.2

import torch.distributed.checkpoint as dcp  # noqa: E402

from compatshim.checkpoint import plan_resume  # noqa: E402
from compatshim.cli import main as cli  # noqa: E402
from compatshim.optim import OptimizerStateError, load_dcp  # noqa: E402
from compatshim.optim.keys import SCHEDULER_KEYS  # noqa: E402
from tests.dcpresume.optim_job import dcp_kwargs, grouped, one_rank_group  # noqa: E402
from tests.dcpresume.test_optim_releases import RUNNING  # noqa: E402

pytestmark = pytest.mark.timeout(180)
FIXTURE = Path(__file__).parent / "fixtures" / "torch2.15.0" / "adamw" / "dcp-nested"


class Config:
    """A user's object saved in the checkpoint: hardened mode refuses its class."""

    def __init__(self) -> None:
        self.lr = 0.1


def _objects() -> tuple[Any, Any, Any]:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return model, opt, torch.optim.lr_scheduler.StepLR(opt, step_size=2)


def _release_key(sched: Any) -> str:
    """The scheduler key the running torch has and some other release lacks."""
    [key] = [k for k in SCHEDULER_KEYS if k in sched.state_dict()]
    return key


@pytest.fixture()
def folder(tmp_path: Path) -> Path:
    model, _, sched = _objects()
    saved_sched = sched.state_dict()
    saved_sched.pop(_release_key(sched))  # as the other release wrote it
    state = {"model": model.state_dict(), "sched": saved_sched, "cfg": Config(), "n": 3}
    path = tmp_path / "ckpt"
    with one_rank_group(tmp_path / "store"):
        dcp.save(state, **dcp_kwargs(path, save=True))
    return path


def template() -> tuple[dict[str, Any], dict[str, Any]]:
    model, _, sched = _objects()
    state = {"model": model.state_dict(), "sched": sched.state_dict(), "cfg": None, "n": 0,
             "extra": torch.zeros(2)}  # fmt: skip
    return state, {"sched": sched}


def test_the_plan_names_what_loads_is_filled_missing_and_refused(
    folder: Path, tmp_path: Path
) -> None:
    state, owners = template()
    key = _release_key(owners["sched"])
    plan = plan_resume(folder, state, owners)
    assert not plan.ok
    assert plan.missing == ("extra",)
    assert plan.filled == ((f"sched.{key}", SCHEDULER_KEYS[key]),)
    assert "model.weight" in plan.loads and "n" in plan.loads
    assert len(plan.refused) == 1 and plan.refused[0].startswith("cfg: names ")
    assert "Config" in plan.refused[0]
    assert not plan.unreadable and not plan.mismatched
    unchecked = plan_resume(folder, state, owners, hardened=False)
    assert unchecked.refused == () and not unchecked.hardened
    assert "not checked: whether hardened mode would refuse" in unchecked.text()  # was silent
    assert "not checked" not in plan.text()
    # the real load agrees: without the missing key and the refused item it resumes, and
    # load_dcp fills exactly what the plan named
    state, owners = template()
    del state["extra"], state["cfg"]
    assert plan_resume(folder, state, owners).ok
    with one_rank_group(tmp_path / "store2"):
        filled = load_dcp(state, owners, **dcp_kwargs(folder))
    assert filled == (f"sched.{key}",)
    state, owners = template()
    with one_rank_group(tmp_path / "store3"), pytest.raises(BaseException, match="extra"):
        load_dcp({"extra": state["extra"], "sched": state["sched"]}, owners,
                 **dcp_kwargs(folder))  # fmt: skip


def test_a_shape_or_kind_mismatch_fails_the_plan(folder: Path) -> None:
    state, owners = template()
    del state["extra"], state["cfg"]
    state["model"]["weight"] = torch.zeros(4, 4)
    state["n"] = torch.zeros(1)
    plan = plan_resume(folder, state, owners)
    assert not plan.ok
    assert any(m.startswith("model.weight: saved shape (2, 3)") for m in plan.mismatched)
    assert any(m.startswith("n: saved a non-tensor item") for m in plan.mismatched)


def test_cli_exit_codes(folder: Path, tmp_path: Path, monkeypatch: Any,
                        capsys: Any) -> None:  # fmt: skip
    (tmp_path / "resume_state.py").write_text(
        "from tests.dcpresume.test_resume_plan import template\n"
        "def full():\n    return template()\n"
        "def clean():\n"
        "    state, owners = template()\n"
        "    del state['extra'], state['cfg']\n"
        "    return state, owners\n"
        "def broken():\n    raise RuntimeError('boom')\n"
        "listed = [1]\n"
        "def leaves():\n    raise SystemExit(0)\n"
        "def stranger():\n"
        "    state, owners = template()\n"
        "    return state, {'elsewhere': next(iter(owners.values()))}\n"
    )
    (tmp_path / "unparsable.py").write_text("def f(:\n")
    (tmp_path / "parses_argv.py").write_text(
        "import argparse\nargparse.ArgumentParser().parse_args(['--lr', '1'])\ndef f(): pass\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(Path(__file__).parents[2]))
    assert cli(["resume-check", str(folder), "--state", "resume_state:full"]) == 1
    out = capsys.readouterr().out
    assert "WOULD FAIL" in out and "MISSING from the checkpoint: extra" in out
    assert "REFUSED by hardened mode: cfg" in out
    assert grouped() or "filled by compatshim.optim" in out  # torch 2.2: see the skip above
    assert cli(["resume-check", str(folder), "--state", "resume_state:clean"]) == 0
    assert cli(["resume-check", str(folder), "--state", "nowhere"]) == 2
    capsys.readouterr()
    for state, named in (("resume_state:broken", "RuntimeError: boom"),  # the function raises
                         ("resume_state:listed", "expected a dict"), ("resume_state:nothing",
                         "AttributeError"), ("unparsable:f", "SyntaxError"),
                         # a clean exit is no state (it read 0: a green gate), argparse at import
                         # neither; an owner that is not a key of the state is the state's fault
                         ("resume_state:leaves", "exited (SystemExit 0)"),
                         ("parses_argv:f", "exited (SystemExit 2)"),
                         ("resume_state:stranger", "'elsewhere' is not a key")):  # fmt: skip
        assert cli(["resume-check", str(folder), "--state", state]) == 2, state
        err = capsys.readouterr().err
        assert f"--state {state}: " in err and named in err and "Traceback" not in err, err
    for module in ("resume_state", "parses_argv"):
        sys.modules.pop(module, None)


def test_a_folder_this_torch_cannot_read_is_named_with_the_way_out() -> None:
    import torch.distributed.checkpoint.metadata as md

    plan = plan_resume(FIXTURE, {"model": {}})
    if "strides" in md.TensorProperties.__dataclass_fields__:
        assert not plan.unreadable
    else:  # torch 2.13 and older
        assert not plan.ok and any("strides" in why for why in plan.unreadable)
        assert "compatshim dcp-downgrade" in plan.text()


def test_a_poisoned_metadata_is_reported_refused(tmp_path: Path) -> None:
    from compatshim.checkpoint._downgrade import _Pickler

    out = _Pickler()
    out.raw(out.ref("os.system") + out.encode(("true",)) + b"R")  # os.system("true")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / ".metadata").write_bytes(out.finish())
    plan = plan_resume(tmp_path / "bad", {"model": {}})
    assert not plan.ok and "os.system" in plan.refused[0]


class _Payload:
    """An item whose unpickling would write ``marker``: the dry run loads items hardened."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> Any:
        return exec, (f"open({self.marker!r}, 'w').close()",)


def test_a_payload_item_is_refused_and_never_runs(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    model, _, _ = _objects()
    path = tmp_path / "ckpt"
    with one_rank_group(tmp_path / "store"):
        dcp.save({"model": model.state_dict(), "cfg": _Payload(str(marker))},
                 **dcp_kwargs(path, save=True))  # fmt: skip
    assert not marker.exists()
    plan = plan_resume(path, {"model": model.state_dict(), "cfg": None})
    assert not plan.ok and not marker.exists()
    assert len(plan.refused) == 1 and plan.refused[0].startswith("cfg: names builtins.exec")


def _with_item_lengths(folder: Path, fqns: tuple[str, ...], length: int) -> None:
    """``folder``'s ``.metadata`` saying ``length`` bytes for the items ``fqns``."""
    import dataclasses
    import pickle

    meta = folder / ".metadata"
    with meta.open("rb") as file:
        metadata = pickle.load(file)  # the test's own folder, saved just now: trusted
    for index, info in list(metadata.storage_data.items()):
        if index.fqn in fqns:
            metadata.storage_data[index] = dataclasses.replace(info, length=length)
    with meta.open("wb") as file:
        pickle.dump(metadata, file)


def test_an_item_length_past_its_data_file_is_named_not_allocated(folder: Path) -> None:
    """A ``.metadata`` may give an item any length: the dry run checks it against the data
    file before reading (1 PiB: a MemoryError before, or that much asked of the allocator).
    The data file is then too short for what ``.metadata`` places in it: damaged, unread."""
    _with_item_lengths(folder, ("n",), 2**50)
    state, optimizers = template()
    plan = plan_resume(folder, state, optimizers)
    assert not plan.ok and not [line for line in plan.refused if line.startswith("n: ")]
    [why] = plan.damaged
    assert "where .metadata places data up to byte 11258999068" in why, why


def test_an_entry_length_past_its_data_file_stops_the_2_2_rewrite(
    folder: Path, tmp_path: Path
) -> None:
    """The rewrite for torch 2.2 reads the entries of a dict it saves whole: the same check."""
    from compatshim.checkpoint import CheckpointError, downgrade_dcp

    if tuple(int(part) for part in torch.__version__.split(".")[:2]) < (2, 3):
        pytest.skip("this torch saves a dict without tensors as one item: nothing to read")
    _with_item_lengths(folder, ("sched.last_epoch",), 2**50)
    with pytest.raises(CheckpointError, match=r"sched\.last_epoch' is 1125899906842624 bytes"):
        downgrade_dcp(folder, tmp_path / "old", torch="2.2")


def test_a_mapping_load_dcp_refuses_fails_the_dry_run_with_the_same_error(
    folder: Path, tmp_path: Path
) -> None:
    """plan_resume passed mappings that load_dcp then refused (an optimizer named for a
    scheduler's state, a key the state lacks, a str for an optimizer, a scheduler named for
    an optimizer's state); both now raise the same error, before anything is read."""
    _, opt, sched = _objects()
    state, _ = template()
    state["optim"] = opt.state_dict()
    for owners in ({"sched": opt}, {"nokey": sched}, {"sched": "x"}, {"optim": sched}, [sched]):
        with pytest.raises((TypeError, ValueError)) as planned:
            plan_resume(folder, state, owners)
        with one_rank_group(tmp_path / "store"), pytest.raises(type(planned.value)) as loaded:
            load_dcp(state, owners, **dcp_kwargs(folder))  # type: ignore[arg-type]
        assert str(loaded.value) == str(planned.value), owners
    with pytest.raises(TypeError, match="folder: expected the DCP checkpoint folder"):
        plan_resume(None, state)
    with pytest.raises(TypeError, match=r"state_dict\(\): expected a dict or \(dict, opt"):
        plan_resume(folder, lambda: (state, {}, 1))


def test_a_lost_or_cut_data_file_fails_the_plan(folder: Path, tmp_path: Path) -> None:
    """The dry run said "resumes" for a folder whose data file was gone (dcp.load then
    failed on every rank), or raised FileNotFoundError where it read a non-tensor item."""
    import shutil

    state, owners = template()
    del state["extra"], state["cfg"]
    assert plan_resume(folder, state, owners).ok
    lost, cut = tmp_path / "lost", tmp_path / "cut"
    for copy in (lost, cut):
        shutil.copytree(folder, copy)
    for file in lost.glob("*.distcp"):
        file.unlink()
    for file in cut.glob("*.distcp"):
        file.write_bytes(file.read_bytes()[:100])
    for copy, why in ((lost, "No such file or directory"), (cut, "100 bytes, where")):
        plan = plan_resume(copy, state, owners)
        assert not plan.ok and plan.damaged and why in plan.damaged[0], plan.text()
        assert "DAMAGED: data file" in plan.text() and not plan.refused


def test_a_fresh_optimizer_s_empty_state_fails_the_plan(tmp_path: Path) -> None:
    """The template built from a fresh optimizer (its state_dict()["state"] is empty until
    the first step): DCP's flattening drops the empty dict, dcp.load loads no moment, and the
    plan said "resumes", listing the Adam state only as "not asked for"."""
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.ones(1, 4)).sum().backward()
    optimizer.step()
    path = tmp_path / "adam"
    with one_rank_group(tmp_path / "store"):
        dcp.save({"model": model.state_dict(), "optim": optimizer.state_dict()},
                 **dcp_kwargs(path, save=True))  # fmt: skip
    fresh = torch.optim.Adam(model.parameters())
    plan = plan_resume(path, {"model": model.state_dict(), "optim": fresh.state_dict()})
    assert not plan.ok, plan.text()
    [why] = plan.hollow
    assert why.startswith("optim.state: ") and "get_state_dict" in why, why
    assert "NOT LOADED" in plan.text()
    assert plan_resume(path, {"model": model.state_dict(), "optim": optimizer.state_dict()}).ok


def test_a_path_that_is_no_dcp_folder_is_named_for_what_it_is(tmp_path: Path) -> None:
    """resume-check and dcp-downgrade said "[Errno 20] Not a directory: 'x/.metadata'" for a
    file, and "[Errno 2] ..." for a folder without .metadata or no folder at all; load_dcp
    still said so after they were fixed."""
    from compatshim.checkpoint import CheckpointError, downgrade_dcp
    from compatshim.optim import load_dcp

    (tmp_path / "weights.pt").write_bytes(b"x")
    (tmp_path / "empty").mkdir()
    cases = {
        "weights.pt": "a file, not a DCP checkpoint folder",
        "empty": "no .metadata here: not a DCP checkpoint folder",
        "missing": "no such folder",
    }
    for name, said in cases.items():
        for call in (
            lambda p: plan_resume(p, {}),
            lambda p: downgrade_dcp(p, tmp_path / "o", torch="2.4"),
            lambda p: load_dcp({}, {}, checkpoint_id=p),
        ):
            with pytest.raises(CheckpointError, match=said) as raised:
                call(tmp_path / name)
            assert isinstance(raised.value, FileNotFoundError)


def _adamw(groups: int) -> tuple[dict[str, Any], Any]:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    params = [{"params": [model.weight]}, {"params": [model.bias], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(params[:groups] if groups == 2 else [*model.parameters()], lr=0.1)
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    return {"optim": opt.state_dict()}, opt


def test_fewer_saved_param_groups_are_named_by_the_plan_and_the_load(tmp_path: Path) -> None:
    """Saved with one param group, resumed into two (a no-weight-decay group added): the dry
    run listed fills for the group the checkpoint lacks, and load_dcp raised DCP's "Missing
    key ... param_groups.1.lr" from inside its plan (a CheckpointException on 2.3+)."""
    saved, _ = _adamw(1)
    path = tmp_path / "ckpt"
    with one_rank_group(tmp_path / "store"):
        dcp.save(saved, **dcp_kwargs(path, save=True))
    state, opt = _adamw(2)
    plan = plan_resume(path, state, {"optim": opt})
    said = "optim.param_groups holds 1 saved"  # param groups, the running AdamW 2 (2.2: values)
    assert not plan.ok and any(said in m for m in plan.mismatched), plan.text()
    assert not [p for p, _ in plan.filled if p.startswith("optim.param_groups.1.")], plan.text()
    if RUNNING < (2, 3):
        return  # 2.2 saves param_groups as one item: its groups are counted once it is read
    with (
        one_rank_group(tmp_path / "store2"),
        pytest.raises(OptimizerStateError, match=re.escape(said)),
    ):
        load_dcp(state, {"optim": opt}, **dcp_kwargs(path))


def _another_shape(kind: str) -> tuple[dict[str, Any], dict[str, Any], str]:
    """A saved state of another shape than the running one's (``kind``), as a user's changed
    script or a corrupt file holds it, with the words both the dry run and load_dcp give."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    kids = [torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.5, total_iters=2),
            torch.optim.lr_scheduler.StepLR(opt, step_size=2)]  # fmt: skip
    sched = torch.optim.lr_scheduler.SequentialLR(opt, kids, milestones=[2])
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    state = {"model": model.state_dict(), "optim": opt.state_dict(), "sched": sched.state_dict()}
    if kind == "groups":  # a second param group: DCP loaded the first and dropped it
        state["optim"]["param_groups"].append(dict(state["optim"]["param_groups"][0], lr=5.0))
        return state, {"optim": opt, "sched": sched}, "optim.param_groups holds 2 saved"
    if kind == "nested":  # a third nested scheduler: dropped too
        state["sched"]["_schedulers"].append(dict(state["sched"]["_schedulers"][1]))
        return state, {"optim": opt, "sched": sched}, "sched._schedulers holds 3 saved"
    if kind == "milestones":  # loaded, then an IndexError at a later step
        state["sched"]["_milestones"] = [2, 4]
        return state, {"optim": opt, "sched": sched}, "sched._milestones holds 2 saved value(s)"
    if kind == "betas":
        state["optim"]["param_groups"][0]["betas"] = (0.9, 0.99, 0.5)
        return state, {"optim": opt, "sched": sched}, "optim.param_groups.0.betas holds 3 saved"
    if kind == "last_epoch":  # a str where a number was: a TypeError at the next step
        state["sched"]["last_epoch"] = "3"
        return state, {"optim": opt, "sched": sched}, "sched.last_epoch holds a str ('3'), the"
    if kind == "lr":  # a list where a number was
        state["optim"]["param_groups"][0]["lr"] = [0.1, 0.2]
        return state, {"optim": opt, "sched": sched}, "optim.param_groups.0.lr holds a list"
    if kind == "step":  # put in the tensor's place
        state["optim"]["state"][0]["step"] = "7"
    return state, {"optim": opt, "sched": sched}, "optim.state.0.step: saved a non-tensor item"


@pytest.mark.parametrize(
    "kind", ["groups", "nested", "milestones", "betas", "last_epoch", "lr", "step"]
)
def test_a_state_of_another_shape_fails_the_plan_and_the_load_alike(
    tmp_path: Path, kind: str
) -> None:
    """Found by an audit: a checkpoint with more param groups or nested schedulers than the
    running objects loaded, the rest dropped without a word (torch's own load_state_dict
    refuses it); a list of another length or a str in a tensor's place loaded, and the run
    failed at a later step; the dry run passed the first three. Each now fails both alike,
    and where the .metadata tells (more entries, a non-tensor item) before anything loads."""
    saved, _, said = _another_shape(kind)
    path = tmp_path / "ckpt"
    with one_rank_group(tmp_path / "store"):
        dcp.save(saved, **dcp_kwargs(path, save=True))
    state, owners, _ = _another_shape("none")
    plan = plan_resume(path, state, owners)
    assert not plan.ok and any(said in m for m in plan.mismatched), plan.text()
    weight = state["model"]["weight"].clone()
    state["model"]["weight"].zero_()
    with (
        one_rank_group(tmp_path / "store2"),
        pytest.raises(OptimizerStateError, match=re.escape(said)),
    ):
        load_dcp(state, owners, **dcp_kwargs(path))
    # .metadata tells (on 2.2, a list without tensors is one item, read first): refused before
    told = kind == "step" or (kind in ("groups", "nested") and RUNNING >= (2, 3))  # any load
    loaded = state["model"]["weight"]
    assert not loaded.any() if told else torch.equal(loaded, weight)  # else: loaded, then checked


def test_a_state_of_the_same_shape_passes_the_plan_and_the_load(tmp_path: Path) -> None:
    saved, _, _ = _another_shape("none")
    path = tmp_path / "ckpt"
    with one_rank_group(tmp_path / "store"):
        dcp.save(saved, **dcp_kwargs(path, save=True))
    state, owners, _ = _another_shape("none")
    assert plan_resume(path, state, owners).ok
    with one_rank_group(tmp_path / "store2"):
        assert load_dcp(state, owners, **dcp_kwargs(path)) == ()


def test_a_nested_state_saved_as_another_item_fails_both_naming_it(tmp_path: Path) -> None:
    """A nested scheduler's state saved as a str: load_dcp said it "was not read from the
    checkpoint" (the audit: it was read; DCP did not put it in its place)."""
    saved, _, _ = _another_shape("none")
    saved["sched"]["_schedulers"][0] = "notadict"
    path = tmp_path / "ckpt"
    with one_rank_group(tmp_path / "store"):
        dcp.save(saved, **dcp_kwargs(path, save=True))
    state, owners, _ = _another_shape("none")
    plan = plan_resume(path, state, owners)
    assert not plan.ok and "sched._schedulers.0" in plan.text(), plan.text()
    with one_rank_group(tmp_path / "store2"), pytest.raises(OptimizerStateError) as failed:
        load_dcp(state, owners, **dcp_kwargs(path))
    assert "sched._schedulers.0" in str(failed.value)
    assert "not read from the checkpoint" not in str(failed.value)
