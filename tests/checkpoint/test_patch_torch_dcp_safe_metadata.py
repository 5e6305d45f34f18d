"""Patch ``torch-dcp-safe-metadata``: hardened mode covers a DCP folder's ``.metadata``.

Every hostile folder is read in a fresh interpreter started as a user's job starts
(``COMPATSHIM_AUTO=1 COMPATSHIM_SAFE_LOAD=1``, the start-up hook arms compatshim);
its payload would touch a marker file, which must never exist. The armed but not
hardened control shows the same folder runs its payload through torch's own reader.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed.checkpoint")

from tests.checkpoint.dcp_kit import (  # noqa: E402
    Payload,
    digest,
    poison_metadata,
    run_hardened,
    save,
    shared_lists,
    state,
)
from tests.checkpoint.test_hardened import TIMEOUT_S  # noqa: E402

pytestmark = pytest.mark.timeout(2 * TIMEOUT_S)


@pytest.fixture()
def genuine(tmp_path: Path) -> Path:
    folder = tmp_path / "genuine"
    save(folder, state())
    return folder


def _expected() -> dict[str, Any]:
    return json.loads(json.dumps(digest(state())))


def _run(tmp_path: Path, mode: str, *args: Any, hardened: bool = True) -> dict[str, Any]:
    return run_hardened(tmp_path, mode, *args, hardened=hardened)


def _extra(mode: str, tmp_path: Path) -> tuple[Path, ...]:
    """``load_in_group`` also takes the file its one-rank group rendezvouses on."""
    return (tmp_path / "store",) if mode == "load_in_group" else ()


@pytest.mark.parametrize("mode", ["load", "load_in_group"])
def test_hardened_dcp_load_of_a_genuine_folder_equals_the_saved_state(
    tmp_path: Path, genuine: Path, mode: str
) -> None:
    result = _run(tmp_path, mode, genuine, *_extra(mode, tmp_path))
    assert result["ok"], result
    expected = _expected()
    if mode == "load_in_group":  # torch 2.2's dcp.load leaves non-tensor items as they were
        (tmp_path / "store").unlink(missing_ok=True)
        plain = _run(tmp_path, mode, genuine, *_extra(mode, tmp_path), hardened=False)
        assert {k: plain["values"][k] for k in "wb"} == {k: expected[k] for k in "wb"}, plain
        expected = plain["values"]
    assert result["values"] == expected
    assert (result["defect"], result["fixed"], result["pickle_is_module"]) == (
        "present",
        True,
        False,
    )


@pytest.mark.parametrize("mode", ["load", "load_in_group", "reader"])
def test_hardened_refuses_a_poisoned_metadata_and_never_runs_it(
    genuine: Path, tmp_path: Path, mode: str
) -> None:
    marker = tmp_path / "ran"
    poison_metadata(genuine, tmp_path / "bad", marker)
    result = _run(tmp_path, mode, tmp_path / "bad", *_extra(mode, tmp_path))
    assert not marker.exists()
    assert not result["ok"]
    # torch 2.1 raises compatshim's error; 2.12+'s dcp.load wraps it in an AssertionError, as
    # 2.9-2.11's does once torch-dcp-metadata-error (armed here too) puts the words back
    assert "posix.system refused" in result["error"] or "os.system refused" in result["error"]
    assert "COMPATSHIM_SAFE_LOAD=1" in result["error"]
    if mode == "reader":
        assert result["type"] == "UnsafeCheckpointError", result


def test_armed_but_not_hardened_dcp_behaves_as_torch_s(genuine: Path, tmp_path: Path) -> None:
    """The control: the same poisoned folder runs its payload through torch's reader."""
    marker = tmp_path / "ran"
    poison_metadata(genuine, tmp_path / "bad", marker)
    result = _run(tmp_path, "reader", tmp_path / "bad", hardened=False)
    assert result["pickle_is_module"] and result["defect"] == "absent", result
    assert marker.exists()


def _needs_fsspec_reader() -> None:
    """torch's fsspec reader: its own ``pickle.load`` on 2.1-2.3, a FileSystemReader from 2.4."""
    pytest.importorskip("fsspec")  # a torch dependency from 2.1
    if importlib.util.find_spec("torch.distributed.checkpoint._fsspec_filesystem") is None:
        pytest.skip("this torch has no torch.distributed.checkpoint._fsspec_filesystem")


@pytest.mark.parametrize("mode", ["fsspec_load", "fsspec_reader"])
def test_hardened_fsspec_reader_refuses_a_poisoned_metadata(
    genuine: Path, tmp_path: Path, mode: str
) -> None:
    _needs_fsspec_reader()
    marker = tmp_path / "ran"
    poison_metadata(genuine, tmp_path / "bad", marker)
    result = _run(tmp_path, mode, tmp_path / "bad")
    assert not marker.exists(), result
    assert not result["ok"] and not result["fsspec_pickle_is_module"], result
    assert "posix.system refused" in result["error"] or "os.system refused" in result["error"]
    assert "COMPATSHIM_SAFE_LOAD=1" in result["error"]


