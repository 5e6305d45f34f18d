"""Run pytest for one tox environment and fail loudly when it ran no test.

pytest exits 5 when nothing was collected; a matrix env that tests nothing is
a broken env, not a green one, so this maps 5 to a failure with a message.
Results go to ``.results/<env>.xml`` (junit) for ``matrix/make_results.py``.
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
    "transformers",
    "accelerate",
    "timm",
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


def main(argv: list[str]) -> int:
    env = os.environ.get("TOX_ENV_NAME", "local")
    results = os.path.join(os.environ.get("COMPATSHIM_RESULTS", ".results"), f"{env}.xml")
    os.makedirs(os.path.dirname(results), exist_ok=True)
    record_versions(results[: -len(".xml")] + ".versions.json")
    code = int(pytest.main([*argv, f"--junitxml={results}", "-o", f"junit_suite_name={env}"]))
    if code == pytest.ExitCode.NO_TESTS_COLLECTED:
        print(
            f"run_pytest: environment {env!r} collected no tests for {argv}: failing",
            file=sys.stderr,
        )
        return 1
    return code


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
