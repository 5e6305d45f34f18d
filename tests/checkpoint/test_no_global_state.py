"""Loading changes no global state (issue 37, item 12): the error class compatshim raises with
torch's type as well is made without setting an attribute on a type mid-load (an audit hook
saw ``object.__setattr__`` on a CheckpointError subclass while reading an invalid sparse
tensor, as torch's own test suite saves one)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")


@pytest.mark.timeout(300)
def test_an_invalid_sparse_tensor_is_refused_without_setting_attributes(tmp_path: Path) -> None:
    path = tmp_path / "invalid_sparse.pt"
    indices = torch.tensor([[0, 7]])  # index 7 in a size-2 tensor: invalid
    bad = torch.sparse_coo_tensor(indices, torch.tensor([1.0, 2.0]), (2,), check_invariants=False)
    torch.save({"bad": bad}, path)
    code = textwrap.dedent(
        f"""
        import sys
        import torch
        from compatshim import checkpoint
        events = []
        def hook(event, args):
            if event == "object.__setattr__" and isinstance(args[0], type):
                if issubclass(args[0], checkpoint.CheckpointError):
                    events.append(str(args[1]))
        sys.addaudithook(hook)
        try:
            checkpoint.load({str(path)!r})
        except checkpoint.CheckpointError as exc:
            print("refused", type(exc).__name__, isinstance(exc, RuntimeError))
        print("setattr on types:", events)
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    assert "refused CheckpointError" in done.stdout, done.stdout + done.stderr
    assert "setattr on types: []" in done.stdout, done.stdout