def test_hardened_fsspec_reader_loads_a_genuine_folder(genuine: Path, tmp_path: Path) -> None:
    _needs_fsspec_reader()
    result = _run(tmp_path, "fsspec_load", genuine)
    assert result["ok"] and result["values"] == _expected(), result
    assert (result["defect"], result["fixed"]) == ("present", True), result


def test_armed_but_not_hardened_fsspec_reader_behaves_as_torch_s(
    genuine: Path, tmp_path: Path
) -> None:
    """The control: the fsspec reader runs the payload when not hardened."""
    _needs_fsspec_reader()
    marker = tmp_path / "ran"
    poison_metadata(genuine, tmp_path / "bad", marker)
    result = _run(tmp_path, "fsspec_reader", tmp_path / "bad", hardened=False)
    assert result["defect"] == "absent", result
    assert marker.exists()


def test_hardened_refuses_a_poisoned_non_tensor_item(tmp_path: Path) -> None:
    """Items are torch.save'd and read by torch.load(weights_only=False): hardened refuses."""
    marker = tmp_path / "ran"
    save(tmp_path / "bad", state(extra=Payload(marker)))
    result = _run(tmp_path, "load_item", tmp_path / "bad")
    assert not marker.exists()
    assert not result["ok"] and "system refused" in result["error"], result
    # issue 38 item 7: the item's key and its data file are named, and the error DCP raises
    # (torch's CheckpointException, a BaseException) is compatshim's too
    assert "DCP item 'extra' in " in result["error"] and ".distcp" in result["error"], result
    assert result["type"] == "CheckpointException", result
    assert result["compatshim_error"] and result["exception"], result


def test_dcp_to_torch_save_refuses_a_poisoned_metadata_and_converts_a_genuine_one(
    genuine: Path, tmp_path: Path
) -> None:
    pytest.importorskip("torch.distributed.checkpoint.format_utils")
    result = _run(tmp_path, "to_torch_save", genuine, tmp_path / "out.pt")
    assert result["ok"] and result["values"] == _expected(), result
    marker = tmp_path / "ran"
    poison_metadata(genuine, tmp_path / "bad", marker)
    result = _run(tmp_path, "to_torch_save", tmp_path / "bad", tmp_path / "bad.pt")
    assert not marker.exists()
    assert not result["ok"] and "system refused" in result["error"], result


@pytest.mark.parametrize("safe_load", ["0", "1"])
def test_the_doctor_row_says_it_is_off_unless_hardened(
    monkeypatch: pytest.MonkeyPatch, safe_load: str
) -> None:
    from compatshim._records import PatchStatus
    from compatshim.doctor import patch_row

    monkeypatch.setenv("COMPATSHIM_SAFE_LOAD", safe_load)
    absent = PatchStatus(
        name="torch-dcp-safe-metadata",
        description="...",
        distribution="torch",
        installed_version="2.15.0",
        requires=">=2.1",
        tested=">=2.1,<2.16",
        range_position="tested",
        armed=True,
        disabled=False,
        targets=["torch.distributed.checkpoint.filesystem"],
        targets_imported=["torch.distributed.checkpoint.filesystem"],
        defect="absent",
        applied=False,
        applied_targets=[],
        fixed=None,
    )
    row = patch_row(absent)
    assert ("off unless COMPATSHIM_SAFE_LOAD=1" in row.detail) == (safe_load == "0"), row.detail
    # off: the breakage is present (pickle.load of .metadata), its fix opt-in; on and the
    # probe finding nothing: absent
    assert row.present is (safe_load == "0") and row.extra.get("opt_in", False) is row.present


@pytest.mark.parametrize("outside", ["../genuine/__0_0.distcp", "/etc/hostname"])
def test_hardened_refuses_a_data_file_outside_the_folder(
    genuine: Path, tmp_path: Path, outside: str
) -> None:
    """torch joins a ``relative_path`` to the folder as it is: ``../x`` or an absolute path
    made DCP read any file, hardened or not (issue 37). Hardened, the ``.metadata`` that
    says so is refused; the genuine folder, whose files are plain names, is not."""
    import dataclasses
    import pickle
    import shutil

    moved = tmp_path / "moved"
    shutil.copytree(genuine, moved)
    metadata = pickle.loads((genuine / ".metadata").read_bytes())  # our own genuine file
    metadata.storage_data = {
        key: dataclasses.replace(info, relative_path=outside)
        for key, info in metadata.storage_data.items()
    }
    (moved / ".metadata").write_bytes(pickle.dumps(metadata))
    result = _run(tmp_path, "reader", moved)
    assert not result["ok"] and "outside the checkpoint folder" in result["error"], result
    assert _run(tmp_path, "reader", genuine)["ok"]


