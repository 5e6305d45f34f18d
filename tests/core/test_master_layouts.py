"""The master-param layouts: found by listing one package, one module each, read by the doctor.

No ColossalAI here: the doctor reads installed metadata and source text only,
so a folder with a ``colossalai-<v>.dist-info`` and a ``low_level_optim.py``
stands for an install. The end-to-end check that the markers match the real
releases runs in the colossalai envs (tests/colossalai).
"""

from __future__ import annotations

import ast
import json
import pkgutil
import shutil
import subprocess
import sys
import textwrap
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

import compatshim
import compatshim.master
from compatshim._records import DoctorRow
from compatshim.master import layouts
from compatshim.master.doctor import layout_in_source
from compatshim.master.layouts import LAYOUTS
from tests.harness.dist import python_env

MASTER = Path(compatshim.master.__file__).parent


def test_every_module_of_the_package_is_a_layout_in_precedence_order() -> None:
    modules = sorted(
        info.name for info in pkgutil.iter_modules(layouts.__path__) if info.name[0] != "_"
    )
    assert len(LAYOUTS) == len(modules) == 5
    assert sorted(layout.name.replace("-", "_") for layout in LAYOUTS) == modules
    precedences = [layout.precedence for layout in LAYOUTS]
    assert precedences == sorted(set(precedences))  # strictly ordered: no tie decides by name
    assert [layout.name for layout in LAYOUTS] == [
        "zero-optimizer-attribute",
        "zero-param-store",
        "zero-flat-fp32-groups",
        "mixed-precision-map",
        "gemini-chunks",
    ]


def test_each_source_marker_picks_its_own_layout() -> None:
    marked = [layout for layout in LAYOUTS if layout.source_marker]
    assert {layout.name for layout in marked} == {
        "zero-optimizer-attribute",
        "zero-param-store",
        "zero-flat-fp32-groups",
    }
    for layout in marked:
        assert layout_in_source(f"class X:\n    {layout.source_marker}\n") is layout
    assert layout_in_source("nothing to see") is None


