"""The patch registry's own contract: version gating, probe-decided apply, exact revert,
idempotence, thread safety, post-import arming, COMPATSHIM_DISABLE and status().

The target here is a small module this test writes, because what is under test is
compatshim's mechanism, not a framework; the framework patches have their own tests.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from pathlib import Path
from types import ModuleType
from typing import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import compatshim
from compatshim._engine import import_hooks, registry
from compatshim._engine.patch import Patch
from compatshim._engine.patching import Patcher
from tests.harness.catalogue import status_row

from .patch_factory import make_patch

TARGET = "cs_registry_target"


def _fixed_method(self: object) -> str:
    return "fixed"


def _probe(module: ModuleType) -> bool:
    return bool(module.Thing().method() == "broken")


def _apply(module: ModuleType, patcher: Patcher) -> None:
    patcher.setattr(module.Thing, "method", _fixed_method)
    patcher.setattr(module, "ADDED", True)


def _make_patch(name: str, requires: str = ">=1", tested: str = ">=1") -> Patch:
    return make_patch(name, (TARGET,), _probe, _apply, requires=requires, tested=tested)


@pytest.fixture
def target_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    (tmp_path / f"{TARGET}.py").write_text(
        textwrap.dedent(
            """
            class Thing:
                def method(self):
                    return "broken"
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop(TARGET, None)
    yield tmp_path
    sys.modules.pop(TARGET, None)


@pytest.fixture
def patch_name(request: pytest.FixtureRequest) -> Iterator[str]:
    name = f"test-{request.node.name}"[:60]
    registry.register(_make_patch(name))
    yield name
    registry.unregister(name)


def test_arms_before_import_and_applies_on_import(target_dir: Path, patch_name: str) -> None:
    assert compatshim.install(include=[patch_name]) == [patch_name]
    assert TARGET not in sys.modules, "install() must not import the target"
    row = status_row(patch_name)
    assert row["armed"] and row["defect"] == "not probed" and not row["applied"]
    module = importlib.import_module(TARGET)
    assert module.Thing().method() == "fixed"
    assert module.__loader__.__class__.__name__ != "_HookedLoader"
    row = status_row(patch_name)
    assert row["defect"] == "present" and row["applied"] and row["fixed"] is True


def test_already_imported_target_is_patched_at_once(target_dir: Path, patch_name: str) -> None:
    module = importlib.import_module(TARGET)
    compatshim.install(include=[patch_name])
    assert module.Thing().method() == "fixed"


def test_uninstall_restores_exact_objects(target_dir: Path, patch_name: str) -> None:
    module = importlib.import_module(TARGET)
    original = module.Thing.__dict__["method"]
    compatshim.install(include=[patch_name])
    assert module.Thing.__dict__["method"] is _fixed_method
    assert compatshim.uninstall([patch_name]) == [patch_name]
    assert module.Thing.__dict__["method"] is original
    assert not hasattr(module, "ADDED"), "attributes the patch added must be removed"
    assert TARGET not in import_hooks.watched()
    assert not status_row(patch_name)["applied"]


def test_uninstall_leaves_what_a_library_set_after_the_patch(
    target_dir: Path, patch_name: str
) -> None:
    module = importlib.import_module(TARGET)
    compatshim.install(include=[patch_name])

    def theirs(self: object) -> str:
        return "theirs"

    module.Thing.method = theirs  # another library's later change to the same attribute
    compatshim.uninstall([patch_name])
    assert module.Thing.__dict__["method"] is theirs, "uninstall dropped a later change"
    assert not hasattr(module, "ADDED"), "what nobody replaced is still undone"


def test_an_install_waits_for_the_hook_an_uninstall_left_working(target_dir: Path) -> None:
    """install, uninstall, install from three threads while the first hook is inside its
    apply: the third hook's probe must not run through the first one's fix, which is
    reverted as soon as that hook sees it is stale (armed, but nothing applied), nor
    while that revert is still running."""
    module = importlib.import_module(TARGET)
    original = module.Thing.__dict__["method"]
    inside, release = threading.Event(), threading.Event()

    def slow_apply(target: ModuleType, patcher: Patcher) -> None:
        _apply(target, patcher)
        if not release.is_set():  # the first apply only, whose revert is slow too
            patcher.on_revert(lambda: time.sleep(0.3))
            inside.set()
            release.wait(10)

    name = "test-stale-hook-race"
    registry.register(make_patch(name, (TARGET,), _probe, slow_apply))
    try:
        first = threading.Thread(target=compatshim.install, kwargs={"include": [name]})
        first.start()
        assert inside.wait(10)
        undo = threading.Thread(target=compatshim.uninstall, args=([name],))
        undo.start()
        deadline = time.monotonic() + 10
        while name in registry.armed() and time.monotonic() < deadline:
            time.sleep(0.001)  # disarmed; it now waits for the first hook
        second = threading.Thread(target=compatshim.install, kwargs={"include": [name]})
        second.start()
        second.join(0.3)
        release.set()
        for thread in (first, undo, second):
            thread.join(20)
            assert not thread.is_alive()
        row = status_row(name)
        assert row["armed"] and row["applied"], row
        assert module.Thing().method() == "fixed", "armed, reported applied, but not in force"
    finally:
        release.set()
        registry.unregister(name)
    assert module.Thing.__dict__["method"] is original


