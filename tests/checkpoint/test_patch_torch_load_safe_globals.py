"""``torch-load-safe-globals``: a weights-only refusal is retried by compatshim's loader.

In-process mechanics on the installed torch; the frameworks' own resume paths
are in tests/resume.
"""

from __future__ import annotations

import argparse
import io
import pickle
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from compatshim._engine.patching import Patcher  # noqa: E402
from compatshim.patches import torch_load_safe_globals as patch  # noqa: E402
from tests.checkpoint.helpers import legacy_bytes  # noqa: E402

PATCH = "torch-load-safe-globals"
DEFAULT_IS_WEIGHTS_ONLY = tuple(int(p) for p in torch.__version__.split(".")[:2]) >= (2, 6)
needs_default = pytest.mark.skipif(
    not DEFAULT_IS_WEIGHTS_ONLY, reason=f"torch {torch.__version__} defaults to weights_only=False"
)


@pytest.fixture
def installed() -> Any:
    import compatshim

    compatshim.uninstall([PATCH])
    original = torch.load
    safe_globals = list(torch.serialization.get_safe_globals()) if DEFAULT_IS_WEIGHTS_ONLY else []
    compatshim.install(include=[PATCH])
    yield compatshim
    compatshim.uninstall([PATCH])
    assert torch.load is original and torch.serialization.load is original
    if DEFAULT_IS_WEIGHTS_ONLY:
        assert torch.serialization.get_safe_globals() == safe_globals


def _saved(obj: Any) -> io.BytesIO:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return buffer


def _retries() -> list[str]:
    from compatshim._engine import decisions

    return [line for line in decisions.recent(PATCH) if ": retried" in line]


def _a_library_wraps_torch_load() -> tuple[Any, Any, Any]:
    """torch's load, compatshim's wrapper in force, and a library's wrapper over that one,
    which this puts on torch.load, as a library that wraps it after compatshim does."""
    original = torch.load.__compatshim_original__
    ours = torch.load

    def theirs(*args: Any, **kwargs: Any) -> Any:
        return ours(*args, **kwargs)

    torch.load = theirs
    return original, ours, theirs


@pytest.fixture
def compatshim_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """One entry per file the patch hands to compatshim's loader."""
    calls: list[int] = []
    real = patch._through_compatshim

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(patch, "_through_compatshim", counted)
    return calls


def test_probe_finds_the_weights_only_default() -> None:
    import compatshim

    compatshim.uninstall([PATCH])
    assert patch.probe(torch) is DEFAULT_IS_WEIGHTS_ONLY


def test_install_twice_wraps_once_and_uninstall_restores(installed: Any) -> None:
    installed.install(include=[PATCH])
    (row,) = [r for r in installed.status() if r.name == PATCH]
    assert row.applied is DEFAULT_IS_WEIGHTS_ONLY
    if DEFAULT_IS_WEIGHTS_ONLY:
        assert row.fixed
        assert torch.load is torch.serialization.load
        assert not hasattr(torch.load.__compatshim_original__, "__compatshim_original__")


@needs_default
def test_uninstall_keeps_a_wrapper_a_library_put_on_after_it(installed: Any) -> None:
    """A library wraps torch.load after compatshim. Uninstall keeps the library's wrapper,
    and compatshim's under it hands every call to torch's load (a Namespace is refused again,
    as torch refuses it). The library then puts back what it found: install wraps torch's own
    function again, not that leftover, and uninstall puts the leftover back."""
    original, ours, theirs = _a_library_wraps_torch_load()
    try:
        installed.uninstall([PATCH])
        assert torch.load is theirs and torch.serialization.load is original
        with pytest.raises(pickle.UnpicklingError):
            torch.load(_saved({"hparams": argparse.Namespace(a=1)}))
        assert not patch.confirm(torch)
        torch.load = ours  # the library unwraps
        installed.install(include=[PATCH])
        assert torch.load is not ours and torch.load.__compatshim_original__ is original
        assert torch.load(_saved({"hparams": argparse.Namespace(a=1)}))["hparams"].a == 1
        (row,) = [r for r in installed.status() if r.name == PATCH]
        assert row.applied and row.fixed, row
        installed.uninstall([PATCH])
        assert torch.load is ours and torch.serialization.load is original
    finally:
        torch.load = original