@pytest.mark.parametrize("kind", ["PurePosixPath", "numpy.str_", "file link", "folder link"])
def test_hardened_refuses_a_data_file_that_escapes_another_way(
    genuine: Path, tmp_path: Path, kind: str
) -> None:
    """Found by an attacker's audit: a ``relative_path`` that is no ``str``
    (``PurePosixPath("../x")``, ``numpy.str_``: the check read only ``str``), or a data file
    or folder in the checkpoint that is a link out of it: hardened dcp.load read the other
    folder's tensors, and scan disagreed (unreadable, or loadable)."""
    import dataclasses
    import os
    import pathlib
    import pickle
    import shutil

    secret = tmp_path / "secret"
    shutil.copytree(genuine, secret)
    victim = tmp_path / "victim"
    shutil.copytree(genuine, victim)
    metadata = pickle.loads((genuine / ".metadata").read_bytes())  # our own genuine file
    if kind in ("PurePosixPath", "numpy.str_"):
        np = pytest.importorskip("numpy")
        wrap = pathlib.PurePosixPath if kind == "PurePosixPath" else np.str_
        metadata.storage_data = {
            key: dataclasses.replace(info, relative_path=wrap(f"../secret/{info.relative_path}"))
            for key, info in metadata.storage_data.items()
        }
        (victim / ".metadata").write_bytes(pickle.dumps(metadata))
    elif kind == "file link":
        for data in victim.glob("*.distcp"):
            data.unlink()
            os.symlink(secret / data.name, data)
    else:
        for data in victim.glob("*.distcp"):
            data.unlink()
        os.symlink(secret, victim / "sub")
        metadata.storage_data = {
            key: dataclasses.replace(info, relative_path=f"sub/{info.relative_path}")
            for key, info in metadata.storage_data.items()
        }
        (victim / ".metadata").write_bytes(pickle.dumps(metadata))
    result = _run(tmp_path, "reader", victim)
    assert not result["ok"], result
    said = "not a str as torch writes it" if "Path" in kind or "str_" in kind else "a link out"
    assert said in result["error"], result
    from compatshim.checkpoint import inspect

    assert inspect(victim).severity == "dangerous"


@pytest.mark.parametrize("kind", ["overlap", "outside"])
def test_hardened_refuses_chunks_that_overlap_or_leave_their_tensor(
    genuine: Path, tmp_path: Path, kind: str
) -> None:
    """Chunks that overlap make DCP read (and, through a transform, decompress) the tensor's
    bytes once per chunk; every save's chunks tile their tensor. Hardened, refused."""
    import dataclasses
    import pickle
    import shutil

    crafted = tmp_path / "crafted"
    shutil.copytree(genuine, crafted)
    metadata = pickle.loads((genuine / ".metadata").read_bytes())  # our own genuine file
    fqn, entry = next(
        (k, v) for k, v in metadata.state_dict_metadata.items() if hasattr(v, "chunks")
    )
    chunk = entry.chunks[0]
    if kind == "overlap":
        entry.chunks = [chunk, chunk, chunk]
    else:
        grown = torch.Size(d + 1 for d in chunk.sizes)
        entry.chunks = [dataclasses.replace(chunk, sizes=grown)]
    (crafted / ".metadata").write_bytes(pickle.dumps(metadata))
    result = _run(tmp_path, "reader", crafted)
    assert not result["ok"], result
    said = "they overlap" if kind == "overlap" else "lies outside the tensor's size"
    assert said in result["error"] and fqn in result["error"], result


def test_hardened_refuses_a_list_shared_by_every_entry_before_torch_walks_it(
    tmp_path: Path,
) -> None:
    """One TensorStorageMetadata, 1,000 chunks, shared by 10,000 fqns through memo reads
    (a 200 KB file): torch's reader hands it on and its load planner then walks 10**7
    chunks. Hardened, the read counts each use against the file's budget and refuses it."""
    folder = shared_lists(tmp_path / "shared", "chunks")
    result = _run(tmp_path, "reader", folder)
    assert not result["ok"] and result["compatshim_error"], result
    # its 1,000 chunks also lie outside their tensor: whichever check meets it first
    assert "work budget" in result["error"] or "lies outside the tensor" in result["error"]
    plain = _run(tmp_path, "reader", folder, hardened=False)
    assert plain["ok"], plain  # torch's own read takes it: the cost comes after


