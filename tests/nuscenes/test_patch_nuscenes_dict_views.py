"""Patch ``nuscenes-dict-views`` against the real nuscenes-devkit pinned in matrix/nuscenes-*.txt.

Without the patch, pickling and deep-copying the devkit objects fails (this is
what proves the probe); with it they work, and the objects behave exactly as
before. The config is the devkit's own shipped ``detection_cvpr_2019``.

This folder is the package ``tests.nuscenes``; ``tests/`` is never put on
``sys.path``, so nothing here can shadow the devkit's ``nuscenes``.
"""

from __future__ import annotations

import copy
import json
import pickle
import site
import subprocess
import sys
import textwrap
from importlib import metadata
from pathlib import Path
from typing import Any, Iterator

import pytest

pytest.importorskip("nuscenes.eval.detection.data_classes", reason="no nuscenes-devkit")

from nuscenes.eval.common.config import config_factory
from nuscenes.eval.detection import data_classes
from nuscenes.eval.detection.data_classes import DetectionConfig

import compatshim
from compatshim.patches import nuscenes_dict_views
from tests.harness.catalogue import alone, status_row
from tests.harness.dist import python_env

PATCH = "nuscenes-dict-views"
DEVKIT_VERSION = metadata.version("nuscenes-devkit")


@pytest.fixture
def unpatched() -> Iterator[None]:
    with alone(PATCH, armed=False):
        yield


@pytest.fixture
def patched() -> Iterator[None]:
    with alone(PATCH, armed=True):
        yield


def _cfg() -> DetectionConfig:
    return config_factory("detection_cvpr_2019")


class HoldsConfig:
    """A user object one level up, as a training dataset would be."""

    def __init__(self) -> None:
        self.eval_cfg = _cfg()


# -- the defect is real, and the probe sees it ------------------------------------------


def test_unpatched_devkit_config_cannot_be_pickled_or_deep_copied(unpatched: None) -> None:
    cfg = _cfg()
    assert type(cfg.class_names).__name__ == "dict_keys"
    with pytest.raises(TypeError, match="dict_keys"):
        pickle.dumps(cfg)
    with pytest.raises(TypeError, match="dict_keys"):
        copy.deepcopy(cfg)
    assert nuscenes_dict_views.probe(data_classes) is True


def test_status_on_this_install(patched: None) -> None:
    row = status_row(PATCH)
    assert row["distribution"] == "nuscenes-devkit"
    assert row["installed_version"] == DEVKIT_VERSION
    assert row["in_range"] is True
    assert row["defect"] == "present"
    assert row["applied"] is True
    assert "nuscenes.eval.detection.data_classes" in row["applied_targets"]
    assert row["fixed"] is True
    assert row["error"] is None
    assert nuscenes_dict_views.probe(data_classes) is False


# -- the fix keeps behaviour -----------------------------------------------------------


@pytest.mark.parametrize("how", ["pickle", "deepcopy", "copy"])
def test_patched_config_round_trips_with_behaviour_kept(patched: None, how: str) -> None:
    cfg = _cfg()
    if how == "pickle":
        twin = pickle.loads(pickle.dumps(cfg))
    elif how == "deepcopy":
        twin = copy.deepcopy(cfg)
    else:
        twin = copy.copy(cfg)
    assert type(twin.class_names) is type(cfg.class_names)
    assert list(twin.class_names) == list(cfg.class_names) == list(cfg.class_range)
    assert "car" in twin.class_names
    assert "spaceship" not in twin.class_names
    assert twin.serialize() == cfg.serialize()
    assert twin == cfg
    # still a live view of the object's own dict, as on a freshly built config
    assert twin.class_names == twin.class_range.keys()
    if how != "copy":
        assert twin.class_range is not cfg.class_range
        twin.class_range["spaceship"] = 1
        assert "spaceship" in twin.class_names
        assert "spaceship" not in cfg.class_names


def test_deserialized_config_and_a_holder_object_round_trip(patched: None) -> None:
    cfg = DetectionConfig.deserialize(_cfg().serialize())
    holder = HoldsConfig()
    holder.eval_cfg = cfg
    back = pickle.loads(pickle.dumps(holder))
    assert back.eval_cfg.serialize() == cfg.serialize()
    assert list(back.eval_cfg.class_names) == list(cfg.class_names)
    assert copy.deepcopy(holder).eval_cfg == cfg


def test_config_built_before_install_is_fixed_too(unpatched: None) -> None:
    cfg = _cfg()  # built while the class had no fix
    compatshim.install(include=[PATCH])
    assert pickle.loads(pickle.dumps(cfg)) == cfg