def _imports_of(path: Path) -> tuple[set[str], list[str]]:
    """Modules of compatshim.master that ``path`` imports at module level, and deferred ones."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = ".".join(
        ("compatshim", "master", *path.relative_to(MASTER).with_suffix("").parts)
    ).removesuffix(".__init__")
    is_package = path.name == "__init__.py"
    top: set[str] = set()
    deferred: list[str] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom) or node.level == 0:
            continue
        base = package.split(".")
        base = base[: len(base) - node.level + (1 if is_package else 0)]
        target = ".".join([*base, node.module] if node.module else base)
        if not target.startswith("compatshim.master"):
            continue
        in_function = any(
            isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef)) and node in ast.walk(parent)
            for parent in ast.walk(tree)
        )
        guarded = any(
            isinstance(parent, ast.If)
            and "TYPE_CHECKING" in ast.unparse(parent.test)
            and node in ast.walk(parent)
            for parent in ast.walk(tree)
        )
        if in_function:
            deferred.append(target)
        elif not guarded:
            top.add(target)
    return top, deferred


def test_master_imports_point_one_way_and_nothing_is_deferred() -> None:
    graph: dict[str, set[str]] = {}
    for path in sorted(MASTER.rglob("*.py")):
        name = ".".join(
            ("compatshim", "master", *path.relative_to(MASTER).with_suffix("").parts)
        ).removesuffix(".__init__")
        top, deferred = _imports_of(path)
        assert not deferred, f"{name} imports {deferred} inside a function"
        graph[name] = {t for t in top if t != name}

    def visit(node: str, trail: tuple[str, ...]) -> None:
        assert node not in trail, "import cycle: " + " -> ".join((*trail, node))
        for target in graph.get(node, ()):
            visit(target, (*trail, node))

    for module in graph:
        visit(module, ())
    # the layouts know nothing of who reads them
    for name, targets in graph.items():
        if name.startswith("compatshim.master.layouts."):
            assert targets <= {"compatshim.master.layouts._layout", "compatshim.master.shards"}


def _fake_colossalai(root: Path, version: str, source: str) -> Path:
    (root / f"colossalai-{version}.dist-info").mkdir(parents=True)
    (root / f"colossalai-{version}.dist-info" / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: colossalai\nVersion: {version}\n"
    )
    (root / f"colossalai-{version}.dist-info" / "RECORD").write_text("")
    optim = root / "colossalai" / "zero" / "low_level" / "low_level_optim.py"
    optim.parent.mkdir(parents=True)
    optim.write_text(source)
    return root


def _doctor_rows_in(*paths: Path) -> list[dict[str, object]]:
    code = (
        "import json, sys, compatshim.master as m; "
        "rows = m.doctor_rows(); "
        "print(json.dumps([r.as_dict() for r in rows])); "
        "assert 'colossalai' not in sys.modules and 'torch' not in sys.modules"
    )
    env = python_env()
    env["PYTHONPATH"] = ":".join([*(str(p) for p in paths), env["PYTHONPATH"]])
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    rows: list[dict[str, object]] = json.loads(out.stdout)
    return rows


@pytest.mark.parametrize(
    ("version", "layout_name", "fixed"),
    [
        ("0.4.1", "zero-optimizer-attribute", True),
        ("0.3.6", "zero-param-store", True),
        ("0.3.1", "zero-flat-fp32-groups", False),
    ],
)
def test_doctor_names_the_layout_from_its_marker(
    tmp_path: Path, version: str, layout_name: str, fixed: bool
) -> None:
    layout = next(layout for layout in LAYOUTS if layout.name == layout_name)
    source = (
        f"class LowLevelZeroOptimizer:\n    def __init__(self):\n        {layout.source_marker}\n"
    )
    (row,) = _doctor_rows_in(_fake_colossalai(tmp_path, version, source))
    assert row["name"] == "master: colossalai layout"
    assert row["kind"] == "adapter" and row["applies"] is True
    assert row["fixed"] is fixed
    assert row["detail"] == f"colossalai {version}: {layout.describe()}" + (
        "" if fixed else " - not supported: " + layout.unsupported
    )


def test_doctor_row_for_an_unknown_source_and_for_no_colossalai(tmp_path: Path) -> None:
    (row,) = _doctor_rows_in(_fake_colossalai(tmp_path, "0.9.0", "class Moved: pass\n"))
    assert row["fixed"] is False
    assert row["detail"] == (
        "colossalai 0.9.0: LowLevelZeroOptimizer source matches no known layout"
    )
    (row,) = compatshim.master.doctor_rows()  # this env's own colossalai, or none
    assert isinstance(row, DoctorRow)
    try:
        installed = metadata.version("colossalai")
    except metadata.PackageNotFoundError:
        assert (row.applies, row.fixed) == (False, None)
    else:  # the GPU leg has ColossalAI 0.5.0
        assert row.applies is True and row.detail.startswith(f"colossalai {installed}: ")


def test_doctor_reads_the_source_of_an_editable_install(tmp_path: Path) -> None:
    """``pip install -e`` of a ColossalAI clone: dist-info in site-packages, the source in the
    clone. The row read "source matches no known layout" (fixable: no); it names the layout
    from the clone's source now, still without importing colossalai."""
    layout = next(layout for layout in LAYOUTS if layout.name == "zero-optimizer-attribute")
    clone = _fake_colossalai(tmp_path / "clone", "0.5.0", f"    {layout.source_marker}\n")
    (clone / "colossalai" / "__init__.py").write_text("raise ImportError('not to be imported')\n")
    site = tmp_path / "site"
    site.mkdir()
    shutil.move(str(clone / "colossalai-0.5.0.dist-info"), site)
    (row,) = _doctor_rows_in(site, clone)
    assert row["fixed"] is True
    assert row["detail"] == f"colossalai 0.5.0: {layout.describe()}"


