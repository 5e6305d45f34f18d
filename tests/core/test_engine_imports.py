"""``compatshim._engine`` imports only downward: itself and the leaf modules beside it.

The engine (registry, hooks, versions) is the mechanism every patch and adapter builds on;
an import of ``compatshim.patches`` or of the package itself from inside it made the layers
a circle. What the engine needs from above (the catalogue, compatshim's own version) is
handed to it by ``compatshim/__init__.py``.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import compatshim
from compatshim._engine import versions

ENGINE = Path(compatshim.__file__).parent / "_engine"
LEAVES = {"compatshim._records", "compatshim._settings", "compatshim._text", "compatshim._warn"}


def _targets(path: Path, package: list[str]) -> list[tuple[int, str]]:
    """Every module an import in ``path`` (a module of ``package``) names, with its line."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[: len(package) - node.level + 1]
            module = ".".join([*base, node.module] if node.module else base)
            names = [module] if node.module else [f"{module}.{a.name}" for a in node.names]
            found += [(node.lineno, name) for name in names]
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
            found += [(node.lineno, str(n)) for n in names if str(n).startswith("compatshim")]
    return found


def test_the_engine_imports_only_itself_and_the_leaves() -> None:
    upward = [
        f"{path.name}:{line}: {target}"
        for path in sorted(ENGINE.glob("*.py"))
        for line, target in _targets(path, ["compatshim", "_engine"])
        if not target.startswith("compatshim._engine") and target not in LEAVES
    ]
    assert upward == []


def test_the_leaves_import_nothing_above_the_engine() -> None:
    """They sit below the engine (``_settings`` reaches ``_engine.decisions`` lazily)."""
    for leaf in sorted(LEAVES):
        path = ENGINE.parent / f"{leaf.rpartition('.')[2]}.py"
        above = [
            target
            for _, target in _targets(path, ["compatshim"])
            if not target.startswith("compatshim._engine") and target not in LEAVES
        ]
        assert above == [], leaf


def test_the_catalogue_and_own_version_reach_the_engine_from_above() -> None:
    """A fresh process: importing the package tells the engine both; status() sees every patch."""
    code = (
        "import compatshim\n"
        "from compatshim._engine import registry, versions\n"
        "from compatshim.patches import CATALOGUE\n"
        "names = [row.name for row in compatshim.status()]\n"
        "assert names and set(names) == {p.name for p in CATALOGUE}, names\n"
        "assert versions.installed_version('compatshim') == compatshim.__version__\n"
        "print('ok')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.stdout.strip() == "ok", done.stderr
    assert versions.running == {"compatshim": compatshim.__version__}