def test_a_hook_whose_record_fails_leaves_no_worker_behind(
    target_dir: Path, patch_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Or every later install and uninstall from another thread would wait 30 s for it."""
    importlib.import_module(TARGET)

    def broken(*args: object) -> None:
        raise RuntimeError("recording failed")

    monkeypatch.setattr(registry, "_record", broken)
    compatshim.install(include=[patch_name])  # the import hooks keep it from the caller
    assert registry._states[patch_name].workers == []


def test_install_twice_is_install_once(target_dir: Path, patch_name: str) -> None:
    compatshim.install(include=[patch_name])
    compatshim.install(include=[patch_name])
    module = importlib.import_module(TARGET)
    assert module.Thing().method() == "fixed"
    compatshim.uninstall([patch_name])
    assert module.Thing().method() == "broken"


def test_concurrent_install_uninstall_is_consistent(target_dir: Path, patch_name: str) -> None:
    module = importlib.import_module(TARGET)
    original = module.Thing.__dict__["method"]
    errors: list[BaseException] = []

    def churn() -> None:
        try:
            for _ in range(200):
                compatshim.install(include=[patch_name])
                compatshim.uninstall([patch_name])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=churn) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert module.Thing.__dict__["method"] is original
    compatshim.install(include=[patch_name])
    assert module.Thing().method() == "fixed"


def test_probe_decides_when_defect_absent(target_dir: Path, patch_name: str) -> None:
    module = importlib.import_module(TARGET)
    module.Thing.method = _fixed_method  # an upstream release that fixed the bug itself
    compatshim.install(include=[patch_name])
    row = status_row(patch_name)
    assert row["defect"] == "absent" and not row["applied"]


class _CountedProbe:
    """``_probe``, counting its calls; ``fixes=False``: the fix never satisfies it."""

    def __init__(self, fixes: bool = True) -> None:
        self.calls = 0
        self.fixes = fixes

    def __call__(self, module: ModuleType) -> bool:
        self.calls += 1
        return _probe(module) or not self.fixes


def _in_place(module: ModuleType) -> bool:
    return module.Thing.__dict__.get("method") is _fixed_method


def test_a_patch_check_confirms_at_import_and_the_probe_when_status_asks(
    target_dir: Path,
) -> None:
    """A patch whose probe is costly through its fix gives ``confirm``: only that runs inside
    the import; the probe runs once, when ``status()`` first asks, and decides ``fixed``."""
    probe = _CountedProbe()
    name = "test-confirm-later"
    registry.register(make_patch(name, (TARGET,), probe, _apply, confirm=_in_place))
    try:
        compatshim.install(include=[name])
        module = importlib.import_module(TARGET)
        assert module.Thing().method() == "fixed"
        assert probe.calls == 1  # the decision only: no second probe inside the import
        row = status_row(name)
        assert row["applied"] and row["fixed"] is True and probe.calls == 2
        assert any("confirmed" in line for line in row["decisions"]), row["decisions"]
        status_row(name)
        assert probe.calls == 2  # confirmed once
    finally:
        registry.unregister(name)


def test_what_the_fix_records_while_its_probe_runs_is_not_kept(target_dir: Path) -> None:
    """A probe runs the fixed code on a harmless case it must refuse: that refusal is the
    probe's, not the program's, so it is not among the decisions; another thread's record
    made while the probe runs is kept."""
    from compatshim._engine import decisions

    name = "test-probe-quiet"
    other: list[threading.Thread] = []

    def probe(module: ModuleType) -> bool:
        decisions.record(name, "refused", "the probe's own case")
        other.append(threading.Thread(target=decisions.record, args=(name, "refused", "real")))
        other[-1].start()
        other[-1].join()
        return _probe(module)

    registry.register(make_patch(name, (TARGET,), probe, _apply, confirm=_in_place))
    try:
        compatshim.install(include=[name])
        importlib.import_module(TARGET)
        lines = status_row(name)["decisions"]
        assert any("confirmed" in line for line in lines), lines
        assert not [line for line in lines if "the probe's own case" in line], lines
        assert len([line for line in lines if "(real)" in line]) == 2, lines  # decide + confirm
        decisions.record(name, "refused", "after")
        assert "refused (after)" in status_row(name)["decisions"][-1]
    finally:
        registry.unregister(name)


def test_the_probe_decides_fixed_over_the_patch_check(target_dir: Path) -> None:
    probe = _CountedProbe(fixes=False)
    name = "test-confirm-disagrees"
    registry.register(make_patch(name, (TARGET,), probe, _apply, confirm=_in_place))
    try:
        compatshim.install(include=[name])
        importlib.import_module(TARGET)
        with pytest.warns(RuntimeWarning, match="probe still finds the defect"):
            row = status_row(name)
        assert row["applied"] and row["fixed"] is False
    finally:
        registry.unregister(name)


def test_a_failing_patch_check_warns_inside_the_import(target_dir: Path) -> None:
    probe = _CountedProbe()
    name = "test-confirm-fails"
    registry.register(make_patch(name, (TARGET,), probe, _apply, confirm=lambda m: False))
    try:
        compatshim.install(include=[name])
        with pytest.warns(RuntimeWarning, match="changes are not in place"):
            importlib.import_module(TARGET)
        row = status_row(name)
        assert row["applied"] and row["fixed"] is False and probe.calls == 1
    finally:
        registry.unregister(name)


def test_uninstalled_before_status_is_never_confirmed(target_dir: Path) -> None:
    probe = _CountedProbe()
    name = "test-confirm-uninstalled"
    registry.register(make_patch(name, (TARGET,), probe, _apply, confirm=_in_place))
    try:
        compatshim.install(include=[name])
        module = importlib.import_module(TARGET)
        compatshim.uninstall([name])
        row = status_row(name)
        assert not row["applied"] and row["fixed"] is None and probe.calls == 1
        assert module.Thing().method() == "broken"
    finally:
        registry.unregister(name)


def test_version_below_range_is_left_alone(target_dir: Path) -> None:
    name = "test-below-range"
    registry.register(_make_patch(name, requires=">=999"))
    try:
        module = importlib.import_module(TARGET)
        compatshim.install(include=[name])
        assert module.Thing().method() == "broken"
        row = status_row(name)
        assert row["range_position"] == "unsupported" and not row["applied"]
    finally:
        registry.unregister(name)


def test_version_above_range_lets_probe_decide(target_dir: Path) -> None:
    name = "test-above-range"
    registry.register(_make_patch(name, tested="<1"))
    try:
        module = importlib.import_module(TARGET)
        compatshim.install(include=[name])
        assert module.Thing().method() == "fixed"
        row = status_row(name)
        assert row["range_position"] == "untested" and row["applied"] and not row["in_range"]
    finally:
        registry.unregister(name)


def test_failed_apply_leaves_module_unchanged(target_dir: Path) -> None:
    def bad_apply(module: ModuleType, patcher: Patcher) -> None:
        patcher.setattr(module.Thing, "method", _fixed_method)
        raise RuntimeError("layout changed")

    name = "test-bad-apply"
    registry.register(make_patch(name, (TARGET,), _probe, bad_apply))
    try:
        module = importlib.import_module(TARGET)
        original = module.Thing.__dict__["method"]
        with pytest.warns(RuntimeWarning, match="layout changed"):
            compatshim.install(include=[name])
        assert module.Thing.__dict__["method"] is original
        assert "layout changed" in str(status_row(name)["error"])
    finally:
        registry.unregister(name)


def test_exclude_and_env_disable(
    target_dir: Path, patch_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert patch_name not in compatshim.install(include=[patch_name], exclude=[patch_name])
    monkeypatch.setenv("COMPATSHIM_DISABLE", f"other, {patch_name}")
    with pytest.warns(RuntimeWarning, match="unarmed: COMPATSHIM_DISABLE names it"):
        assert compatshim.install(include=[patch_name]) == []
    module = importlib.import_module(TARGET)
    assert module.Thing().method() == "broken"


def test_exclude_of_an_armed_patch_warns_that_it_stays_armed(
    target_dir: Path, patch_name: str
) -> None:
    """Under ``COMPATSHIM_AUTO=1`` (every patch armed at start-up), ``install(exclude=name)``
    returned a list without ``name`` and said nothing, while ``name`` stayed armed."""
    assert compatshim.install(include=[patch_name]) == [patch_name]
    with pytest.warns(RuntimeWarning, match="leaves .* armed") as warned:
        assert compatshim.install(include=[patch_name], exclude=patch_name) == []
    (message,) = [str(w.message) for w in warned]
    assert f"compatshim.uninstall({patch_name!r}) disarms it" in message, message
    assert [w.filename for w in warned] == [__file__]  # the caller's line
    assert status_row(patch_name)["armed"]  # as said: exclude disarms nothing
    compatshim.uninstall(patch_name)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # not armed: nothing to say
        assert compatshim.install(include=[patch_name], exclude=patch_name) == []


def test_include_of_a_patch_the_environment_disables_warns(
    target_dir: Path, patch_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``install(include=name)`` with ``name`` in ``COMPATSHIM_DISABLE`` returned [] and said
    nothing: an explicit request dropped silently (the environment still wins)."""
    monkeypatch.setenv("COMPATSHIM_DISABLE", patch_name)
    with pytest.warns(RuntimeWarning, match="leaves .* unarmed") as warned:
        assert compatshim.install(include=patch_name) == []
    (message,) = [str(w.message) for w in warned]
    assert f"{patch_name!r} unarmed: COMPATSHIM_DISABLE names it" in message, message
    assert [w.filename for w in warned] == [__file__]  # the caller's line
    assert not status_row(patch_name)["armed"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # excluded as well: nothing to say
        assert compatshim.install(include=[patch_name], exclude=[patch_name]) == []


def test_unknown_names_are_rejected() -> None:
    with pytest.raises(ValueError, match="unknown patch"):
        compatshim.install(include=["no-such-patch"])


def test_status_reads_versions_without_importing() -> None:
    code = (
        "import sys, compatshim; rows = compatshim.status(); "
        "heavy = [m for m in ('torch', 'numpy', 'nuscenes', 'lightning', 'colossalai') "
        "if m in sys.modules]; print(heavy); assert not heavy, heavy; "
        "assert all('installed_version' in r for r in rows)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_import_compatshim_auto_imports_no_framework() -> None:
    code = (
        "import sys, compatshim.auto, compatshim; "
        "heavy = [m for m in ('torch', 'numpy', 'nuscenes', 'lightning', 'colossalai', "
        "'packaging.version', 'packaging.specifiers') "
        "if m in sys.modules]; assert not heavy, heavy; "
        "assert all(r['armed'] for r in compatshim.status())"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@pytest.mark.parametrize("value,armed", [("1", True), ("0", False), ("", False)])
def test_startup_hook_honours_compatshim_auto(value: str, armed: bool) -> None:
    """The wheel ships compatshim_auto.pth: processes we don't write get the patches."""
    import os

    env = dict(os.environ, COMPATSHIM_AUTO=value)
    code = "import sys; print('compatshim.auto' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.stdout.strip() == str(armed)


def test_the_catalogue_declares_each_patch_once() -> None:
    """A patch's name, targets and versions live only in its row of the catalogue table; its
    module holds the code (``probe``, ``apply``) and no second declaration."""
    import importlib

    from packaging.specifiers import SpecifierSet

    from compatshim.patches import CATALOGUE

    names = [patch.name for patch in CATALOGUE]
    assert len(names) == len(set(names))
    for patch in CATALOGUE:
        assert patch.targets and patch.description
        SpecifierSet(patch.requires)
        SpecifierSet(patch.tested)
        module = importlib.import_module(patch.fix_module)
        assert callable(module.probe) and callable(module.apply), patch.fix_module
        assert patch.probe is module.probe and patch.apply is module.apply
        assert patch.confirm is getattr(module, "confirm", None), patch.fix_module
        assert not hasattr(module, "PATCH"), patch.fix_module


def test_start_up_path_imports_nothing_heavy() -> None:
    """``import compatshim.auto`` imports the catalogue table and the engine, which stay cheap."""
    code = (
        "import sys; before = set(sys.modules); import compatshim.auto; "
        "new = set(sys.modules) - before; "
        "bad = sorted(m for m in new if m in ('typing', 'pickle', 'copy', 'inspect', "
        "'importlib.metadata', 'packaging.version', 'packaging.specifiers', 'dataclasses', "
        "'logging', 'torch', 'numpy', '_pickle', 'functools', 'collections', 'importlib', "
        "'warnings')); "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_armed_import_torch_leaves_the_loaders_and_pickling_helpers_unimported() -> None:
    """Inside an armed ``import torch`` the patches decide and apply, but what their fixes
    use only later (compatshim's checkpoint loader, ``find_unpicklable``) stays unimported
    until ``status()`` asks for the end-to-end confirmation (issue 18: start-up cost)."""
    pytest.importorskip("torch")
    code = textwrap.dedent(
        """
        import json, sys
        import compatshim.auto
        import torch, compatshim
        late = ("compatshim.checkpoint", "compatshim.pickling")
        inside = sorted(m for m in sys.modules if m.startswith(late))
        rows = {r.name: r for r in compatshim.status()}
        print(json.dumps({"inside": inside,
                          "rows": {n: [r.applied, r.fixed] for n, r in rows.items()}}))
        """
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPATSHIM_")}
    out = subprocess.run(
        [sys.executable, "-c", code],
        check=True,
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["inside"] == [], result
    for name in ("torch-load-safe-globals", "multiprocessing-pickle-paths"):
        applied, fixed = result["rows"][name]
        assert not applied or fixed is True, (name, result)


def test_target_distribution_gates_that_target(target_dir: Path) -> None:
    """A target shipped by another distribution is version-gated by that distribution."""
    name = "test-target-distribution"
    patch = make_patch(
        name,
        (TARGET,),
        _probe,
        _apply,
        distribution="no-such-distribution",
        target_distributions={TARGET: "packaging"},
    )
    registry.register(patch)
    try:
        module = importlib.import_module(TARGET)
        compatshim.install(include=[name])
        assert module.Thing().method() == "fixed"
        row = status_row(name)
        assert row["distribution"] == "packaging" and row["installed_version"]
    finally:
        registry.unregister(name)


@pytest.mark.parametrize("name", ["torch", "packaging", "pytest", "no-such-distribution-x"])
def test_fast_version_lookup_agrees_with_importlib_metadata(name: str) -> None:
    from importlib import metadata

    from compatshim._engine.versions import _from_dist_info

    try:
        expected: str | None = metadata.version(name)
    except metadata.PackageNotFoundError:
        expected = None
    assert _from_dist_info(name) == expected


def test_one_listing_answers_until_sys_path_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from importlib import metadata

    from compatshim._engine.versions import _from_dist_info

    real = metadata.version("packaging")
    assert _from_dist_info("packaging") == real
    (tmp_path / "packaging-999.0.dist-info").mkdir()
    monkeypatch.syspath_prepend(str(tmp_path))  # first on the path wins, as for imports
    assert _from_dist_info("packaging") == "999.0"
    monkeypatch.undo()
    assert _from_dist_info("packaging") == real


_RELEASE = st.lists(st.integers(0, 30), min_size=1, max_size=4).map(
    lambda parts: ".".join(map(str, parts))
)
_CLAUSE = st.tuples(st.sampled_from([">=", "<=", "==", "!=", ">", "<"]), _RELEASE).map("".join)


@settings(max_examples=2000, deadline=None)
@given(
    version=st.tuples(_RELEASE, st.sampled_from(["", "+cpu", "+cu124"])).map("".join),
    clauses=st.lists(_CLAUSE, min_size=1, max_size=3).map(",".join),
)
def test_the_gate_without_packaging_agrees_with_packaging(version: str, clauses: str) -> None:
    """The gate reads plain releases without importing ``packaging`` (it would cost ~13 ms
    inside a framework's import); on those it must answer exactly as ``packaging`` does."""
    from packaging.specifiers import SpecifierSet

    from compatshim._engine.versions import _simple_contains, version_at_least

    expected = SpecifierSet(clauses).contains(version, prereleases=True)
    assert _simple_contains(clauses, version) == expected
    minimum = clauses.split(",")[0].lstrip("<>=!")
    from packaging.version import Version

    assert version_at_least(version, minimum) == (Version(version) >= Version(minimum))


@pytest.mark.parametrize("version", ["2.6.0a0+git1234", "2.1.0rc1", "1.0.post1", "2.1.0.dev3"])
def test_the_gate_hands_other_versions_to_packaging(version: str) -> None:
    from compatshim._engine.versions import _simple_contains, position

    assert _simple_contains(">=2.1", version) is None
    assert _simple_contains(">=2.1.*", "2.1") is None and _simple_contains("~=2.1", "2.1") is None
    position("torch", version, ">=2.1", ">=2.1,<2.16")  # answered by packaging, no error
