"""The pkg_resources subset under setuptools >= 82, and setuptools' own where it exists."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.aliases.helpers import (
    ROOT,
    child_env,
    real_module_findable,
    run,
    skip_unless_installed,
    version_at_least,
)

HERE = Path(__file__).parent
REFERENCE = HERE / "fixtures" / "pkg_resources_setuptools81.json"

needs_subset = pytest.mark.skipif(
    real_module_findable("pkg_resources"),
    reason="a real pkg_resources is installed (setuptools < 82): nothing to provide",
)


@needs_subset
def test_import_lightning_fails_plain_and_works_armed() -> None:
    skip_unless_installed("lightning")
    plain = run("import lightning", check=False)
    assert plain.returncode != 0 and "No module named 'pkg_resources'" in plain.stderr
    found = run(
        "import json, compatshim; compatshim.install(); import lightning, pkg_resources; "
        "row = [r for r in compatshim.status() if r.name == 'removed-names'][0]; "
        "print(json.dumps([lightning.__version__, pkg_resources.__name__, row.used]))"
    )
    assert found[1] == "pkg_resources"
    assert found[2] == ["pkg_resources"]


@needs_subset
def test_lightning_utilities_answers_equal_setuptools81() -> None:
    """Lightning's own checks answer as they did with setuptools 81's real pkg_resources."""
    skip_unless_installed("lightning-utilities")
    reference = json.loads(REFERENCE.read_text())
    done = subprocess.run(
        [sys.executable, "-W", "ignore", str(HERE / "pkg_resources_answers.py"), "--armed"],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    armed = json.loads(done.stdout)
    if armed["versions"] != reference["versions"]:
        pytest.skip(f"reference recorded for {reference['versions']}, found {armed['versions']}")
    for key in reference:
        assert armed[key] == reference[key], key


@needs_subset
def test_missing_name_names_itself_and_the_caller() -> None:
    found = run(
        "import json, compatshim; compatshim.install(); import pkg_resources\n"
        "try:\n    pkg_resources.working_set\nexcept AttributeError as exc:\n"
        "    print(json.dumps([str(exc), hasattr(pkg_resources, 'Requirement')]))"
    )
    assert "pkg_resources.working_set is not provided" in found[0]
    assert "<string>:3" in found[0]
    assert found[1] is False


@needs_subset
def test_declare_namespace_is_a_no_op_and_uninstall_forgets_the_module() -> None:
    found = run(
        "import json, sys, compatshim; compatshim.install(); import pkg_resources\n"
        "before = dict(vars(sys.modules['json']))\n"
        "pkg_resources.declare_namespace('json')\n"
        "same = before == dict(vars(sys.modules['json']))\n"
        "compatshim.uninstall()\n"
        "from compatshim.aliases.finder import RemovedNamesFinder\n"
        "print(json.dumps([same, 'pkg_resources' in sys.modules, "
        "any(isinstance(f, RemovedNamesFinder) for f in sys.meta_path)]))"
    )
    assert found == [True, False, False]


@pytest.mark.skipif(
    not real_module_findable("pkg_resources") or version_at_least("setuptools", "82"),
    reason="needs setuptools < 82 (its own pkg_resources)",
)
def test_setuptools_own_pkg_resources_is_untouched() -> None:
    found = run(
        "import json, compatshim; compatshim.install(); import pkg_resources\n"
        "print(json.dumps([pkg_resources.__file__, hasattr(pkg_resources, 'working_set')]))"
    )
    assert "compatshim" not in found[0] and found[0].endswith("pkg_resources/__init__.py")
    assert found[1] is True


def test_never_shadows_an_installed_module(tmp_path: Path) -> None:
    """A real ``pkg_resources`` on sys.path wins, and the finder declines to answer for it."""
    package = tmp_path / "pkg_resources"
    package.mkdir()
    (package / "__init__.py").write_text("REAL = True\n")
    found = run(
        "import json, sys, compatshim; compatshim.install()\n"
        "from compatshim.aliases.finder import RemovedNamesFinder\n"
        "from compatshim._engine.patching import Patcher\n"
        "declined = RemovedNamesFinder(Patcher()).find_spec('pkg_resources', None) is None\n"
        "import pkg_resources\n"
        "print(json.dumps([declined, getattr(pkg_resources, 'REAL', False), "
        "pkg_resources.__file__]))",
        extra_path=str(tmp_path),
    )
    assert found[0] is True and found[1] is True
    assert found[2].startswith(str(tmp_path))


@needs_subset
def test_get_distribution_does_not_resolve_dependencies(tmp_path: Path) -> None:
    """setuptools 81 returns an installed distribution as found (``working_set.find``), even
    when one of its own dependencies is missing (``get_distribution(__name__).version``), or
    its requirement's marker does not hold here."""
    info = tmp_path / "fakepkg-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: fakepkg\nVersion: 1.0\n"
        "Requires-Dist: not-a-real-package-xyz>=1\n"
    )
    found = run(
        "import json, compatshim; compatshim.install(); import pkg_resources\n"
        "names = ('fakepkg', 'fakepkg>=1', \"fakepkg; python_version < '3'\")\n"
        "answers = [pkg_resources.get_distribution(r).version for r in names]\n"
        "try:\n    pkg_resources.get_distribution('fakepkg>=2')\n"
        "except pkg_resources.VersionConflict as exc:\n    answers.append(str(exc.req))\n"
        "print(json.dumps(answers))",
        extra_path=str(tmp_path),
    )
    assert found == ["1.0", "1.0", "1.0", "fakepkg>=2"]
