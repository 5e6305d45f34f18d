"""Do no harm (issue 37, item 11): a genuine Python 2 legacy checkpoint whose ``str`` is not
UTF-8 raises ``UnicodeDecodeError`` under plain torch, and users retry with
``encoding="latin1"``. Hardened mode raised UnsafeCheckpointError, so that retry never ran
and the resume failed; now it raises a UnicodeDecodeError too (compatshim's
UndecodableTextError) and the retry loads the file."""

from __future__ import annotations

import io
import os
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from compatshim import checkpoint  # noqa: E402


def _python2_latin1_file() -> bytes:
    """torch's legacy format with a Python 2 ``str`` holding latin-1 bytes (SHORT_BINSTRING),
    as Python 2 wrote a ``str`` of a checkpoint's metadata."""
    f = io.BytesIO()
    torch.save(["caf\u00e9", torch.zeros(2)], f, _use_new_zipfile_serialization=False)
    raw = "caf\u00e9".encode()
    python3 = b"X" + struct.pack("<I", len(raw)) + raw
    data = f.getvalue()
    assert data.count(python3) == 1
    latin1 = "caf\u00e9".encode("latin-1")
    return data.replace(python3, b"U" + bytes([len(latin1)]) + latin1)


def test_checkpoint_load_raises_unicode_decode_error_and_latin1_reads_it() -> None:
    data = _python2_latin1_file()
    with pytest.raises(UnicodeDecodeError) as failed:
        checkpoint.load(io.BytesIO(data))
    assert isinstance(failed.value, checkpoint.CheckpointError)
    assert "undecodable text" in str(failed.value)
    with pytest.raises(UnicodeDecodeError):  # plain torch: the same type
        torch.load(io.BytesIO(data), weights_only=False)


@pytest.mark.timeout(300)
def test_hardened_torch_load_keeps_torchs_type_so_the_latin1_retry_runs(tmp_path: Path) -> None:
    path = tmp_path / "py2.pt"
    path.write_bytes(_python2_latin1_file())
    code = textwrap.dedent(
        f"""
        import torch, compatshim
        compatshim.install(include=["torch-load-safe-globals"])
        try:
            torch.load({str(path)!r}, weights_only=False)
        except UnicodeDecodeError as exc:
            print("retry after", type(exc).__name__)
            loaded = torch.load({str(path)!r}, weights_only=False, encoding="latin1")
            print("loaded", loaded[0])
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "COMPATSHIM_SAFE_LOAD": "1"},
        timeout=240,
    )
    assert "retry after UndecodableTextError" in done.stdout, done.stdout + done.stderr
    assert "loaded caf\u00e9" in done.stdout, done.stdout + done.stderr