@needs_default
def test_a_library_wrapper_made_with_functools_wraps_is_not_taken_for_ours(
    installed: Any,
) -> None:
    """functools.wraps copies our marks onto a library's wrapper; a re-install must wrap it,
    not skip past it to torch's function."""
    import functools

    original = torch.load.__compatshim_original__
    calls: list[int] = []

    @functools.wraps(torch.load)
    def theirs(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return original(*args, **kwargs)

    installed.uninstall([PATCH])
    torch.load = theirs
    try:
        installed.install(include=[PATCH])
        assert torch.load is not theirs and torch.load.__compatshim_original__ is theirs
        calls.clear()  # the patch's probe went through it too
        torch.load(_saved({"w": torch.ones(1)}))
        assert calls == [1]
        installed.uninstall([PATCH])
        assert torch.load is theirs
    finally:
        torch.load = original


@needs_default
def test_a_library_wrapper_between_two_of_ours_means_one_retry(
    installed: Any, compatshim_reads: list[int]
) -> None:
    """install, a library wraps torch.load, uninstall, install: torch.load is ours over the
    library's over our retired one. A file both loaders refuse is read by compatshim once,
    warned about once, and the error keeps torch's own wording under compatshim's."""
    calls = compatshim_reads
    original, _, theirs = _a_library_wraps_torch_load()
    try:
        installed.uninstall([PATCH])
        installed.install(include=[PATCH])
        assert torch.load.__compatshim_original__ is theirs
        calls.clear()  # the patch's probe went through it
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with pytest.raises(pickle.UnpicklingError) as raised:
                torch.load(_saved({"x": len}))
        refused = [w for w in caught if issubclass(w.category, patch.CheckpointRefusedWarning)]
        assert len(calls) == 1 and len(refused) == 1, (calls, refused)
        assert str(raised.value).count("compatshim.checkpoint.load:") == 1, str(raised.value)
        assert torch.load(_saved({"hparams": argparse.Namespace(a=2)}))["hparams"].a == 2
        assert len(calls) == 2
        installed.uninstall([PATCH])
    finally:
        torch.load = original


@needs_default
def test_an_apply_that_wraps_nothing_does_not_change_the_mode_in_force(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import compatshim

    monkeypatch.setenv("COMPATSHIM_SAFE_LOAD", "1")
    compatshim.uninstall([PATCH])
    compatshim.install(include=[PATCH])
    try:
        before = list(patch._in_force)
        monkeypatch.delenv("COMPATSHIM_SAFE_LOAD")
        patch.apply(torch, Patcher())  # by hand, over the hardened wrapper in force
        assert patch._in_force == before and patch._mode_in_force() is True
    finally:
        compatshim.uninstall([PATCH])
    assert patch._in_force == []


def test_a_reference_taken_under_an_earlier_install_stays_hardened(
    monkeypatch: pytest.MonkeyPatch, compatshim_reads: list[int]
) -> None:
    """``from torch import load`` while armed, then uninstall and install again: the old
    reference is read by compatshim's loader as the new torch.load is, never torch's."""
    import compatshim

    calls = compatshim_reads
    monkeypatch.setenv("COMPATSHIM_SAFE_LOAD", "1")
    compatshim.uninstall([PATCH])
    compatshim.install(include=[PATCH])
    try:
        old = torch.load
        compatshim.uninstall([PATCH])
        old(_saved({"w": torch.ones(1)}))
        assert calls == [], "uninstalled: the old reference is torch's load again"
        compatshim.install(include=[PATCH])
        assert torch.load is not old
        old(_saved({"w": torch.ones(1)}))
        assert calls == [1], "re-armed: the old reference is hardened again"
    finally:
        compatshim.uninstall([PATCH])


@needs_default
def test_confirm_checks_both_names_are_the_wrapper(installed: Any) -> None:
    assert patch.confirm(torch)
    original = torch.serialization.load.__compatshim_original__
    torch.serialization.load = original  # something put torch's own back on one name
    try:
        assert not patch.confirm(torch)
    finally:
        torch.serialization.load = torch.load


@needs_default
def test_status_confirms_end_to_end_through_the_probe(installed: Any) -> None:
    (row,) = [r for r in installed.status() if r.name == PATCH]
    assert row.applied and row.fixed is True
    assert any("confirmed (torch, by the probe)" in line for line in row.decisions), row.decisions


@needs_default
def test_the_probe_through_the_wrapper_is_named_in_the_decisions(installed: Any) -> None:
    assert patch.probe(torch) is False  # fixed: the wrapper's retry loads the probe checkpoint
    (line, *_) = reversed(_retries())
    assert "the patch's own probe checkpoint" in line and "BytesIO" not in line


@needs_default
def test_refused_types_load_as_saved(installed: Any, tmp_path: Path) -> None:
    np = pytest.importorskip("numpy")
    path = tmp_path / "hparams.ckpt"
    torch.save(
        {"hparams": argparse.Namespace(lr=0.1), "rng": np.random.get_state(), "w": torch.ones(2)},
        path,
    )
    loaded = torch.load(path, map_location="cpu")
    assert type(loaded["hparams"]) is argparse.Namespace and loaded["hparams"].lr == 0.1
    assert (
        np.array_equal(loaded["rng"][1], np.random.get_state()[1]) or loaded["rng"][0] == "MT19937"
    )
    assert torch.equal(loaded["w"], torch.ones(2))
    assert any(str(path) in line for line in _retries())


@needs_default
def test_a_file_object_is_rewound_to_where_it_stood(installed: Any) -> None:
    stream = _saved({"hparams": argparse.Namespace(step=3)})  # torch reads it to the end first
    assert torch.load(stream)["hparams"].step == 3


@needs_default
def test_explicit_weights_only_false_is_left_alone(installed: Any) -> None:
    before = len(_retries())
    loaded = torch.load(_saved({"hparams": argparse.Namespace(a=1)}), weights_only=False)
    assert loaded["hparams"].a == 1 and len(_retries()) == before


@needs_default
def test_a_plain_state_dict_never_retries(installed: Any) -> None:
    before = len(_retries())
    torch.load(_saved(torch.nn.Linear(2, 2).state_dict()))
    assert len(_retries()) == before


class _RunsCode:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> Any:
        return (Path.write_text, (self.marker, "ran"))


@needs_default
@pytest.mark.parametrize("warnings_are_errors", [False, True])
def test_refused_by_both_raises_torchs_error_and_warns(
    installed: Any, tmp_path: Path, warnings_are_errors: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    marker = tmp_path / "marker"
    path = tmp_path / "evil.ckpt"
    torch.save({"x": _RunsCode(marker)}, path)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("error" if warnings_are_errors else "always")
        with pytest.raises(
            pickle.UnpicklingError, match=r"^compatshim\.checkpoint\.load: "
        ) as raised:
            torch.load(path)
    assert not marker.exists()  # no code from the file ran, in either loader
    lead, _, torch_text = str(raised.value).partition("\n\n")
    assert "builtins.getattr" in lead  # compatshim's reason first, torch's text after it
    assert torch_text.startswith("torch's weights-only load refused it first: Weights only")
    if warnings_are_errors:  # the warning cannot replace torch's error: it goes to stderr
        assert "CheckpointRefusedWarning" in capsys.readouterr().err
    else:
        assert [w.category for w in seen] == [patch.CheckpointRefusedWarning]
        assert str(path) in str(seen[0].message)


@needs_default
def test_a_file_cut_short_is_torchs_own_error_not_a_refusal(installed: Any) -> None:
    """A legacy file cut short, which torch's weights-only load fails as an UnpicklingError
    at some cut points ("pickle data was truncated"): the patch retries it with compatshim's
    loader, which fails on the same damage. It raised torch's error led by compatshim's and
    warned a refusal ("refused it too"); it is torch's own error now, with no warning."""
    data = legacy_bytes()
    original = torch.load.__compatshim_original__
    retried = 0
    for cut in range(len(data)):
        try:
            original(io.BytesIO(data[:cut]), weights_only=True)
        except pickle.UnpicklingError as exc:
            theirs: BaseException = exc
        except Exception:  # not retried: torch's error passes as it is
            continue
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            with pytest.raises(pickle.UnpicklingError) as ours:
                torch.load(io.BytesIO(data[:cut]), weights_only=True)
        assert type(ours.value) is type(theirs) and str(ours.value) == str(theirs), cut
        assert not [w for w in seen if issubclass(w.category, patch.CheckpointRefusedWarning)]
        retried += 1
    assert retried  # the cuts inside a text opcode's line, at least


@needs_default
def test_an_unseekable_stream_keeps_torchs_own_error(installed: Any) -> None:
    """torch needs seek/tell before it unpickles anything: its error passes through, no retry."""

    class Forward(io.RawIOBase):
        def __init__(self, data: bytes) -> None:
            self._data = io.BytesIO(data)

        def readable(self) -> bool:
            return True

        def readinto(self, b: Any) -> int:
            return self._data.readinto(b)

    data = _saved({"hparams": argparse.Namespace(a=1)}).getvalue()
    before = list(installed.status())
    with warnings.catch_warnings(record=True) as seen, pytest.raises(io.UnsupportedOperation):
        torch.load(io.BufferedReader(Forward(data)))
    assert seen == [] and list(installed.status()) == before  # no retry, no refusal recorded


@needs_default
def test_a_refusal_by_both_carries_refused_and_advice_for_torch_load_callers(
    installed: Any, tmp_path: Path
) -> None:
    path = tmp_path / "evil.ckpt"
    torch.save({"x": _RunsCode(tmp_path / "marker")}, path)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with pytest.raises(pickle.UnpicklingError) as raised:
            torch.load(path)  # the caller's line
    caller_line = sys._getframe().f_lineno - 1
    assert type(raised.value) is pickle.UnpicklingError  # torch's own type, its text kept
    assert raised.value.refused == ("builtins.getattr", "pathlib.Path.write_text")
    note = str(raised.value).split("\n")[0]
    assert "may be malicious" in note and "COMPATSHIM_ALLOW=" not in note
    assert "allow=[" not in note and "trusted=True" not in note  # checkpoint.load's own advice
    (warning,) = seen
    assert (warning.filename, warning.lineno) == (__file__, caller_line)


@needs_default
def test_torchs_own_warnings_name_the_caller(
    installed: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")  # torch warns, stacklevel=2
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.load(_saved({"w": torch.ones(1)}))  # the caller's line
    caller_line = sys._getframe().f_lineno - 1
    ours = [w for w in seen if "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD" in str(w.message)]
    assert [(w.filename, w.lineno) for w in ours] == [(__file__, caller_line)]


@needs_default
def test_tracebacks_still_show_the_wrappers_source(installed: Any) -> None:
    import linecache

    code = torch.load.__code__
    assert "importlib._bootstrap" in code.co_filename
    assert "def load" in linecache.getline(code.co_filename, code.co_firstlineno + 1)


@needs_default
def test_process_wide_allow_reaches_the_patched_torch_load(installed: Any) -> None:
    import fractions

    from compatshim import checkpoint

    buffer = _saved({"v": fractions.Fraction(1, 3)})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", patch.CheckpointRefusedWarning)
        with pytest.raises(pickle.UnpicklingError) as raised:
            torch.load(buffer)
    assert raised.value.refused == ("fractions.Fraction",)
    note = str(raised.value).split("\n")[0]
    assert "COMPATSHIM_ALLOW=fractions.Fraction" in note
    assert "compatshim.checkpoint.allow('fractions.Fraction'" in note
    checkpoint.allow("fractions.Fraction", reason="a test's own file")
    try:
        buffer.seek(0)
        assert torch.load(buffer) == {"v": fractions.Fraction(1, 3)}
        buffer.seek(0)
        assert checkpoint.load(buffer) == {"v": fractions.Fraction(1, 3)}
    finally:
        checkpoint.disallow("fractions.Fraction")
    buffer.seek(0)
    with pytest.raises(checkpoint.UnsafeCheckpointError):
        checkpoint.load(buffer)


@needs_default
def test_hardened_in_process_refuses_weights_only_false(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import compatshim
    from compatshim.checkpoint import UnsafeCheckpointError

    compatshim.uninstall([PATCH])
    monkeypatch.setenv("COMPATSHIM_SAFE_LOAD", "1")
    compatshim.install(include=[PATCH])
    try:
        assert torch.load.__compatshim_hardened__ is True
        marker = tmp_path / "marker"
        path = tmp_path / "evil.ckpt"
        torch.save({"x": _RunsCode(marker)}, path)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", patch.CheckpointRefusedWarning)
            with pytest.raises(UnsafeCheckpointError) as raised:
                torch.load(path, weights_only=False)
        assert not marker.exists()
        assert raised.value.refused == ("builtins.getattr", "pathlib.Path.write_text")
        assert "add_safe_globals" not in str(raised.value)
        state = torch.nn.Linear(2, 2).state_dict()
        loaded = torch.load(_saved(state), weights_only=False, pickle_module=pickle)
        assert all(torch.equal(loaded[k], state[k]) for k in state)
    finally:
        compatshim.uninstall([PATCH])
    assert not hasattr(torch.load, "__compatshim_original__")


@needs_default
def test_hardened_mode_overrides_trusted_and_says_so_at_the_callers_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``checkpoint.load(trusted=True)`` under ``COMPATSHIM_SAFE_LOAD=1`` is refused (hardened
    mode wins), but it logged that the file "is loaded with torch.load(weights_only=False),
    which runs any code", and the refusal's warning named compatshim/checkpoint/__init__.py."""
    import logging

    import compatshim
    from compatshim import checkpoint
    from compatshim.checkpoint import UnsafeCheckpointError

    compatshim.uninstall([PATCH])
    monkeypatch.setenv("COMPATSHIM_SAFE_LOAD", "1")
    compatshim.install(include=[PATCH])
    try:
        marker = tmp_path / "marker"
        path = tmp_path / "evil.ckpt"
        torch.save({"x": _RunsCode(marker)}, path)
        with warnings.catch_warnings(record=True) as seen, caplog.at_level(logging.INFO):
            warnings.simplefilter("always")
            with pytest.raises(UnsafeCheckpointError):
                checkpoint.load(path, trusted=True)
        assert not marker.exists()
        said = " ".join(record.getMessage() for record in caplog.records)
        assert "runs any code" not in said, said
        assert "trusted=True is not honoured" in said and "COMPATSHIM_SAFE_LOAD=1" in said, said
        (refusal,) = [w for w in seen if w.category is patch.CheckpointRefusedWarning]
        assert refusal.filename == __file__, (refusal.filename, refusal.lineno)
    finally:
        compatshim.uninstall([PATCH])


def test_hardened_reads_every_file_with_compatshim(tmp_path: Path) -> None:
    """torch's own unpickler never runs in hardened mode, on any torch (before 2.6 its
    weights-only unpickler could run code, CVE-2025-32434; later ones crash on hostile files)."""
    from compatshim.checkpoint import UnsafeCheckpointError

    calls: list[Any] = []

    def original(*args: Any, **kwargs: Any) -> Any:
        calls.append((args, kwargs))
        raise AssertionError("torch's own load must not run")

    load = patch._wrap(original, True, Patcher())
    state = torch.nn.Linear(2, 2).state_dict()
    loaded = load(_saved(state), "cpu", pickle, weights_only=False, encoding="latin1")
    assert all(torch.equal(loaded[k], state[k]) for k in state)
    path = tmp_path / "evil.ckpt"
    torch.save({"x": _RunsCode(tmp_path / "marker")}, path)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with pytest.raises(UnsafeCheckpointError) as raised:
            load(path, weights_only=False)  # the caller's line
    caller_line = sys._getframe().f_lineno - 1
    assert raised.value.refused == ("builtins.getattr", "pathlib.Path.write_text") and calls == []
    assert not (tmp_path / "marker").exists()
    assert [(w.filename, w.lineno) for w in seen] == [(__file__, caller_line)]


class _Registered:
    """A class only torch's ``add_safe_globals`` / ``safe_globals`` can admit."""

    def __init__(self, value: int) -> None:
        self.value = value


class _InContext(_Registered):
    pass


needs_registrations = pytest.mark.skipif(
    not hasattr(torch.serialization, "add_safe_globals"),
    reason=f"torch {torch.__version__} has no add_safe_globals",
)


@pytest.fixture
def registrations() -> Any:
    """torch's registrations as they were, before and after the test."""
    serialization = torch.serialization
    before = list(serialization.get_safe_globals())
    yield serialization
    serialization.clear_safe_globals()
    serialization.add_safe_globals(before)


@needs_registrations
def test_hardened_sees_registrations_made_after_a_load(registrations: Any) -> None:
    """The registrations are worked out once and kept while torch's registry is unchanged
    (every hardened load asks): a registration made after a load counts at the next one,
    and one made by a ``safe_globals`` context stops counting when the context ends."""
    from compatshim.checkpoint import UnsafeCheckpointError

    load = patch._wrap(torch.load, True, Patcher())
    registered, in_context = _saved({"r": _Registered(3)}), _saved({"c": _InContext(4)})

    def value(buffer: io.BytesIO) -> int:
        buffer.seek(0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", patch.CheckpointRefusedWarning)
            return int(next(iter(load(buffer).values())).value)

    for buffer in (registered, in_context):
        with pytest.raises(UnsafeCheckpointError):
            value(buffer)
    assert patch._torch_safe_globals() is patch._torch_safe_globals()  # kept while unchanged
    registrations.add_safe_globals([_Registered])
    assert value(registered) == 3
    if hasattr(registrations, "safe_globals"):
        with registrations.safe_globals([_InContext]):
            assert value(in_context) == 4
        with pytest.raises(UnsafeCheckpointError):
            value(in_context)
    assert value(registered) == 3
    registrations.clear_safe_globals()
    with pytest.raises(UnsafeCheckpointError):
        value(registered)


def test_each_hardened_load_reads_as_its_own_arguments_ask() -> None:
    """The wrapper keeps the last request and reuses it when a load asks the same: a load
    asking another ``map_location``, ``mmap`` or ``encoding`` gets its own, in any order."""
    load = patch._wrap(torch.load, True, Patcher())
    buffer = _saved({"w": torch.ones(2)})

    def device(**kwargs: Any) -> str:
        buffer.seek(0)
        return str(load(buffer, **kwargs)["w"].device)

    asked = [device(), device(map_location="meta"), device(), device(map_location="meta")]
    assert asked == ["cpu", "meta", "cpu", "meta"]
    assert device(encoding="latin1") == "cpu" and device() == "cpu"
    with pytest.raises(ValueError, match="mmap"):  # a file object cannot be mapped: torch's
        device(mmap=True)  # type, as torch.load raises it
    assert device() == "cpu"
    config = pytest.importorskip("torch.utils.serialization.config")  # torch 2.5+
    before, config.load.mmap = config.load.mmap, True  # torch's default, read at each load
    try:
        with pytest.raises(ValueError, match="mmap"):
            device()
    finally:
        config.load.mmap = before
    assert device() == "cpu"


@needs_registrations
def test_a_registry_changed_in_place_counts(registrations: Any) -> None:
    """torch 2.4-2.5 hand out their registry list itself: a change made to it in place
    counts too (the cache compares contents, not the list's identity)."""
    registry = patch._registry(sys.modules["torch._weights_only_unpickler"])
    assert registry is not None, "torch's registry layout is unknown: loads read it uncached"
    before = patch._torch_safe_globals()
    if isinstance(registry, list):
        registry.append(_Registered)
    else:
        registry.add(_Registered)
    assert set(patch._torch_safe_globals()) == {*before, _Registered}
    registry.remove(_Registered)
    assert set(patch._torch_safe_globals()) == set(before)


@needs_default
def test_a_refusal_leads_with_compatshims_reason_not_torchs_first_global(
    installed: Any,
) -> None:
    """Issue 38: a file holding a numpy array and one global nobody allows. torch's text
    blames the numpy global (which compatshim covers) and advises ``weights_only=False``;
    the error's first line is compatshim's: the one global it refused and the
    ``COMPATSHIM_ALLOW=`` line that admits it. torch's text follows; its type is torch's."""
    import fractions

    np = pytest.importorskip("numpy")
    buffer = _saved({"array": np.arange(3), "v": fractions.Fraction(1, 3)})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", patch.CheckpointRefusedWarning)
        with pytest.raises(pickle.UnpicklingError) as raised:
            torch.load(buffer)
    assert type(raised.value) is pickle.UnpicklingError
    first, *rest = str(raised.value).split("\n")
    assert "fractions.Fraction" in first and "COMPATSHIM_ALLOW=fractions.Fraction" in first
    assert "numpy" not in first and "weights_only=False" not in first
    after = "\n".join(rest)
    assert "torch's weights-only load refused it first" in after
    assert "Weights only load failed" in after  # torch's own text, kept whole


def test_torchs_names_are_read_from_the_module_namespace() -> None:
    """``_attribute`` reads a module's namespace: a getattr that fails on a module builds an
    AttributeError, and torch < 2.6 lacks names every hardened load asks for. A module whose
    names come from a PEP 562 ``__getattr__`` is asked the usual way."""
    import types

    def lazy_names(name: str) -> Any:
        if name == "late":
            return "made on demand"
        raise AttributeError(name)

    plain = types.ModuleType("plain")
    plain.present = [1]  # type: ignore[attr-defined]
    lazy = types.ModuleType("lazy")
    lazy.__getattr__ = lazy_names  # type: ignore[method-assign]
    assert patch._attribute(plain, "present") == [1] and patch._attribute(plain, "absent") is None
    assert patch._attribute(lazy, "late") == "made on demand"
    assert patch._attribute(lazy, "absent") is None and patch._attribute(None, "present") is None
