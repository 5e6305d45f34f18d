"""What Lightning's own version checks answer, as JSON: run once under setuptools 81 (real
pkg_resources) to write the reference, and under setuptools >= 82 with compatshim armed.

Usage: ``python tests/aliases/pkg_resources_answers.py [--armed] > answers.json``.
The reference in ``fixtures/pkg_resources_setuptools81.json`` came from
``/work/venv-aliases-st81`` (pins of matrix/aliases-lightning2.3-setuptools82.txt with
setuptools==81.0.0).
"""

from __future__ import annotations

import json
import operator
import sys
from importlib import metadata
from typing import Any, Callable

REQUIREMENTS = (
    "torch>=2.0",
    "torch>100",
    "torch<2",
    "numpy>=1.26",
    "numpy<2",
    "lightning==2.3.3",
    "lightning>=2.4",
    "lightning-utilities>=0.10",
    "lightning_utilities<0.11",
    "packaging>=20",
    "typing-extensions>=4.4",
    "PyYAML>=5.4",
    "pyyaml>100",
    "fsspec[http]>=2022.5.0",
    "tqdm>=4.57",
    "torchmetrics>=0.7",
    "torchmetrics<0.7",
    "pytorch-lightning>=2.0",
    "jinja2",
    "sympy>=1.13",
    "networkx",
    "filelock",
    "aiohttp>=3.8",
    "not-a-real-package-xyz",
    "not-a-real-package-xyz>=1",
    "pytest>=8",
    "torch; python_version < '3'",
)
MODULES = (
    "torch",
    "torch.distributed",
    "numpy",
    "lightning",
    "lightning.fabric",
    "yaml",
    "tqdm.auto",
    "not_a_module_xyz",
    "torch.not_a_submodule",
)
COMPARISONS = (
    ("torch", "2.0"),
    ("torch", "100"),
    ("numpy", "1.0"),
    ("lightning", "2.3"),
    ("yaml", "5.0"),
    ("jinja2", "3"),
    ("aiohttp", "4"),
    ("not_a_module_xyz", "0"),
)
DISTRIBUTIONS = ("torch", "numpy", "lightning", "PyYAML", "typing_extensions", "no-such-dist-x")


def _outcome(call: Callable[[], Any]) -> Any:
    try:
        return call()
    except Exception as exc:
        return f"raises {type(exc).__name__}"


def answers() -> dict[str, Any]:
    import pkg_resources
    from lightning_utilities.core.imports import RequirementCache, compare_version, module_available

    def resolved(req: str) -> list[str]:
        return sorted({dist.key for dist in pkg_resources.require(req)})

    found: dict[str, Any] = {
        "versions": {
            name: metadata.version(name)
            for name in ("torch", "numpy", "lightning", "lightning-utilities", "packaging")
        },
        "RequirementCache": {r: bool(RequirementCache(r)) for r in REQUIREMENTS},
        "require": {r: _outcome(lambda r=r: resolved(r)) for r in REQUIREMENTS},
        "module_available": {m: module_available(m) for m in MODULES},
        "compare_version": {
            f"{p}>={v}": _outcome(lambda p=p, v=v: compare_version(p, operator.ge, v))
            for p, v in COMPARISONS
        },
        "get_distribution": {
            d: _outcome(lambda d=d: str(pkg_resources.get_distribution(d).version))
            for d in DISTRIBUTIONS
        },
        "get_distribution_key": {
            d: _outcome(lambda d=d: pkg_resources.get_distribution(d).key) for d in DISTRIBUTIONS
        },
        "parse_version": str(
            pkg_resources.parse_version("2.3.3rc1") < pkg_resources.parse_version("2.3.3")
        ),
        "entry_points": sorted(
            f"{ep.name}={ep.module_name}:{'.'.join(ep.attrs)}"
            for ep in pkg_resources.iter_entry_points("console_scripts")
            if ep.name in ("lightning", "fabric", "isympy", "tqdm", "f2py", "numpy-config")
        ),
        "resource_string": len(pkg_resources.resource_string("lightning", "version.info")),
        "resource_filename": pkg_resources.resource_filename("lightning", "version.info").endswith(
            "lightning/version.info"
        ),
    }
    return found


if __name__ == "__main__":
    if "--armed" in sys.argv:
        import compatshim

        compatshim.install()
    json.dump(answers(), sys.stdout, indent=1, sort_keys=True)
