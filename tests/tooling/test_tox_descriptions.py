"""``tox l`` describes every env, and lists only envs that exist.

A matrix env's description is the first sentence of its pin file's comment (toxfile.py).
A ``[testenv]`` description opening with ``{env_name}:`` once read to tox as a factor
condition: the 66 pinned envs showed "[no description]" and a phantom env ``env_name``
was listed (and failed when run).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path
from types import ModuleType

import pytest

from tests.tooling.test_tox_matrix import _tox

pytest.importorskip("tox", reason="tox is not installed: the env listing cannot be asked")

ROOT = Path(__file__).resolve().parents[2]


def _tox_list(root: Path) -> dict[str, str]:
    """``{env: description}`` as ``tox l`` prints them (free of a tox env's own variables)."""
    done = _tox(root, "l")
    assert done.returncode == 0, done.stdout + done.stderr
    listed = {}
    for line in done.stdout.splitlines():
        name, arrow, description = line.partition(" -> ")
        if arrow:
            listed[name.strip()] = description.strip()
    return listed


@pytest.fixture(scope="module")
def toxfile() -> ModuleType:
    spec = importlib.util.spec_from_file_location("compatshim_toxfile_desc", ROOT / "toxfile.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    saved = dict(os.environ)
    try:
        spec.loader.exec_module(module)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return module


@pytest.mark.timeout(200)
def test_every_env_is_described_and_none_is_a_phantom(toxfile: ModuleType) -> None:
    listed = _tox_list(ROOT)
    assert "env_name" not in listed
    assert sorted(env for env, text in listed.items() if text in ("", "[no description]")) == []
    pins = {p.stem: p for p in (ROOT / "matrix").glob("*.txt") if not p.name.startswith("bench")}
    assert set(pins) <= set(listed)
    for env, path in sorted(pins.items()):
        assert listed[env] == toxfile.describe(path), env


@pytest.mark.timeout(200)
def test_a_new_pin_file_brings_its_own_description(tmp_path: Path) -> None:
    for name in ("tox.ini", "toxfile.py", "src/compatshim/matrix_cli.py"):  # toxfile loads the last
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copytree(ROOT / "matrix", tmp_path / "matrix")
    (tmp_path / "matrix" / "core-torch9.9.txt").write_text(
        "# core family on torch 9.9 (a future release; run on CPU): patches, adapters.\n"
        "# A second sentence, not shown.\ntorch==9.9.0\n"
    )
    (tmp_path / "matrix" / "core-torch9.8.txt").write_text("torch==9.8.0\n")  # no comment
    listed = _tox_list(tmp_path)
    assert listed["core-torch9.9"] == (
        "core family on torch 9.9 (a future release; run on CPU): patches, adapters"
    )
    assert listed["core-torch9.8"] == "the pins in matrix/core-torch9.8.txt"


@pytest.mark.parametrize(
    ("comment", "described"),
    [
        ("# one line, no full stop\n", "one line, no full stop"),
        ("# goes on (a, b;\n# c) to the next; then more\n", "goes on (a, b; c) to the next"),
        ("# ends here (numpy 2.5)\n# omegaconf: a note of its own\n", "ends here (numpy 2.5)"),
        ("# first. second\n", "first"),
        ("# torch 2.15.0 and numpy 2.5.5 are pinned.\n", "torch 2.15.0 and numpy 2.5.5 are pinned"),
        ("#\n# after an empty comment line\n", "the pins in matrix/x.txt"),
    ],
)
def test_describe_takes_the_first_sentence(
    toxfile: ModuleType, tmp_path: Path, comment: str, described: str
) -> None:
    pins = tmp_path / "x.txt"
    pins.write_text(comment + "torch==2.15.0\n")
    assert toxfile.describe(pins) == described