def test_install_twice_is_install_once_and_uninstall_restores_exact_objects(
    unpatched: None,
) -> None:
    before = dict(vars(DetectionConfig))
    compatshim.install(include=[PATCH])
    patched_attrs = dict(vars(DetectionConfig))
    compatshim.install(include=[PATCH])
    assert dict(vars(DetectionConfig)) == patched_attrs
    assert set(patched_attrs) - set(before) == {"__getstate__", "__setstate__"}
    compatshim.uninstall([PATCH])
    after = dict(vars(DetectionConfig))
    assert after.keys() == before.keys()
    assert all(after[name] is before[name] for name in before)
    with pytest.raises(TypeError, match="dict_keys"):
        pickle.dumps(_cfg())


def test_pickle_from_a_patched_process_loads_where_nothing_is_armed(
    patched: None, tmp_path: Path
) -> None:
    """Loading needs compatshim importable, not installed; the view comes back a dict_keys."""
    blob = tmp_path / "cfg.pkl"
    blob.write_bytes(pickle.dumps(_cfg()))
    script = f"""
        import json, pickle, sys
        cfg = pickle.loads(open({str(blob)!r}, "rb").read())
        import compatshim
        print(json.dumps({{
            "type": type(cfg.class_names).__name__,
            "names": list(cfg.class_names),
            "live": cfg.class_names == cfg.class_range.keys(),
            "armed": any(r["armed"] for r in compatshim.status()),
        }}))
    """
    report = _run_python(script, COMPATSHIM_AUTO="0")
    assert report == {
        "type": "dict_keys",
        "names": list(_cfg().class_names),
        "live": True,
        "armed": False,
    }


# -- armed before the target import (fresh interpreters) ------------------------------


def _run_python(script: str, **env: str) -> Any:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        timeout=180,
        env=python_env(**env),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


_BEFORE_IMPORT_REPORT = """
    import copy, json, pickle, sys
    assert not any(name.startswith("nuscenes") for name in sys.modules)
    from nuscenes.eval.common.config import config_factory
    cfg = config_factory("detection_cvpr_2019")
    twin = pickle.loads(pickle.dumps(cfg))
    import compatshim
    row = next(r for r in compatshim.status() if r["name"] == "nuscenes-dict-views")
    print(json.dumps({
        "equal": twin.serialize() == cfg.serialize() and copy.deepcopy(cfg) == cfg,
        "order": list(twin.class_names) == list(cfg.class_names),
        "row": [row["defect"], row["applied"], row["fixed"]],
    }))
"""


def test_armed_before_the_target_import_with_install() -> None:
    script = "import compatshim\ncompatshim.install()\n" + textwrap.dedent(_BEFORE_IMPORT_REPORT)
    report = _run_python(script)
    assert report == {"equal": True, "order": True, "row": ["present", True, True]}


def _startup_hook_installed() -> bool:
    return any(Path(d, "compatshim_auto.pth").exists() for d in site.getsitepackages())


@pytest.mark.skipif(
    not _startup_hook_installed(),
    reason="compatshim_auto.pth is not in site-packages (editable install); tox installs the wheel",
)
def test_armed_at_interpreter_start_by_compatshim_auto() -> None:
    report = _run_python(_BEFORE_IMPORT_REPORT, COMPATSHIM_AUTO="1")
    assert report == {"equal": True, "order": True, "row": ["present", True, True]}


def test_compatshim_disable_leaves_the_defect_in_place() -> None:
    script = """
        import json, pickle
        import compatshim
        compatshim.install()
        from nuscenes.eval.common.config import config_factory
        try:
            pickle.dumps(config_factory("detection_cvpr_2019"))
            outcome = "pickled"
        except TypeError as exc:
            outcome = str(exc)
        print(json.dumps(outcome))
    """
    assert _run_python(script, COMPATSHIM_DISABLE=PATCH) == "cannot pickle 'dict_keys' object"


# -- the other devkit class that stores dict views --------------------------------------


