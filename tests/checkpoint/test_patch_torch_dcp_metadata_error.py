"""Patch ``torch-dcp-metadata-error``: a DCP load that cannot read ``.metadata`` says why.

Real folders written by the running torch's ``dcp.save``, broken as users meet them
(missing, truncated, not a pickle); the reason a load must give is whatever torch's own
``FileSystemReader.read_metadata`` raises on the same folder.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed.checkpoint")

import torch.distributed.checkpoint as dcp  # noqa: E402

import compatshim  # noqa: E402
from compatshim.patches import torch_dcp_metadata_error as patch  # noqa: E402
from tests.checkpoint.dcp_kit import digest, load, run_hardened, save, state, template  # noqa: E402
from tests.checkpoint.test_hardened import TIMEOUT_S  # noqa: E402
from tests.harness.catalogue import a_library_wraps, alone, status_row  # noqa: E402
from tests.harness.dist import run_ranks  # noqa: E402

pytestmark = pytest.mark.timeout(2 * TIMEOUT_S)
NAME = "torch-dcp-metadata-error"
LOADER = sys.modules["torch.distributed.checkpoint.state_dict_loader"]
UTILS = sys.modules[LOADER._DistWrapper.__module__]
LOGGER = vars(LOADER).get("logger")  # torch's (torch 2.1 has none)
RELEASE = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])


@pytest.fixture()
def off() -> Iterator[None]:
    with alone(NAME, armed=False):
        yield


@pytest.fixture()
def armed() -> Iterator[None]:
    with alone(NAME, armed=True):
        yield


def _broken(tmp_path: Path, how: str) -> Path:
    folder = tmp_path / how
    if how == "missing":
        return folder
    save(folder, state())
    metadata = folder / ".metadata"
    if how == "truncated":
        metadata.write_bytes(metadata.read_bytes()[:40])
    elif how == "not_a_pickle":
        metadata.write_bytes(b"PK\x03\x04 this is no pickle")
    return folder


def _reader_error(folder: Path) -> str:
    """What torch's own reader says about the folder."""
    with pytest.raises(Exception) as caught:
        dcp.FileSystemReader(str(folder)).read_metadata()
    return str(caught.value)


def _load_error(folder: Path) -> str:
    with pytest.raises(BaseException) as caught:  # DCP raises CheckpointException, a BaseException
        load(folder, template())
    return str(caught.value)


def _says_why(folder: Path) -> bool:
    """Whether a load's error carries what torch's reader says, as torch says it or as the
    fix words it: on one line (pickle's "persistent id" error has two)."""
    reason, said = _reader_error(folder), _load_error(folder)
    return reason in said or " ".join(reason.splitlines()) in said


HOW = ["missing", "truncated", "not_a_pickle"]


@pytest.mark.parametrize("how", HOW)
def test_torch_alone_says_why_exactly_where_the_probe_finds_no_defect(
    off: None, tmp_path: Path, how: str
) -> None:
    folder = _broken(tmp_path, how)
    says_why = _says_why(folder)
    assert patch.probe(LOADER) is not says_why
    if RELEASE <= (2, 15):  # the releases whose state_dict_loader.py was read
        assert says_why is not ((2, 9) <= RELEASE < (2, 12)), torch.__version__


@pytest.mark.parametrize("how", HOW)
def test_with_the_patch_every_unreadable_folder_says_why(
    armed: None, tmp_path: Path, how: str
) -> None:
    folder = _broken(tmp_path, how)
    assert _says_why(folder)
    row = status_row(NAME)
    assert row.fixed in (True, None) and row.error is None, row


def test_only_torch_s_own_exception_types_are_raised(armed: None, tmp_path: Path) -> None:
    """Same types as torch alone: the patch adds words, never a new exception."""
    folder = _broken(tmp_path, "missing")
    with pytest.raises(BaseException) as caught:
        load(folder, template())
    compatshim.uninstall([NAME])
    with pytest.raises(BaseException) as plain:
        load(folder, template())
    assert type(caught.value) is type(plain.value)


def test_a_genuine_folder_loads_the_same(armed: None, tmp_path: Path) -> None:
    save(tmp_path / "ok", state())
    loaded = template()
    load(tmp_path / "ok", loaded)
    assert digest(loaded) == digest(state())


def test_the_defect_row_and_the_fix_where_torch_drops_the_reason(armed: None) -> None:
    row = status_row(NAME)
    if RELEASE <= (2, 15):
        assert (row.defect == "present") is ((2, 9) <= RELEASE < (2, 12)), row
    if row.defect == "present":
        assert row.applied and row.fixed, row
        assert not patch.probe(LOADER)  # probed through the fix: the reason is there
    else:
        assert not row.applied and vars(LOADER).get("logger") is LOGGER, row


def test_install_is_idempotent_and_uninstall_exact(off: None) -> None:
    wrap = vars(UTILS)["_wrap_exception"]
    assert compatshim.install(include=[NAME]) == [NAME]
    assert compatshim.install(include=[NAME]) == [NAME]
    if status_row(NAME).applied:
        assert getattr(UTILS._wrap_exception, "__wrapped__", None) is wrap
    compatshim.uninstall([NAME])
    assert vars(LOADER).get("logger") is LOGGER and vars(UTILS)["_wrap_exception"] is wrap