_FUTURE_LAYOUT = '''
"""A future release keeps its masters in ``optimizer.masters_by_id``."""

from ..shards import whole_param_position
from ._layout import Layout

LAYOUT = Layout(
    name="zero-future",
    releases="0.9.0",
    looks_for="optimizer.masters_by_id",
    matches=lambda optimizer: isinstance(getattr(optimizer, "masters_by_id", None), dict),
    precedence=5,
    source_marker="self.masters_by_id = {}",
    master_by_id=lambda optimizer: optimizer.masters_by_id,
    shard_position=lambda optimizer, param, master: whole_param_position(1),
)
'''


def test_a_new_layout_is_one_new_module(tmp_path: Path) -> None:
    """Copy the package, add one module to layouts/: resolver, error text and doctor see it."""
    pytest.importorskip("torch")  # the resolver checks for a plain torch optimizer first
    shutil.copytree(Path(compatshim.__file__).parent, tmp_path / "src" / "compatshim")
    (tmp_path / "src/compatshim/master/layouts/zero_future.py").write_text(_FUTURE_LAYOUT)
    _fake_colossalai(tmp_path / "site", "0.9.0", "        self.masters_by_id = {}\n")
    code = textwrap.dedent(
        """
        import json
        import compatshim.master as m
        from compatshim.master.layouts import LAYOUTS

        class Optimizer:
            def __init__(self, params):
                self.masters_by_id = {id(p): ("master", p) for p in params}

        param = object()
        errors = []
        try:
            m.working_to_master(object())
        except m.UnknownLayoutError as exc:
            errors.append(str(exc))
        print(json.dumps({
            "first": LAYOUTS[0].name,
            "layout": m.layout_name(Optimizer([param])),
            "master": m.master_param(Optimizer([param]), param)[0],
            "error": errors[0],
            "doctor": m.doctor_rows()[0].detail,
        }))
        """
    )
    env = python_env()
    env["PYTHONPATH"] = f"{tmp_path / 'src'}:{tmp_path / 'site'}:{env['PYTHONPATH']}"
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    assert seen["first"] == seen["layout"] == "zero-future"
    assert seen["master"] == "master"
    assert "zero-future (colossalai 0.9.0: optimizer.masters_by_id)" in seen["error"]
    assert (
        seen["doctor"]
        == "colossalai 0.9.0: zero-future (colossalai 0.9.0: optimizer.masters_by_id)"
    )


