"""Child interpreters of a stand-in run: install the CUDA stand-in once torch is imported.

On ``PYTHONPATH`` only when ``COMPATSHIM_TEST_STANDIN_CUDA`` is set (``tests/conftest.py``).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from typing import Any


class _AfterTorch:
    """A meta-path finder that lets torch import as usual, then installs the stand-in."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        loader: Any = spec.loader
        exec_module = loader.exec_module

        def run(module: Any) -> None:
            exec_module(module)
            here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
            found = importlib.util.spec_from_file_location(
                "_compatshim_cuda_standin", os.path.join(here, "cuda_standin.py")
            )
            assert found is not None and found.loader is not None
            standin = importlib.util.module_from_spec(found)
            found.loader.exec_module(standin)
            standin.install(standin.count())

        loader.exec_module = run
        return spec


if os.environ.get("COMPATSHIM_TEST_STANDIN_CUDA", "").strip().isdigit():
    sys.meta_path.insert(0, _AfterTorch())
