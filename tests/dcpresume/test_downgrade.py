"""A DCP folder written by a newer torch, rewritten for an older one (issue 39 item 3).

torch 2.3-2.13 cannot read a 2.15 ``.metadata`` ("too many values to unpack":
``TensorProperties.strides``), nor 2.2 any 2.3+ one (``_MEM_FORMAT_ENCODING``).
``compatshim.checkpoint.downgrade_dcp`` writes a new folder the older release reads
with its plain ``dcp.load``. Checked three ways: the committed 2.15 fixtures rewritten
for the running torch and loaded here; a folder saved now by the newest tox env's
interpreter, rewritten, and loaded by every older env's interpreter (where the envs
sit beside this one, or under ``DCPRESUME_TOX_DIR``); and crafted folders for each
refusal.
"""

from __future__ import annotations

import builtins
import dataclasses
import io
import os
import pickle
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed.checkpoint.state_dict")  # torch >= 2.2

import torch.distributed.checkpoint as dcp  # noqa: E402

from compatshim.checkpoint import (  # noqa: E402
    DowngradeError,
    UnsafeCheckpointError,
    downgrade_dcp,
    plan_resume,
)
from compatshim.checkpoint._dcp_folder import load_folder_metadata  # noqa: E402
from compatshim.checkpoint._dcp_records import Folder, Size, Storage, Tensor, read_folder  # noqa: E402
from compatshim.checkpoint._downgrade import RELEASES, _emit, _Pickler, release_row  # noqa: E402
from compatshim.checkpoint.errors import CheckpointError  # noqa: E402
from compatshim.cli import main as cli  # noqa: E402
from tests.checkpoint.dcp_kit import shared_lists  # noqa: E402
from tests.dcpresume.optim_job import dcp_kwargs, one_rank_group  # noqa: E402
from tests.dcpresume.test_optim_releases import RUNNING, _refused_by_torch  # noqa: E402
from tests.harness.dtypes import saves  # noqa: E402

pytestmark = pytest.mark.timeout(300)
ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "dcpresume" / "fixtures" / "torch2.15.0" / "adamw"
HERE = ".".join(map(str, RUNNING[:2]))


@pytest.fixture()
def group(tmp_path: Path) -> Any:
    with one_rank_group(tmp_path / "store"):
        yield


def _model_equal(folder: Path, want: dict[str, Any]) -> None:
    state = {"model": {k: torch.zeros_like(v) for k, v in want["model"].items()}}
    dcp.load(state, **dcp_kwargs(folder))
    for key, value in want["model"].items():
        assert torch.equal(state["model"][key], value), key


@pytest.mark.usefixtures("group")
@pytest.mark.parametrize("form", ["dcp-nested", "dcp-flat"])
def test_a_2_15_fixture_rewritten_for_this_torch_loads_with_plain_dcp(
    tmp_path: Path, form: str
) -> None:
    src = FIXTURE / form
    want = torch.load(FIXTURE / "plain.pt", weights_only=True)
    before = (src / ".metadata").read_bytes()
    refused = _refused_by_torch("2.15.0", lambda: _model_equal(src, want), plain=True)
    report = downgrade_dcp(src, tmp_path / "old", torch=HERE)
    _model_equal(tmp_path / "old", want)
    assert (src / ".metadata").read_bytes() == before, "the input folder is never changed"
    for name in report.files:  # hard links: no data read or copied
        assert os.path.samefile(src / name, tmp_path / "old" / name)
    if refused:  # the rewrite says what it dropped
        assert any("strides" in c or "TensorProperties" in c for c in report.changes)