def test_a_module_without_a_layout_is_refused_at_import(tmp_path: Path) -> None:
    shutil.copytree(Path(compatshim.__file__).parent, tmp_path / "compatshim")
    (tmp_path / "compatshim/master/layouts/half_done.py").write_text("X = 1\n")
    env = python_env()
    env["PYTHONPATH"] = f"{tmp_path}:{env['PYTHONPATH']}"
    out = subprocess.run(
        [sys.executable, "-c", "import compatshim.master"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode != 0
    assert "compatshim.master.layouts.half_done must define LAYOUT = Layout(...)" in out.stderr


def test_a_supported_layout_must_read_the_map() -> None:
    from compatshim.master.layouts import Layout

    with pytest.raises(TypeError, match="master_by_id, shard_position"):
        Layout(name="x", releases="1", looks_for="y", matches=bool, precedence=1)


def test_the_shard_position_of_a_param_the_optimizer_lacks_is_master_params_error() -> None:
    """A plain optimizer gave a whole-param position for any tensor, held or not, where
    master_param raises; both raise the same KeyError now."""
    import torch

    from compatshim.master import master_param, master_shard_position

    held, foreign = torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(3))
    optimizer = torch.optim.SGD([held], lr=0.1)
    assert master_shard_position(optimizer, held).length == 3
    for param in (foreign, None):
        with pytest.raises(KeyError, match="has no master") as position:
            master_shard_position(optimizer, param)  # type: ignore[arg-type]
        with pytest.raises(KeyError) as master:
            master_param(optimizer, param)  # type: ignore[arg-type]
        assert str(position.value) == str(master.value)


def _colossalai_class(name: str, module: str, base: type) -> type:
    return type(name, (base,), {"__module__": module})


def test_a_colossalai_wrapper_that_subclasses_torch_optimizer_is_not_plain() -> None:
    """colossalai 0.3.x's ColossalaiOptimizer wrappers subclass torch.optim.Optimizer and
    delegate param_groups to ``.optim``. Legacy ZeRO's ShardedOptimizerV2 keeps fp16 working
    params there and its fp32 masters in ``master_params``: it resolved as a plain optimizer
    and master_param returned the fp16 working param (seen on real colossalai 0.3.2). The
    stand-ins copy those classes' names, modules and delegation; the base is still unwrapped."""
    import torch

    from compatshim.master import UnknownLayoutError, layout_name, master_param

    def wrapper_init(self: Any, optim: torch.optim.Optimizer) -> None:
        self.optim = optim  # like ColossalaiOptimizer.__init__: no Optimizer.__init__

    base = type(
        "ColossalaiOptimizer",
        (torch.optim.Optimizer,),
        {
            "__module__": "colossalai.nn.optimizer.colossalai_optimizer",
            "__init__": wrapper_init,
            "param_groups": property(lambda self: self.optim.param_groups),
        },
    )
    sharded_v2 = _colossalai_class(
        "ShardedOptimizerV2", "colossalai.zero.legacy.sharded_optim.sharded_optim_v2", base
    )
    working = torch.nn.Parameter(torch.zeros(3, dtype=torch.float16))
    legacy = sharded_v2(torch.optim.Adam([working]))
    legacy.master_params = {working: torch.zeros(3)}
    with pytest.raises(UnknownLayoutError, match="ShardedOptimizerV2") as raised:
        master_param(legacy, working)
    assert "ColossalaiOptimizer" in str(raised.value)  # the wrappers it knows
    thin = base(torch.optim.SGD([working], lr=0.1))
    assert layout_name(thin) == "plain-torch-optimizer"
    assert master_param(thin, working) is working
    # colossalai's own optimizers (HybridAdam, ...) hold no other optimizer: plain
    hybrid_adam = _colossalai_class("HybridAdam", "colossalai.nn.optimizer", torch.optim.Adam)
    assert master_param(hybrid_adam([working]), working) is working


def test_a_map_taken_before_add_param_group_sees_the_new_group() -> None:
    """MasterMap says it reads through to the optimizer; a plain optimizer's map (and
    HybridParallel stage 0's) was a copy taken at the call, so a param of a group added
    later was "not passed to" the optimizer and missing from len() and iteration."""
    import torch

    from compatshim.master import working_to_master

    first, later = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(3))
    optimizer = torch.optim.SGD([first], lr=0.1)
    masters = working_to_master(optimizer)
    optimizer.add_param_group({"params": [later]})
    assert later in masters and masters[later] is later and masters[id(later)] is later
    assert len(masters) == 2 and [p is q for p, q in zip(masters, (first, later))] == [True] * 2

    class StageZero:  # HybridParallel stage 0: masters keyed by the working Parameter
        def __init__(self) -> None:
            self.working_to_master_map = {first: first.detach().float()}

    amp = StageZero()
    masters = working_to_master(amp)
    amp.working_to_master_map[later] = later.detach().float()
    assert masters[later] is amp.working_to_master_map[later] and len(masters) == 2
    with pytest.raises(KeyError, match="has no master"):
        masters[torch.nn.Parameter(torch.zeros(1))]


def test_a_working_to_master_map_of_shards_gets_no_whole_position() -> None:
    """mixed-precision-map recognises any optimizer with a dict ``working_to_master_map`` and
    called each master whole without looking: a map of ZeRO-style shards (a release that moved
    its map there) got offset 0, length numel, and a gather that failed in reshape."""
    import torch

    from compatshim.master import gather_master_param, master_shard_position

    working = torch.nn.Parameter(torch.zeros(4, dtype=torch.bfloat16))

    class ShardedUnderThatName:
        def __init__(self) -> None:
            self.working_to_master_map = {working: torch.zeros(2)}

    for read in (master_shard_position, gather_master_param):
        with pytest.raises(ValueError, match="2-element master for a 4-element param"):
            read(ShardedUnderThatName(), working)
    full = ShardedUnderThatName()
    full.working_to_master_map[working] = torch.ones(4)
    assert master_shard_position(full, working).is_whole
    assert torch.equal(gather_master_param(full, working), torch.ones(4))