def test_wrappers_a_library_put_on_after_install_survive_uninstall(
    genuine: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Uninstall keeps the library's wrappers; ours under them then act as torch's functions
    (torch's view of an item, no bound on a transformed stream), and a DCP load through them
    is torch's. Installing again wraps the library's wrappers, not the leftovers under them."""
    import io

    from torch.distributed.checkpoint import default_planner, filesystem

    import compatshim
    from compatshim._engine.patching import in_force
    from tests.checkpoint.dcp_kit import load, template
    from tests.harness.catalogue import a_library_wraps

    patch = "torch-dcp-safe-metadata"
    targets = [
        (filesystem, "_create_file_view"),
        (default_planner.DefaultLoadPlanner, "load_bytes"),
    ]
    if "_StorageReaderTransforms" in vars(filesystem):  # torch 2.8+
        targets.append((filesystem._StorageReaderTransforms, "transform_load_stream"))
        targets.append((filesystem.FileSystemReader, "set_up_storage_reader"))
    torchs = {name: vars(owner)[name] for owner, name in targets}
    monkeypatch.setenv("COMPATSHIM_SAFE_LOAD", "1")
    compatshim.uninstall([patch])
    compatshim.install(include=[patch])
    try:
        ours = {name: vars(owner)[name] for owner, name in targets}
        assert all(in_force(function) for function in ours.values()), ours
        libraries = {name: a_library_wraps(owner, name) for owner, name in targets}
        compatshim.uninstall([patch])
        assert {name: vars(owner)[name] for owner, name in targets} == libraries
        with open(genuine / ".metadata", "rb") as file:
            view = filesystem._create_file_view(file, 0, 4)
            assert not isinstance(view, io.BufferedReader), view  # torch's _ReaderView
        got = template()
        load(genuine, got)
        assert torch.equal(got["model"]["w"], state()["model"]["w"]) and got["step"] == 7
        compatshim.install(include=[patch])
        for owner, name in targets:
            again = vars(owner)[name]
            assert in_force(again) and again.__compatshim_original__ is libraries[name], name
        compatshim.uninstall([patch])
        assert {name: vars(owner)[name] for owner, name in targets} == libraries
    finally:
        compatshim.uninstall([patch])
        for owner, name in targets:
            setattr(owner, name, torchs[name])


def test_applied_twice_by_hand_with_a_library_wrapping_between_nests_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``apply`` twice by hand on each target, another library wrapping ours in between
    (``functools.wraps``): the second apply changes nothing (no LookupError, no wrapper of
    ours over the library's, so a refusal names its item once), and the probe finds the fix
    in force through the library's wrapper (status() would otherwise say fixed=False)."""
    import functools
    import importlib
    import types

    from compatshim._engine.patching import Patcher
    from compatshim.checkpoint.errors import UnsafeCheckpointError
    from compatshim.patches import torch_dcp_safe_metadata as fix

    monkeypatch.setenv("COMPATSHIM_SAFE_LOAD", "1")
    modules = [
        importlib.import_module(f"torch.distributed.checkpoint.{name}")
        for name in ("default_planner", "utils", "filesystem")
    ]
    planner, filesystem = modules[0], modules[2]
    before = {id(module): dict(vars(module)) for module in modules}
    loader = planner.DefaultLoadPlanner
    owned = [(loader, "load_bytes"), (filesystem.FileSystemReader, "set_up_storage_reader")]
    if "_StorageReaderTransforms" in vars(filesystem):  # torch 2.8+
        owned.append((filesystem._StorageReaderTransforms, "transform_load_stream"))
    saved = [(owner, name, vars(owner).get(name)) for owner, name in owned]

    def refusing(self: Any, read_item: Any, value: Any) -> Any:  # torch's, meeting a refusal
        raise UnsafeCheckpointError("refused builtins.eval", ("builtins.eval",))

    monkeypatch.setattr(loader, "load_bytes", refusing)
    first, second = Patcher(), Patcher()
    try:
        for module in modules:
            fix.apply(module, first)
        ours = vars(loader)["load_bytes"]

        @functools.wraps(ours)
        def library(*args: Any, **kwargs: Any) -> Any:
            return ours(*args, **kwargs)

        loader.load_bytes = library
        assert not fix.probe(planner)  # ours is in force under the library's
        shown = {id(module): dict(vars(module)) for module in modules}
        for module in modules:
            fix.apply(module, second)
        assert not second, "the second apply changed something"
        assert vars(loader)["load_bytes"] is library
        assert {id(module): dict(vars(module)) for module in modules} == shown
        item = types.SimpleNamespace(dest_index=types.SimpleNamespace(fqn="model.w"))
        with pytest.raises(UnsafeCheckpointError) as refused:
            loader.load_bytes(None, item, None)
        assert str(refused.value) == "DCP item 'model.w': refused builtins.eval"
    finally:
        second.revert()
        first.revert()
        for owner, name, value in saved:
            if value is not None:
                setattr(owner, name, value)
    assert {id(module): dict(vars(module)) for module in modules} == before
