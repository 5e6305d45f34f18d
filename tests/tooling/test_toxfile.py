"""toxfile.py exposes pyenv's interpreters to uv as ``python3.X`` links, and only those
PATH does not already offer (absent, or only as a pyenv shim that may exit 127); an env on
3.14/3.15 has matrix/pythons.py install its interpreter only when this tox run runs it."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("tox", reason="tox is not installed: toxfile.py is a tox plugin")

TOXFILE = Path(__file__).resolve().parents[2] / "toxfile.py"


@pytest.fixture(scope="module")
def toxfile() -> ModuleType:
    spec = importlib.util.spec_from_file_location("compatshim_toxfile", TOXFILE)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    saved = dict(os.environ)
    try:
        spec.loader.exec_module(module)  # runs the plugin's set-up once; undone below
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return module


def fake_python(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def fake_pyenv(root: Path) -> None:
    for version in ("3.9.18", "3.12.1", "3.12.4", "3.13.0", "3.14-dev", "2.7.18"):
        minor = ".".join(version.split(".")[:2]).split("-")[0]
        fake_python(root / "versions" / version / "bin" / f"python{minor}")
    (root / "versions" / "myenv").symlink_to(root / "versions" / "3.13.0")  # pyenv-virtualenv
    fake_python(root / "shims" / "python3.12")  # a shim: may not run the version asked for


def test_newest_patch_per_minor(toxfile: ModuleType, tmp_path: Path) -> None:
    fake_pyenv(tmp_path)
    found = toxfile.pyenv_interpreters(tmp_path)
    versions = tmp_path / "versions"
    assert found == {
        "python3.9": versions / "3.9.18/bin/python3.9",
        "python3.12": versions / "3.12.4/bin/python3.12",
        "python3.13": versions / "3.13.0/bin/python3.13",
    }


def test_no_pyenv_means_nothing(toxfile: ModuleType, tmp_path: Path) -> None:
    assert toxfile.pyenv_interpreters(tmp_path / "absent") == {}


def test_shims_and_absent_names_are_missing_real_ones_are_not(
    toxfile: ModuleType, tmp_path: Path
) -> None:
    fake_pyenv(tmp_path)
    system = tmp_path / "usr-bin"
    fake_python(system / "python3.13")
    path = os.pathsep.join([str(tmp_path / "shims"), str(system)])
    missing = toxfile.missing_from_path(toxfile.pyenv_interpreters(tmp_path), tmp_path, path)
    assert sorted(missing) == ["python3.12", "python3.9"]


def test_links_are_created_and_replaced(toxfile: ModuleType, tmp_path: Path) -> None:
    fake_pyenv(tmp_path)
    folder = tmp_path / "links"
    found = toxfile.pyenv_interpreters(tmp_path)
    toxfile.link_interpreters(found, folder)
    assert {p.name: Path(os.readlink(p)) for p in folder.iterdir()} == found
    newer = {"python3.12": fake_python(tmp_path / "versions/3.12.9/bin/python3.12")}
    toxfile.link_interpreters(newer, folder)
    assert Path(os.readlink(folder / "python3.12")) == newer["python3.12"]
    assert sorted(p.name for p in folder.iterdir()) == ["python3.12", "python3.13", "python3.9"]


class _EnvConf(dict):  # type: ignore[type-arg]
    """The two things toxfile.runs reads from tox's env config: its name and labels."""

    def __init__(self, name: str, labels: list[str]) -> None:
        super().__init__(labels=labels)
        self.name = name


def _state(command: str, env: list[str] | None = None, labels: list[str] | None = None) -> Any:
    from tox.session.env_select import CliEnv

    options = SimpleNamespace(command=command, env=CliEnv(env), labels=labels or [], factors=[])
    core = {"labels": {"ci": ["lint", "core-torch2.15-py3.14"]}}
    return SimpleNamespace(conf=SimpleNamespace(options=options, core=core))


@pytest.mark.parametrize(
    ("command", "env", "labels", "expected"),
    [
        ("legacy", ["core-torch2.15-py3.14"], None, True),
        ("r", ["lint", "core-torch2.15-py3.14"], None, True),
        ("legacy", ["lint"], None, False),  # tox -e lint defines every env, runs one
        ("p", None, ["ci"], True),
        ("legacy", None, ["matrix"], True),  # the env's own label (matrix/*.txt)
        ("legacy", None, ["bench"], False),
        ("legacy", ["ALL"], None, True),
        ("legacy", None, None, True),  # plain `tox`: the whole env_list
        ("l", None, None, False),  # tox list / config install nothing
        ("c", ["core-torch2.15-py3.14"], None, False),
    ],
)
def test_only_an_env_this_run_runs_installs_its_python(
    toxfile: ModuleType,
    command: str,
    env: list[str] | None,
    labels: list[str] | None,
    expected: bool,
) -> None:
    conf = _EnvConf("core-torch2.15-py3.14", ["matrix"])
    assert toxfile.runs(conf, _state(command, env, labels)) is expected