def _interpreters() -> list[tuple[tuple[int, ...], str]]:
    """(torch release, python) of each dcpresume tox env beside this one."""
    where = os.environ.get("DCPRESUME_TOX_DIR") or str(Path(sys.executable).parents[2])
    found = []
    for python in sorted(Path(where).glob("dcpresume-torch*/bin/python")):
        out = subprocess.run(
            [str(python), "-c", "from importlib.metadata import version; print(version('torch'))"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        if out.returncode == 0:
            release = tuple(int(p) for p in out.stdout.strip().split("+")[0].split(".")[:2])
            found.append((release, str(python)))
    return sorted(found)


def _job(python: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [python, "-m", "tests.dcpresume.downgrade_job", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip


@pytest.mark.timeout(900)  # one interpreter start per env: over 300 s for 5 envs on 2 busy cores
def test_saved_by_the_newest_env_loaded_by_every_older_one(tmp_path: Path) -> None:
    """dtypes, a transposed and a channels_last tensor, nested dicts and a non-tensor item,
    saved by torch 2.15, read by 2.2/2.4/2.8/2.11 with plain ``dcp.load`` after the rewrite."""
    if RUNNING[:2] < (2, 14) and "DCPRESUME_TOX_DIR" not in os.environ:  # before asking around
        pytest.skip("run once, by the newest env (or with DCPRESUME_TOX_DIR set)")
    envs = _interpreters()
    if len(envs) < 2 or envs[-1][0] < (2, 14):
        pytest.skip("needs a dcpresume tox env with torch 2.14+ and an older one beside it "
                    "(or DCPRESUME_TOX_DIR naming their folder)")  # fmt: skip
    if RUNNING[:2] < envs[-1][0] and "DCPRESUME_TOX_DIR" not in os.environ:
        pytest.skip("run once, by the newest env (or with DCPRESUME_TOX_DIR set)")
    python = envs[-1][1]
    saved = tmp_path / "new"
    out = _job(python, "save", str(saved))
    assert out.returncode == 0, out.stderr[-2000:]
    # older releases only: an env with the newest torch on another Python reads it itself
    for release, older in [env for env in envs[:-1] if env[0] < envs[-1][0]]:
        name = ".".join(map(str, release))
        plain = _job(older, "load", str(saved))  # torch's own reader fails first
        assert plain.returncode != 0
        # 2.9-2.11 say only "metadata is None" (compatshim's torch-dcp-metadata-error says why)
        whys = ("too many values to unpack", "_MEM_FORMAT_ENCODING", "metadata is None")
        assert any(why in plain.stderr for why in whys), plain.stderr[-2000:]
        dst = tmp_path / f"for{name}"
        report = downgrade_dcp(saved, dst, torch=name)
        (tmp_path / f"for{name}.pt").write_bytes((tmp_path / "new.pt").read_bytes())
        out = _job(older, "load", str(dst))
        assert out.returncode == 0, f"torch {name}: {out.stderr[-3000:]}"
        assert "tensors equal" in out.stdout
        if release < (2, 3):  # the rewrite once only noted that 2.2 would miss meta
            whole = "meta: written whole into __compatshim_whole.distcp from its 2 entries"
            assert any(c.startswith(whole) for c in report.changes), report.changes
        assert "meta equal" in out.stdout


class _Counted:
    """A data file opened by the code under test: each byte it hands out, counted."""

    def __init__(self, file: Any, log: list[int]) -> None:
        self._file, self._log = file, log

    def read(self, *args: Any) -> bytes:
        data: bytes = self._file.read(*args)
        self._log.append(len(data))
        return data

    def readinto(self, buffer: Any) -> int | None:
        done: int | None = self._file.readinto(buffer)
        self._log.append(done or 0)
        return done

    def __getattr__(self, name: str) -> Any:
        return getattr(self._file, name)

    def __enter__(self) -> _Counted:
        return self

    def __exit__(self, *exc: object) -> None:
        self._file.close()


def test_the_rewrite_and_the_dry_run_read_no_tensor_data(
    tmp_path: Path, group: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 39's speed clause in bytes, not in time: a rewrite for 2.3+ opens no data file
    (they are linked), and the dry run and a rewrite for 2.2 read the non-tensor items'
    bytes and nothing else (the 4 MiB tensor is never read). Every open of a ``.distcp``
    file, by name or by descriptor, is seen."""
    src = tmp_path / "src"
    sched = {"last_epoch": 3, "lrs": [0.1, 0.01]}
    dcp.save({"w": torch.randn(1024, 1024), "sched": sched}, **dcp_kwargs(src, save=True))
    records = read_folder(src)
    items = sum(
        s.info["length"] for s in records.storage if records.entries[s.index["fqn"]] is None
    )
    tensors = sum(s.info["length"] for s in records.storage) - items
    assert tensors >= 4 * 2**20 > 100 * items
    read: list[int] = []
    opened: list[str] = []
    real_open, real_os_open = builtins.open, os.open
    inside = []  # an open()'s own opener (checkpoint's open_regular) calls os.open: that open

    def spy_open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        inside.append(file)
        try:
            handle = real_open(file, mode, *args, **kwargs)
        finally:
            inside.pop()
        if str(file).endswith(".distcp") and "r" in mode:
            opened.append(str(file))
            return _Counted(handle, read)
        return handle

    def spy_os_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        mine = inside and inside[-1] == path
        if not mine and str(path).endswith(".distcp") and flags & (os.O_WRONLY | os.O_RDWR) == 0:
            opened.append(str(path))
            read.append(tensors)  # read through a descriptor: counted as the worst case
        return real_os_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", spy_open)
    monkeypatch.setattr(io, "open", spy_open)
    monkeypatch.setattr(os, "open", spy_os_open)
    downgrade_dcp(src, tmp_path / "for2.4", torch="2.4")
    assert (opened, read) == ([], []), "the rewrite for 2.4 links the data files, unread"
    template = {"w": torch.zeros(1024, 1024), "sched": {"last_epoch": 0, "lrs": [0.0, 0.0]}}
    plan = plan_resume(src, template)
    # torch 2.2's plain dcp.load reads the top-level sched and puts the template's back
    assert plan.ok if RUNNING[:2] >= (2, 3) else plan.dropped == ("sched",), plan.text()
    assert 0 < sum(read) <= items, (opened, read)
    if RUNNING[:2] >= (2, 3):  # where torch saves the scheduler entry by entry
        read.clear()
        report = downgrade_dcp(src, tmp_path / "for2.2", torch="2.2")
        assert any(c.startswith("sched: written whole") for c in report.changes), report.changes
        assert 0 < sum(read) <= items, (opened, read)


# ------------------------------------------------------------------ crafted folders


def _craft(folder: Path, records: Folder, row: int = -1) -> Path:
    """``records`` written as a ``.metadata`` of ``RELEASES[row]``'s format, data files linked."""
    folder.mkdir()
    data, _ = _emit(records, RELEASES[row])
    (folder / ".metadata").write_bytes(data)
    for storage in records.storage:
        name = storage.info["relative_path"]
        if not (folder / name).exists() and (Path(records.path) / name).exists():
            os.link(Path(records.path) / name, folder / name)
    return folder


@pytest.mark.parametrize(
    ("dtype", "older", "newer"),
    [
        ("uint16", "2.2", "2.8"),  # torch 2.3+
        ("float8_e4m3fn", "2.1", "2.2"),  # saved with _rebuild_tensor_v3, which 2.1 lacks
        ("complex32", "2.1", "2.2"),
    ],
)
def test_a_dtype_the_older_release_lacks_is_refused_by_name(
    tmp_path: Path, dtype: str, older: str, newer: str
) -> None:
    records = read_folder(FIXTURE / "dcp-nested")
    tensor = records.entries["model.0.weight"]
    assert tensor is not None
    tensor.dtype = dtype
    src = _craft(tmp_path / "src", records)
    with pytest.raises(DowngradeError, match=rf"{dtype} \(model\.0\.weight\).*torch {older}"):
        downgrade_dcp(src, tmp_path / "old", torch=older)
    assert not (tmp_path / "old").exists(), "nothing is written when refused"
    downgrade_dcp(src, tmp_path / "ok", torch=newer)
    assert read_folder(tmp_path / "ok").entries["model.0.weight"].dtype == dtype  # type: ignore[union-attr]


@pytest.mark.parametrize("older", ["2.4", "2.2"])  # 2.2: before its whole items are read
def test_transformed_data_is_refused_before_2_8_and_kept_after(tmp_path: Path, older: str) -> None:
    records = read_folder(FIXTURE / "dcp-nested")
    records.storage[0].info["transform_descriptors"] = ["stream.zstd"]
    fqn = records.storage[0].index["fqn"]
    src = _craft(tmp_path / "src", records)
    with pytest.raises(DowngradeError, match="transform_descriptors"):
        downgrade_dcp(src, tmp_path / "old", torch=older)
    assert not (tmp_path / "old").exists(), "nothing is written when refused"
    downgrade_dcp(src, tmp_path / "new", torch="2.8")
    kept = [s for s in read_folder(tmp_path / "new").storage if s.index["fqn"] == fqn]
    assert kept[0].info["transform_descriptors"] == ["stream.zstd"]


def test_records_whose_memo_read_is_the_byte_percent_are_written_as_they_are(
    tmp_path: Path,
) -> None:
    """The rewrite puts each storage entry's values into its bytes with ``%``; a global
    named 38th is fetched by ``h%`` (31 dtypes put MetadataIndex there), which a template
    without escaping would read as a format. The running torch's own ``pickle.load``
    reads every entry, and so does the hardened read."""
    row = release_row(torch.__version__)
    names = sorted(n for n in row.dtypes if isinstance(getattr(torch, n, None), torch.dtype))
    entries: dict[str, Tensor | None] = {
        f"t.{name}": Tensor(name, "torch.strided", False, 0, False, None, (2,), [((0,), (2,))])
        for name in names[:31]
    }
    storage = [
        Storage({"fqn": fqn, "offset": Size((0,)), "index": 0},
                {"relative_path": "__0_0.distcp", "offset": 8 * at, "length": 8})
        for at, fqn in enumerate(entries)
    ]  # fmt: skip
    planner = {fqn: ("t", fqn[2:], 0) for fqn in entries}
    folder = Folder(str(tmp_path), entries, planner, storage, storage_meta=None)
    data, _ = _emit(folder, row)
    assert b"h%" in data  # MetadataIndex, named 38th, fetched again
    metadata = pickle.loads(data)
    assert {k.fqn: v.offset for k, v in metadata.storage_data.items()} == {
        fqn: 8 * at for at, fqn in enumerate(entries)
    }
    dtypes = {k: v.properties.dtype for k, v in metadata.state_dict_metadata.items()}
    assert dtypes == {f"t.{name}": getattr(torch, name) for name in names[:31]}
    assert metadata.planner_data == planner
    (tmp_path / ".metadata").write_bytes(data)
    again = read_folder(tmp_path)
    fields = 6 if row.strides else 5  # torch 2.14+ pickles strides, None here
    written = {fqn: dataclasses.replace(t, fields=fields) for fqn, t in entries.items() if t}
    assert (again.entries, again.storage, again.planner_data) == (written, storage, planner)


def test_each_items_storage_entry_is_found_in_one_pass() -> None:
    """The dry run and a rewrite for 2.2 ask for the storage entry of every non-tensor item:
    each lookup rescanned ``storage_data`` (20,000 items: 5.9 s on the 2-core box); now one
    index. The first entry of an fqn wins, as before, and a copy made by
    ``dataclasses.replace`` with other storage indexes its own."""
    storage = [
        Storage({"fqn": f"extra.k{i}"}, {"relative_path": "__0_0.distcp", "offset": i, "length": 1})
        for i in range(20_000)
    ]
    entries: dict[str, Any] = {s.index["fqn"]: None for s in storage}
    folder = Folder(path="", entries=entries, planner_data=None, storage=storage, storage_meta=None)
    start = time.perf_counter()
    assert all(folder.storage_for(s.index["fqn"]) is s for s in storage)
    assert time.perf_counter() - start < 2
    later = Storage({"fqn": "extra.k0"}, {"relative_path": "x", "offset": 0, "length": 1})
    new = Storage({"fqn": "new"}, {"relative_path": "x", "offset": 0, "length": 1})
    again = dataclasses.replace(folder, storage=[*storage, later, new])
    assert again.storage_for("extra.k0") is storage[0]
    assert again.storage_for("new") is new and folder.storage_for("new") is None


def _raw(folder: Path, write: Any) -> Path:
    folder.mkdir()
    out = _Pickler()
    write(out)
    (folder / ".metadata").write_bytes(out.finish())
    return folder


def test_a_poisoned_metadata_runs_nothing_and_writes_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "ran"

    def poison(out: _Pickler) -> None:
        out.raw(out.ref("os.system") + out.encode((f"touch {marker}",)) + b"R")

    src = _raw(tmp_path / "src", poison)
    with pytest.raises(UnsafeCheckpointError, match=r"os\.system"):
        downgrade_dcp(src, tmp_path / "old", torch="2.8")
    assert not marker.exists() and not (tmp_path / "old").exists()
    assert cli(["dcp-downgrade", str(src), str(tmp_path / "old"), "--torch", "2.8"]) == 1


def test_a_release_that_is_no_number_names_the_option(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--torch banana`` said "torch: expected a release such as '2.8'" (the Python
    argument's name); the command's option is ``--torch``."""
    assert cli(["dcp-downgrade", str(tmp_path), str(tmp_path / "old"), "--torch", "banana"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("compatshim dcp-downgrade: --torch: expected a release such as '2.8'")
    assert not (tmp_path / "old").exists()


def test_a_poisoned_item_saved_whole_for_2_2_runs_nothing_and_writes_nothing(
    tmp_path: Path,
) -> None:
    """For 2.1/2.2 the rewrite reads the non-tensor items it saves whole: hardened, so a
    payload among them is refused before anything is written (2.3+ targets never read them)."""
    from tests.checkpoint.test_hardened import Payload

    if RUNNING[:2] < (2, 3):
        pytest.skip("this torch saves a dict without tensors as one item: nothing to read")
    marker = tmp_path / "MARKER"
    src = tmp_path / "src"
    state = {"w": torch.ones(2), "meta": {"epoch": 3, "evil": Payload(marker)}}
    dcp.save(state, **dcp_kwargs(src, save=True))
    with pytest.raises(UnsafeCheckpointError, match=r"system"):
        downgrade_dcp(src, tmp_path / "old", torch="2.2")
    assert not marker.exists() and not (tmp_path / "old").exists()
    report = downgrade_dcp(src, tmp_path / "new", torch="2.8")  # entries kept, never read
    assert not marker.exists() and not any("written whole" in c for c in report.changes)


def test_a_folder_rewritten_for_2_2_can_be_rewritten_again(tmp_path: Path) -> None:
    """An unlucky user rewrites the rewrite (for 2.1, or 2.2 again): the items already saved
    whole stay as they are, and their file is carried over (it was refused as a clash)."""
    if RUNNING[:2] < (2, 3):
        pytest.skip("this torch saves a dict without tensors as one item: nothing to merge")
    src = tmp_path / "src"
    dcp.save({"w": torch.ones(2), "sched": {"last_epoch": 3}}, **dcp_kwargs(src, save=True))
    first = downgrade_dcp(src, tmp_path / "for2.2", torch="2.2")
    again = downgrade_dcp(tmp_path / "for2.2", tmp_path / "for2.1", torch="2.1")
    assert any(c.startswith("sched: written whole") for c in first.changes), first.changes
    assert not any("written whole" in c for c in again.changes), again.changes
    assert "__compatshim_whole.distcp" in again.files
    name = "__compatshim_whole.distcp"
    assert (tmp_path / "for2.1" / name).read_bytes() == (tmp_path / "for2.2" / name).read_bytes()
    assert "sched" in read_folder(tmp_path / "for2.1").entries


@pytest.mark.parametrize("shared", ["route", "chunks", "chunk", "sizes"])
def test_a_list_shared_by_every_entry_is_charged_at_each_use(tmp_path: Path, shared: str) -> None:
    """One route tuple for every planner_data key, or one TensorStorageMetadata (with its
    chunk list) for every fqn, each written once and fetched again by a memo read: a
    200 KB file that the walk would take 10**8 steps over, and the rewrite write out
    10**8 times; or one chunk listed again 10,000 times (torch: 10,000 read items from
    40 KB); or 10,000 chunks sharing one torch.Size, 16 bytes each (160 KB: one read item
    per 16 bytes, which the chunks' budget let through at one per 8). Refused by the read's
    budget, fast, before anything is written; so is the hardened read ``dcp.load`` uses,
    which handed torch's planner the shared lists."""
    src = shared_lists(tmp_path / "src", shared)
    assert (src / ".metadata").stat().st_size < 400_000
    walk = "walking planner_data's routes" if shared == "route" else "'t.*': walking its chunk"
    start = time.perf_counter()
    with pytest.raises(CheckpointError, match=f"{walk}.* goes over the work budget"):
        read_folder(src)
    with pytest.raises(CheckpointError, match=f"{walk}.* goes over the work budget"):
        downgrade_dcp(src, tmp_path / "old", torch="2.4")
    with pytest.raises(CheckpointError, match=f"{walk}.* goes over the work budget"):
        load_folder_metadata(src)
    assert time.perf_counter() - start < 10
    assert not (tmp_path / "old").exists()


def test_what_torch_writes_costs_well_under_the_budget_per_byte(monkeypatch: Any) -> None:
    """The budget is 8 per byte of the file, with a floor for small files: what torch itself
    writes must cost well under that per byte, or a large job's ``.metadata`` is refused
    once past the floor. The records reader charged 512 per record and per torch.Size,
    13.5-20 per byte of these files: the dry run and the rewrite refused a real 7B FSDP
    checkpoint with optimizer state on 64 ranks (about 60,000 chunks, 8 MB)."""
    from compatshim.checkpoint import _dcp_records, _limits, _load

    made: list[_limits.Budget] = []

    class Kept(_limits.Budget):
        def __init__(self, size: int, floor: int = _limits.BUDGET_FLOOR) -> None:
            super().__init__(size, floor)
            made.append(self)

    monkeypatch.setattr(_dcp_records, "Budget", Kept)
    monkeypatch.setattr(_load, "Budget", Kept)
    monkeypatch.setattr(_limits, "Budget", Kept)  # Walks' own, for the chunks
    spent: dict[str, list[float]] = {"records": [], "hardened": []}
    files = sorted((ROOT / "tests" / "dcpresume" / "fixtures").rglob(".metadata"))
    for metadata in files:  # written by torch 2.2.2, 2.4.1, 2.8.0, 2.11.0 and 2.15.0
        for reader, read in (("records", read_folder), ("hardened", load_folder_metadata)):
            made.clear()
            try:
                read(metadata.parent)
            except CheckpointError:  # the hardened read: a newer torch's classes than this one
                assert reader == "hardened"
                continue
            spent[reader].append((made[0].total - made[0].left) / metadata.stat().st_size)
            uses = [b for b in made if b.total == _limits.BUDGET_PER_BYTE * b.file_size]
            assert len(uses) == 1 and uses[0].left > uses[0].total / 2, reader  # chunks
    assert len(spent["records"]) == len(files) > 30 and spent["hardened"], spent
    assert max(spent["records"]) < _limits.BUDGET_PER_BYTE / 2, spent["records"]
    assert max(spent["hardened"]) < _limits.BUDGET_PER_BYTE * 3 / 4, spent["hardened"]


def test_a_field_no_known_release_has_is_named(tmp_path: Path) -> None:
    def future(out: _Pickler) -> None:
        state = {"state_dict_metadata": {}, "storage_data": {}, "sharding_plan": 1}
        metadata = out.ref("torch.distributed.checkpoint.metadata.Metadata")
        out.raw(metadata + b")\x81" + out.encode(state) + b"b")  # NEWOBJ, BUILD

    src = _raw(tmp_path / "src", future)
    with pytest.raises(CheckpointError, match=r"\['sharding_plan'\].*no torch release"):
        downgrade_dcp(src, tmp_path / "old", torch="2.8")


def test_a_data_file_outside_the_folder_is_refused(tmp_path: Path) -> None:
    records = read_folder(FIXTURE / "dcp-nested")
    records.storage[0].info["relative_path"] = "../elsewhere.distcp"
    src = _craft(tmp_path / "src", records)
    with pytest.raises(UnsafeCheckpointError, match="outside the checkpoint folder"):
        downgrade_dcp(src, tmp_path / "old", torch="2.8")


@pytest.mark.parametrize("kind", ["overlap", "outside"])
def test_chunks_hardened_dcp_load_refuses_stop_the_rewrite_and_fail_the_dry_run(
    tmp_path: Path, kind: str
) -> None:
    """Chunks that overlap, or lie outside their tensor, are refused by hardened ``dcp.load``
    (DCP would read each element once per chunk). The dry run said "resumes" and the
    rewrite passed them on to the older torch: they read ``.metadata`` with their own
    records reader, which did not check them."""
    records = read_folder(FIXTURE / "dcp-nested")
    fqn, tensor = next((k, t) for k, t in records.entries.items() if t is not None)
    offsets, sizes = tensor.chunks[0]
    if kind == "overlap":
        tensor.chunks = [(offsets, sizes)] * 3
    else:
        tensor.chunks = [(offsets, Size(d + 1 for d in sizes))]
    src = _craft(tmp_path / "src", records)
    said = "they overlap" if kind == "overlap" else "lies outside the tensor's size"
    with pytest.raises(UnsafeCheckpointError, match=said):
        downgrade_dcp(src, tmp_path / "old", torch="2.8")
    assert not (tmp_path / "old").exists()
    plan = plan_resume(src, {fqn.split(".", 1)[0]: {}})
    assert not plan.ok and len(plan.refused) == 1 and said in plan.refused[0], plan.text()
    assert fqn in plan.refused[0]


def test_a_truncated_metadata_is_named_wherever_it_is_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The pickle machine's messages name no file: ``read_folder`` puts the ``.metadata`` path
    before them (once), so dcp-downgrade and resume-check say which file, as inspect does."""
    import shutil

    src = Path(shutil.copytree(FIXTURE / "dcp-nested", tmp_path / "src"))
    meta = src / ".metadata"
    meta.write_bytes(meta.read_bytes()[: meta.stat().st_size // 2])
    with pytest.raises(CheckpointError) as caught:
        read_folder(src)
    assert type(caught.value) is CheckpointError
    assert str(caught.value).startswith(f"{meta}: ") and str(meta) not in str(caught.value)[1:]
    assert cli(["dcp-downgrade", str(src), str(tmp_path / "old"), "--torch", "2.4"]) == 2
    assert f"compatshim dcp-downgrade: {meta}: " in capsys.readouterr().err

    def poison(out: _Pickler) -> None:  # a refusal keeps its type and what it refused
        out.raw(out.ref("os.system") + out.encode(("true",)) + b"R")

    bad = _raw(tmp_path / "bad", poison)
    with pytest.raises(UnsafeCheckpointError) as refused:
        read_folder(bad)
    assert str(refused.value).startswith(f"{bad / '.metadata'}: 'os.system' refused")
    assert refused.value.refused == ("os.system",)


def test_a_wrong_argument_is_named_before_anything_is_made(tmp_path: Path) -> None:
    """``link="no"`` is truthy: it hard-linked and reported ``linked='no'``; a None path was
    os.fspath's bare TypeError."""
    src = FIXTURE / "dcp-nested"
    for call, match in (
        (lambda: downgrade_dcp(src, tmp_path / "a", torch="2.8", link="no"), "link: expected"),
        (lambda: downgrade_dcp(None, tmp_path / "a", torch="2.8"), "src: expected a folder"),
        (lambda: downgrade_dcp(src, None, torch="2.8"), "dst: expected a folder"),
    ):
        with pytest.raises(TypeError, match=match):
            call()
    assert not (tmp_path / "a").exists()


def test_the_new_folder_rules(tmp_path: Path) -> None:
    src = FIXTURE / "dcp-nested"
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(FileExistsError, match="dst"):
        downgrade_dcp(src, tmp_path / "full", torch="2.8")
    with pytest.raises(ValueError, match=r"dst.*is src"):
        downgrade_dcp(src, src, torch="2.8")
    copy = tmp_path / "src"  # inside src: src changed (it was accepted, a folder made there)
    shutil.copytree(src, copy)
    (tmp_path / "alias").symlink_to(copy)
    for inside in (copy / "sub", copy / "a" / "b", tmp_path / "alias" / "sub"):
        with pytest.raises(ValueError, match=r"dst.*is src or lies inside it"):
            downgrade_dcp(copy, inside, torch="2.8")
    assert sorted(p.name for p in copy.iterdir()) == sorted(p.name for p in src.iterdir())
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    with pytest.raises(FileExistsError, match="dst"):  # not a folder: nothing is made there
        downgrade_dcp(src, tmp_path / "dangling", torch="2.8")
    assert not (tmp_path / "nowhere").exists()
    with pytest.raises(DowngradeError, match=r"before torch 2\.1"):
        downgrade_dcp(src, tmp_path / "a", torch="1.13")
    with pytest.raises(ValueError, match="torch: expected a release"):
        downgrade_dcp(src, tmp_path / "a", torch="latest")
    report = downgrade_dcp(src, tmp_path / "copied", torch="2.5.1", link=False)
    assert report.written_as == "2.4" and not report.linked
    for name in report.files:
        assert not os.path.samefile(src / name, tmp_path / "copied" / name)
    assert cli(["dcp-downgrade", str(src), str(tmp_path / "cli"), "--torch", "2.8"]) == 0
    assert (tmp_path / "cli" / ".metadata").is_file()


def test_the_rewrite_names_only_the_target_releases_classes(tmp_path: Path) -> None:
    import pickletools

    for target, home in (("2.2", "torch.distributed._shard.sharded_tensor.metadata"),
                         ("2.8", "torch.distributed.checkpoint.metadata")):  # fmt: skip
        report = downgrade_dcp(FIXTURE / "dcp-nested", tmp_path / target, torch=target)
        data = (tmp_path / target / ".metadata").read_bytes()
        named = {str(arg) for op, arg, _ in pickletools.genops(data) if op.name == "GLOBAL"}
        assert f"{home} TensorProperties" in named
        assert all(n.startswith(("torch ", "torch.")) for n in named), named
        has_meta = "torch.distributed.checkpoint.metadata StorageMeta" in named
        assert has_meta is (target != "2.2"), named
        assert any("strides" in c for c in report.changes)


def test_every_tensors_properties_survive_the_rewrite(tmp_path: Path, group: Any) -> None:
    """The writer reuses the bytes of a TensorProperties, a ``torch.Size`` and a str once
    written: tensors of several dtypes, ``requires_grad`` and shapes, interleaved, come back
    each with its own (read by this torch's plain reader, for its own row)."""
    kinds = [torch.float32, torch.float16, torch.int64, torch.bfloat16, torch.bool]
    state = {
        f"t{i}": torch.zeros(i % 3 + 1, 2, dtype=kinds[i % len(kinds)]).requires_grad_(
            i % 2 == 0 and kinds[i % len(kinds)].is_floating_point
        )
        for i in range(12)
    }
    dcp.save(state, **dcp_kwargs(tmp_path / "src", save=True))
    downgrade_dcp(tmp_path / "src", tmp_path / "out", torch=HERE)
    before = dcp.FileSystemReader(str(tmp_path / "src")).read_metadata().state_dict_metadata
    after = dcp.FileSystemReader(str(tmp_path / "out")).read_metadata().state_dict_metadata
    assert before.keys() == after.keys()
    for key, old in before.items():
        new = after[key]
        assert (new.properties.dtype, new.size) == (old.properties.dtype, old.size), key
        assert new.properties.requires_grad == old.properties.requires_grad, key
        assert [(c.offsets, c.sizes) for c in new.chunks] == [
            (c.offsets, c.sizes) for c in old.chunks
        ], key


def test_a_release_between_rows_is_named_as_asked(tmp_path: Path) -> None:
    records = read_folder(FIXTURE / "dcp-nested")
    tensor = records.entries["model.0.weight"]
    assert tensor is not None
    tensor.dtype = "uint16"
    src = _craft(tmp_path / "src", records)
    with pytest.raises(DowngradeError, match=r"torch 2\.5 \(whose DCP reads as torch 2\.4's\)"):
        downgrade_dcp(src, tmp_path / "old", torch="2.5")


@pytest.mark.skipif(RUNNING[:2] < (2, 3), reason="torch 2.2 saves the dict whole: no merge")
def test_an_entry_the_2_2_merge_refuses_is_named_with_the_way_out(
    tmp_path: Path, group: Any
) -> None:
    """A value hardened mode refuses inside a dict torch 2.2 reads whole: the message names
    the item, not a buffer, and offers what downgrade_dcp takes (no allow=)."""
    import decimal

    dcp.save(
        {"w": torch.ones(2), "cfg": {"x": decimal.Decimal("1.5"), "y": 1}},
        **dcp_kwargs(tmp_path / "src"),
    )
    with pytest.raises(UnsafeCheckpointError) as caught:
        downgrade_dcp(tmp_path / "src", tmp_path / "old", torch="2.2")
    message = str(caught.value)
    assert "item 'cfg.x'" in message and "BytesIO" not in message
    assert "allow=" not in message and "torch 2.4+" in message
    downgrade_dcp(tmp_path / "src", tmp_path / "new", torch="2.4")


def test_a_release_newer_than_the_table_is_written_as_its_newest_row_and_said(
    tmp_path: Path,
) -> None:
    """``--torch 2.16`` (or 3.0) wrote torch 2.15's format and said nothing of it: the table
    does not know that release, so the report says the format is its newest row's, untested."""
    report = downgrade_dcp(FIXTURE / "dcp-nested", tmp_path / "new", torch="2.16")
    assert report.written_as == "2.15"
    assert "torch 2.16 is newer than compatshim's table" in report.changes[0]
    known = downgrade_dcp(FIXTURE / "dcp-nested", tmp_path / "known", torch="2.15")
    assert not any("newer than" in line for line in known.changes)


def _shared_record_metadata(kind: str) -> bytes:
    """A ``.metadata`` sharing one record among many entries by memo reads (2026-12-05
    audit): ``transforms``, one ``_StorageInfo`` whose ``transform_descriptors`` list holds
    100,000 strs, behind 2,000 storage entries (the records reader walked the list at each:
    6 s); ``properties``, one 64-dimension ``TensorStorageMetadata`` behind 140,000 entries of
    7 bytes each (each checked again, uncharged)."""
    import itertools
    import struct

    from tests.checkpoint.corpus import P2, STOP, g, get, put

    def text(value: str) -> bytes:  # SHORT_BINUNICODE: the entries stay a few bytes
        return b"\x8c" + bytes([len(value)]) + value.encode()

    meta = "torch.distributed.checkpoint.metadata"
    out = g(meta, "Metadata") + put(0) + b"0"
    if kind == "transforms":
        out += g(meta, "MetadataIndex") + put(2) + b"0"
        out += g("torch.distributed.checkpoint.filesystem", "_StorageInfo") + put(3) + b"0"
        out += b"}(" + text("fqn") + text("step") + b"u" + put(5) + b"0"
        out += get(3) + b")\x81}(" + text("relative_path") + text("__0_0.distcp")
        out += text("offset") + b"K\x00" + text("length") + b"K\x01"
        out += text("transform_descriptors") + b"](" + text("z") + b"2" * 99_999 + b"eub"
        out += put(4) + b"0" + get(0) + b")\x81}(" + text("state_dict_metadata") + b"}"
        out += text("planner_data") + b"N" + text("storage_data") + b"}("
        out += (get(2) + b")\x81" + get(5) + b"b" + get(4)) * 2_000
        return P2 + out + b"uub" + STOP
    dims = b"K\x01" * 64
    out += g(meta, "TensorStorageMetadata") + put(1) + b"0"
    out += g(meta, "TensorProperties") + put(2) + b"0"
    out += g("torch", "Size") + put(3) + b"0" + get(3) + b"(" + dims + b"t\x85R" + put(4) + b"0"
    out += get(2) + b")\x81(" + g("torch", "float32")
    out += g("torch.serialization", "_get_layout") + text("torch.strided") + b"\x85R\x89"
    out += g(meta, "_MEM_FORMAT_ENCODING") + b"K\x00\x85R\x89(" + dims + b"ttb" + put(5) + b"0"
    out += get(1) + b")\x81}(" + text("properties") + get(5) + text("size") + get(4)
    out += text("chunks") + b"]ub" + put(6) + b"0"
    out += get(0) + b")\x81}(" + text("planner_data") + b"N" + text("storage_data") + b"}"
    out += text("state_dict_metadata") + b"}("
    keys = itertools.product([chr(c) for c in range(0x21, 0x7F)], repeat=3)
    out += b"".join(
        text("".join(k)) + struct.pack("<cI", b"j", 6) for k in itertools.islice(keys, 140_000)
    )
    return P2 + out + b"uub" + STOP


@pytest.mark.parametrize("kind", ["transforms", "properties"])
def test_a_record_shared_by_every_entry_is_paid_at_each_use(tmp_path: Path, kind: str) -> None:
    src = shutil.copytree(FIXTURE / "dcp-nested", tmp_path / "src")
    (Path(src) / ".metadata").write_bytes(_shared_record_metadata(kind))
    for read in (read_folder, lambda f: downgrade_dcp(f, tmp_path / "old", torch="2.8")):
        start = time.process_time()
        with pytest.raises(CheckpointError, match="work budget"):
            read(src)
        assert time.process_time() - start < 1.0


def test_a_data_file_name_no_file_system_holds_is_damage_not_a_crash(tmp_path: Path) -> None:
    """A lone surrogate in ``relative_path`` raised os's UnicodeEncodeError from every reader
    of ``.metadata`` (inspect printed a traceback): now a CheckpointError naming it."""
    records = read_folder(FIXTURE / "dcp-nested")
    records.storage[0].info["relative_path"] = "x/\ud800"
    src = _craft(tmp_path / "src", records, RELEASES.index(release_row(HERE)))  # this torch's
    with pytest.raises(CheckpointError, match="that no file system holds"):
        read_folder(src)
    done = subprocess.run(
        [sys.executable, "-m", "compatshim", "inspect", str(src)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr


def test_keys_from_the_folder_reach_the_terminal_escaped(
    tmp_path: Path, capsys: Any, monkeypatch: Any
) -> None:
    """A DCP key is the file's text. resume-check and dcp-downgrade printed it raw (ESC, CR,
    BEL, U+202E: `inspect` escaped the same keys): one key moved the cursor up, erased the
    WOULD FAIL verdict and the MISSING line, and printed "resumes" in their place."""
    forged = "\x1b[3F\x1b[J\r\x07\u202e"
    src = tmp_path / "src"
    state = {"w": torch.ones(2), "k" + forged: torch.zeros(3), "n" + forged: 7,
             "cfg": {"a" + forged: 1}}  # fmt: skip
    if saves("uint16"):  # a dtype torch 2.2 lacks: the rewrite for 2.2 names the key
        state["u" + forged] = torch.zeros(3, dtype=torch.uint16)
    dcp.save(state, **dcp_kwargs(src, save=True))
    (tmp_path / "forged_state.py").write_text(
        "import torch\ndef state():\n    return {'w': torch.zeros(2), 'bias': torch.zeros(2)}\n"
    )
    monkeypatch.chdir(tmp_path)
    assert cli(["resume-check", str(src), "--state", "forged_state:state"]) == 1
    codes = {
        cli(["dcp-downgrade", str(src), str(tmp_path / t), "--torch", t]) for t in ("2.2", "2.8")
    }
    assert codes <= {0, 1}
    out = capsys.readouterr()
    for text in (out.out, out.err):
        assert not any(char in text for char in "\x1b\r\x07\u202e"), text
    assert "WOULD FAIL" in out.out and "k\\x1b[3F\\x1b[J\\x0d\\x07\\u202e" in out.out
    if saves("uint16"):
        assert "u\\x1b[3F" in out.err
