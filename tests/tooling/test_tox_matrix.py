"""tox.ini and matrix/*.txt agree: every pin file is an env, every env has a pin file and a family.

A new release is one pin file plus its name in ``env_list`` and the ``matrix``
label (tox 4 reads env names from tox.ini); this test says exactly which line is
missing, so nothing else can drift: no orphan pin file, no env without pins, no
family without a command, no ``ci`` env outside the matrix.
"""

from __future__ import annotations

import configparser
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOOLING_ENVS = {"lint", "gpu"}


def _tox() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(ROOT / "tox.ini")
    return parser


def _names(value: str) -> list[str]:
    return [n.strip() for n in re.split(r"[,\s]+", value) if n.strip()]


def _labels(tox: configparser.ConfigParser) -> dict[str, list[str]]:
    out = {}
    for line in tox["tox"]["labels"].strip().splitlines():
        name, _, value = line.partition("=")
        out[name.strip()] = _names(value)
    return out


def _pins(tox: configparser.ConfigParser, env: str) -> str:
    """The pin file an env installs: its section's ``deps = -r`` or matrix/<env>.txt."""
    section = f"testenv:{env}"
    deps = tox[section].get("deps", "") if tox.has_section(section) else ""
    found = re.search(r"-r\s*matrix/(\S+)", deps)
    return found.group(1) if found else f"{env}.txt"


def test_every_env_has_a_pin_file_and_every_pin_file_an_env() -> None:
    tox = _tox()
    envs = [e for e in _names(tox["tox"]["env_list"]) if e not in TOOLING_ENVS]
    sections = [s.split(":", 1)[1] for s in tox.sections() if s.startswith("testenv:")]
    used = {_pins(tox, env) for env in {*envs, *sections} if env not in TOOLING_ENVS}
    missing = sorted(p for p in used if not (ROOT / "matrix" / p).is_file())
    assert missing == [], f"envs without their pin file in matrix/: {missing}"
    pin_files = {p.name for p in (ROOT / "matrix").glob("*.txt")}
    orphans = sorted(pin_files - used)
    assert orphans == [], (
        f"pin files no env installs: {orphans}; add each name (without .txt) to env_list and "
        "the matrix label in tox.ini"
    )


def test_labels_cover_the_env_list() -> None:
    tox = _tox()
    envs = _names(tox["tox"]["env_list"])
    labels = _labels(tox)
    assert sorted(labels["matrix"]) == sorted(envs), "the matrix label must list every env"
    assert set(labels["ci"]) <= set(envs), set(labels["ci"]) - set(envs)
    assert len(set(envs)) == len(envs), "an env is listed twice"


def test_every_family_has_a_command_and_a_test_folder() -> None:
    tox = _tox()
    commands = tox["testenv"]["commands"]
    families = {line.split(":", 1)[0].strip() for line in commands.strip().splitlines()}
    for env in _names(tox["tox"]["env_list"]):
        if env in TOOLING_ENVS:
            continue
        family = env.split("-", 1)[0]
        assert family in families, f"{env}: no '{family}:' line under [testenv] commands"
        assert (ROOT / "tests" / family).is_dir(), f"{env}: no tests/{family}/"


def test_python_factors_are_honest() -> None:
    """``py3.X`` in a name is the Python the env runs on; nothing ends in a bare ``-2.X``."""
    for env in _names(_tox()["tox"]["env_list"]):
        assert not re.search(r"-[23]\.\d+$", env), (
            f"{env}: tox reads a trailing -2.X as 'Python 2.X'"
        )