def _tiny_panoptic_dataset(root: Path) -> str:
    """The smallest on-disk nuScenes the devkit's own loader accepts for panoptic evaluation.

    Tables are the real schema with (almost) no rows: every lidarseg category
    with its index, the two ``mini_val`` scenes without samples, one map, one
    panoptic record with its (empty) label file. It is data, not a stand-in for
    the devkit: ``NuScenes`` and ``NuScenesPanopticEval`` run unmodified.
    """
    from nuscenes.utils.color_map import get_colormap

    version = "v1.0-mini"
    tables = root / version
    tables.mkdir(parents=True)
    scenes = [
        {
            "token": f"scene{i}",
            "name": name,
            "nbr_samples": 0,
            "first_sample_token": "",
            "last_sample_token": "",
            "log_token": "log0",
            "description": "",
        }
        for i, name in enumerate(["scene-0103", "scene-0916"])  # the mini_val split
    ]
    label_file = f"panoptic/{version}/pan0_panoptic.npz"
    content: dict[str, list[dict[str, Any]]] = {
        "category": [
            {"token": f"cat{i}", "name": name, "description": name, "index": i}
            for i, name in enumerate(get_colormap())
        ],
        "attribute": [],
        "visibility": [],
        "instance": [],
        "sensor": [],
        "calibrated_sensor": [],
        "ego_pose": [],
        "log": [{"token": "log0", "location": "singapore-onenorth"}],
        "scene": scenes,
        "sample": [],
        "sample_data": [],
        "sample_annotation": [],
        "map": [
            {
                "token": "map0",
                "log_tokens": ["log0"],
                "filename": "maps/blank.png",
                "category": "semantic_prior",
            }
        ],
        "panoptic": [{"token": "pan0", "sample_data_token": "sd0", "filename": label_file}],
    }
    for name, rows in content.items():
        (tables / f"{name}.json").write_text(json.dumps(rows))
    (root / "maps").mkdir()
    (root / "maps" / "blank.png").write_bytes(b"")  # opened lazily, never here
    (root / label_file).parent.mkdir(parents=True)
    (root / label_file).write_bytes(b"")
    (root / "results" / "panoptic" / "mini_val").mkdir(parents=True)
    return version


@pytest.fixture
def panoptic_eval(tmp_path: Path) -> Any:
    """A ``NuScenesPanopticEval`` constructed for real (``__init__`` lines 91-92 make the views)."""
    from nuscenes.eval.panoptic.evaluate import NuScenesPanopticEval
    from nuscenes.nuscenes import NuScenes

    version = _tiny_panoptic_dataset(tmp_path)
    nusc = NuScenes(version=version, dataroot=str(tmp_path), verbose=False)
    return NuScenesPanopticEval(
        nusc,
        results_folder=str(tmp_path / "results"),
        eval_set="mini_val",
        task="tracking",
        min_inst_points=15,
        out_dir=str(tmp_path / "out"),
    )


def test_panoptic_eval_views_are_what_init_stores() -> None:
    from nuscenes.eval.panoptic.evaluate import NuScenesPanopticEval

    found = nuscenes_dict_views._view_attributes_in_init(NuScenesPanopticEval)
    assert set(found) == {"things", "stuff"}


def test_panoptic_eval_pickles_only_with_the_patch(unpatched: None, panoptic_eval: Any) -> None:
    from nuscenes.eval.panoptic import evaluate

    evaluator = panoptic_eval
    assert type(evaluator.things).__name__ == "dict_keys"
    with pytest.raises(TypeError, match="dict_keys"):
        pickle.dumps(evaluator)
    assert {f.path for f in compatshim.find_unpicklable(evaluator, root="ev")} == {
        "ev.things",
        "ev.stuff",
    }
    assert nuscenes_dict_views.probe(evaluate) is True
    compatshim.install(include=[PATCH])
    assert "nuscenes.eval.panoptic.evaluate" in status_row(PATCH)["applied_targets"]
    assert nuscenes_dict_views.probe(evaluate) is False
    for twin in (pickle.loads(pickle.dumps(evaluator)), copy.deepcopy(evaluator)):
        assert list(twin.things) == list(evaluator.things)
        assert list(twin.stuff) == list(evaluator.stuff)
        assert "car" in twin.things and "vegetation" in twin.stuff
        assert twin.things == twin.mapper.things.keys()  # a live view of the copy's mapper
        assert twin.evaluator.keys() == evaluator.evaluator.keys()


# -- find_unpicklable on the real devkit ------------------------------------------------


def test_find_unpicklable_names_the_config_view_and_the_patch(unpatched: None) -> None:
    findings = compatshim.find_unpicklable(HoldsConfig(), root="dataset")
    assert len(findings) == 1
    finding = findings[0]
    assert finding.path == "dataset.eval_cfg.class_names"
    assert finding.type_name == "dict_keys"
    assert "cannot pickle 'dict_keys' object" in finding.error
    assert finding.fix is not None and PATCH in finding.fix
    assert str(finding).startswith("dataset.eval_cfg.class_names (dict_keys): ")
    compatshim.install(include=[PATCH])
    assert compatshim.find_unpicklable(HoldsConfig(), root="dataset") == []


def test_the_catalogue_row_targets_every_affected_module() -> None:
    from compatshim.patches import CATALOGUE
    from compatshim.patches.nuscenes_dict_views import AFFECTED

    (row,) = [patch for patch in CATALOGUE if patch.name == PATCH]
    assert set(row.targets) == set(AFFECTED)
