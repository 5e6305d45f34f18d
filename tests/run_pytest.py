"""Run pytest for one tox environment and fail loudly when it ran no test.

pytest exits 5 when nothing was collected; a matrix env that tests nothing is
a broken env, not a green one, so this maps 5 to a failure with a message.
The same holds when tests were collected but every one skipped (a pinned
framework that does not import, say): nothing passed, so the env fails.
Results go to ``.results/<env>.xml`` (junit) for ``matrix/make_results.py``,
the resolved versions (Python included) to ``.results/<env>.versions.json``.
"""

from __future__ import annotations

import json
import os
import sys
from importlib import metadata

import pytest

RECORDED = (
    "compatshim",
    "torch",
    "numpy",
    "colossalai",
    "nuscenes-devkit",
    "lightning",
    "lightning-fabric",
    "pytorch-lightning",
    "transformers",
    "accelerate",
    "timm",
    "mmengine",
    "torchvision",
    "deepspeed",
    "torch-geometric",
    "omegaconf",
    "hydra-core",
    "safetensors",
    "setuptools",
    "pytest",
)


def record_versions(path: str) -> None:
    """The exact resolved versions of this env, for matrix/RESULTS.md."""
    found = {}
    for name in RECORDED:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    found["python"] = ".".join(map(str, sys.version_info[:3]))
    with open(path, "w") as handle:
        json.dump(found, handle, indent=1)


class PassCounter:
    """pytest plugin: how many test calls passed."""

    def __init__(self) -> None:
        self.passed = 0

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "call" and report.passed:
            self.passed += 1


def main(argv: list[str]) -> int:
    env = os.environ.get("TOX_ENV_NAME", "local")
    results = os.path.join(os.environ.get("COMPATSHIM_TEST_RESULTS", ".results"), f"{env}.xml")
    os.makedirs(os.path.dirname(results), exist_ok=True)
    record_versions(results[: -len(".xml")] + ".versions.json")
    counter = PassCounter()
    args = [*argv, f"--junitxml={results}", "-o", f"junit_suite_name={env}"]
    code = int(pytest.main(args, plugins=[counter]))
    if code == pytest.ExitCode.NO_TESTS_COLLECTED:
        print(
            f"run_pytest: environment {env!r} collected no tests for {argv}: failing",
            file=sys.stderr,
        )
        return 1
    if code == pytest.ExitCode.OK and counter.passed == 0:
        print(
            f"run_pytest: environment {env!r} ran no passing test for {argv} "
            "(every test skipped): failing",
            file=sys.stderr,
        )
        return 1
    return code


def drop_own_folder(path: list[str]) -> None:
    """Run as ``python tests/run_pytest.py``, Python puts ``tests/`` first on ``sys.path``.

    There ``tests/lightning`` (the package ``tests.lightning``) would be imported as the
    real ``lightning``; the suite reaches its own code as ``tests.*`` from the checkout root.
    """
    here = os.path.dirname(os.path.abspath(__file__))
    path[:] = [entry for entry in path if os.path.abspath(entry or os.curdir) != here]


if __name__ == "__main__":
    drop_own_folder(sys.path)
    raise SystemExit(main(sys.argv[1:]))