def test_the_probe_logs_nothing_and_torch_s_own_log_line_stays(
    off: None, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    patch.probe(LOADER)
    assert [r for r in caplog.records if r.pathname == LOADER.__file__] == []
    compatshim.install(include=[NAME])
    _load_error(_broken(tmp_path, "missing"))
    ours = [r for r in caplog.records if r.pathname == LOADER.__file__]
    if status_row(NAME).applied:  # torch's line, still from torch's frame (not the stand-in's)
        assert ours and {r.funcName for r in ours} == {"local_step"}, ours


def test_every_rank_s_failure_says_why_in_a_process_group(tmp_path: Path) -> None:
    """The collective path: the failure crosses the group (pickled) with its reason."""
    folder = _broken(tmp_path, "truncated")
    reason = _reader_error(folder)
    result = run_hardened(tmp_path, "load_in_group", folder, tmp_path / "store", hardened=False)
    assert not result["ok"] and reason in result["error"], result


def load_on_rank(rank: int, world_size: int, folder: str, arm: bool) -> dict[str, Any]:
    """One gloo rank of :func:`test_two_ranks_each_hear_why_every_rank_failed`: what torch's
    reader says about ``folder`` here, and what a collective load of it raised."""
    try:
        dcp.FileSystemReader(folder).read_metadata()
        reason = ""
    except Exception as exc:
        reason = str(exc)
    with alone(NAME, armed=arm):
        try:
            (getattr(dcp, "load", None) or dcp.load_state_dict)(  # 2.1: load_state_dict
                template(), storage_reader=dcp.FileSystemReader(folder)
            )
        except BaseException as exc:  # CheckpointException, a BaseException
            failures = getattr(exc, "failures", {})
            each = {r: str(failure[0]) for r, failure in failures.items()}
            return {"reason": reason, "type": type(exc).__name__, "each": each}
    return {"reason": reason, "type": None}


@pytest.mark.parametrize("arm", [False, True], ids=["plain", "armed"])
def test_two_ranks_each_hear_why_every_rank_failed(off: None, tmp_path: Path, arm: bool) -> None:
    """Two gloo ranks load a truncated folder: the coordinator gathers both failures and every
    rank raises them all; each must carry torch's reader's reason (torch alone drops it exactly
    where the probe finds the defect, leaving 'metadata is None')."""
    folder = _broken(tmp_path, "truncated")
    says_why = arm or not patch.probe(LOADER)
    results = run_ranks(load_on_rank, 2, args=(str(folder), arm), timeout=TIMEOUT_S)
    for result in results:
        assert result["reason"] and result["type"] == "CheckpointException", result
        assert sorted(result["each"]) == [0, 1], result
        for said in result["each"].values():
            assert (result["reason"] in said) is says_why, result
            if not says_why:
                assert said == "metadata is None", result


def test_a_hardened_refusal_reaches_the_user(tmp_path: Path) -> None:
    """Through torch-dcp-safe-metadata: the refusal's words, never 'metadata is None' alone."""
    from tests.checkpoint.dcp_kit import poison_metadata

    save(tmp_path / "genuine", state())
    poison_metadata(tmp_path / "genuine", tmp_path / "bad", tmp_path / "ran")
    result = run_hardened(tmp_path, "load", tmp_path / "bad")
    assert not (tmp_path / "ran").exists()
    assert "system refused" in result["error"] and "COMPATSHIM_SAFE_LOAD=1" in result["error"]


def test_an_unknown_layout_is_refused_by_name(off: None) -> None:
    fake = type(sys)("torch.distributed.checkpoint.state_dict_loader")
    with pytest.raises(LookupError, match=r"no _load_state_dict .* layout not known"):
        patch.probe(fake)
    from compatshim._engine.patching import Patcher

    with pytest.raises(LookupError, match=r"looked for its logging\.Logger 'logger'"):
        patch.apply(fake, Patcher())


def test_a_reason_that_cannot_be_printed_changes_nothing_else(armed: None) -> None:
    """The stand-in runs inside torch's ``except`` block: an error whose ``str()`` raises
    still gives torch's fallback and torch's exception."""

    class Unprintable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no")

    class Reader:
        def read_metadata(self) -> Any:
            raise Unprintable

    loader = getattr(LOADER, "_load_state_dict", None) or LOADER.load_state_dict
    with pytest.raises(BaseException) as caught:
        loader({}, Reader(), no_dist=True)
    if status_row(NAME).applied:
        assert "a Unprintable whose message cannot be read" in str(caught.value)


def test_a_wrapper_a_library_put_on_after_install_survives_uninstall(
    off: None, tmp_path: Path
) -> None:
    """Uninstall keeps it, and ours under it then adds no reason (torch's own message);
    installing again puts the reason back through it."""
    compatshim.install(include=[NAME])
    if not status_row(NAME).applied:
        compatshim.uninstall([NAME])
        pytest.skip(f"torch {torch.__version__} says why: the patch is not applied")
    torchs = vars(UTILS)["_wrap_exception"].__wrapped__
    library = a_library_wraps(UTILS, "_wrap_exception")
    folder = _broken(tmp_path, "truncated")
    try:
        compatshim.uninstall([NAME])
        assert vars(UTILS)["_wrap_exception"] is library
        assert not _says_why(folder)  # torch's own words
        compatshim.install(include=[NAME])
        assert _says_why(folder)
        compatshim.uninstall([NAME])
        assert vars(UTILS)["_wrap_exception"] is library
    finally:
        compatshim.uninstall([NAME])
        UTILS._wrap_exception = torchs
