"""The one front door (issue 41 item 4): every checkpoint read is a Request through
``checkpoint.request.read``; options travel with the request (no context variables), the
patches use only public names, and a refusal is data that each caller words."""

from __future__ import annotations

import ast
import io
import pickle
import threading
import types
from pathlib import Path

import pytest

from compatshim import checkpoint
from compatshim.checkpoint import UnsafeCheckpointError
from compatshim.checkpoint.request import Request, read

SRC = Path(checkpoint.__file__).parent.parent


def _private_checkpoint_imports(path: Path) -> list[str]:
    """``checkpoint._x`` modules (or names) a patch imports, however written."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            parts = module.split(".")
            if "checkpoint" in parts:
                rest = parts[parts.index("checkpoint") + 1 :]
                named = [a.name for a in node.names] if not rest else []
                if any(p.startswith("_") for p in rest + named):
                    found.append(f"{path.name}:{node.lineno} {module}")
        elif isinstance(node, ast.Import):
            found += [
                f"{path.name}:{node.lineno} {a.name}"
                for a in node.names
                if ".checkpoint._" in a.name
            ]
    return found


def test_patches_import_no_private_checkpoint_module() -> None:
    found = [
        hit
        for path in sorted((SRC / "patches").glob("*.py"))
        for hit in _private_checkpoint_imports(path)
    ]
    assert found == []


def test_no_context_variable_carries_a_read_option() -> None:
    """Options are the request's: a ContextVar would leak into reads the caller did not
    make (a nested load, a callback) and costs a set/reset per call."""
    users = [
        p.name for p in sorted((SRC / "checkpoint").glob("*.py")) if "ContextVar" in p.read_text()
    ]
    assert users == []


def test_object_arrays_only_for_the_request_that_asks() -> None:
    np = pytest.importorskip("numpy")
    data = pickle.dumps(np.array([1, "a", None], dtype=object), protocol=2)
    got = read(io.BytesIO(data), Request(object_arrays=True, expect="pickle"))
    assert got.dtype == object and list(got) == [1, "a", None]
    with pytest.raises(UnsafeCheckpointError) as refused:
        read(io.BytesIO(data), Request())
    assert "numpy object dtype" in refused.value.refused


def test_encoding_is_the_requests_even_across_threads() -> None:
    """Python 2 str (protocol 2 BINSTRING) read as each request asks, at the same time."""
    data = b"\x80\x02U\x03\xe9t\xe9q\x00."  # SHORT_BINSTRING b"\xe9t\xe9"
    results: dict[str, object] = {}

    def run(encoding: str) -> None:
        for _ in range(200):
            got = read(io.BytesIO(data), Request(encoding=encoding))
            if results.setdefault(encoding, got) != got:
                results[encoding] = "changed"

    threads = [threading.Thread(target=run, args=(e,)) for e in ("latin1", "bytes")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert results == {"latin1": "été", "bytes": b"\xe9t\xe9"}


def test_an_unknown_encoding_is_a_lookup_error_before_any_read() -> None:
    with pytest.raises(LookupError):
        Request(encoding="no-such-codec")
    with pytest.raises(LookupError):
        Request(encoding=b"latin1")  # type: ignore[arg-type]


def test_a_refusal_is_data_and_each_caller_words_its_advice() -> None:
    data = pickle.dumps(types.SimpleNamespace())
    with pytest.raises(UnsafeCheckpointError) as bare:
        read(io.BytesIO(data), Request())
    with pytest.raises(UnsafeCheckpointError) as loaded:
        checkpoint.load(io.BytesIO(data))
    assert bare.value.refused == loaded.value.refused == ("types.SimpleNamespace",)
    assert "allow=[...]" not in str(bare.value)
    assert str(loaded.value).startswith(str(bare.value) + ". allow=[...] admits")


def test_a_nested_pickle_shares_the_requests_allow() -> None:
    """A pickled storage inside the file is read with the outer request's allow= (and
    budget): what the outer call allowed, and only that, is admitted inside."""
    torch = pytest.importorskip("torch")
    inner = pickle.dumps(types.SimpleNamespace(x=1), protocol=2)

    class Outer:
        def __reduce__(self) -> tuple[object, ...]:
            return (torch.storage._load_from_bytes, (inner,))

    data = pickle.dumps(Outer(), protocol=2)
    with pytest.raises(UnsafeCheckpointError) as refused:
        read(io.BytesIO(data), Request())
    assert "types.SimpleNamespace" in refused.value.refused
    # admitted inside; then refused as a storage's value (not a storage), never run
    with pytest.raises(checkpoint.CheckpointError) as other:
        read(io.BytesIO(data), Request(allow=[types.SimpleNamespace]))
    assert "types.SimpleNamespace" not in getattr(other.value, "refused", ())


class _Touch:
    """Pickles as ``pathlib.Path(marker).touch()``: what a payload would run."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> object:
        return (Path.touch, (self.marker,))


@pytest.mark.parametrize("flag", ["false", "no", "0", 0, None, 1])
def test_trusted_and_mmap_take_a_bool_only(tmp_path: Path, flag: object) -> None:
    """``trusted="false"`` is truthy: it ran every payload of the file through
    ``torch.load(weights_only=False)``. Only True runs the file's code."""
    marker = tmp_path / "ran"
    path = tmp_path / "payload.pkl"
    path.write_bytes(pickle.dumps({"x": _Touch(marker)}))
    for name in ("trusted", "mmap"):
        with pytest.raises(TypeError, match=f"{name}: expected True or False"):
            checkpoint.load(path, **{name: flag})  # type: ignore[arg-type]
    assert not marker.exists()


def test_a_folder_is_a_checkpoint_error_saying_what_reads_it(tmp_path: Path) -> None:
    """``load(folder)`` raised a bare IsADirectoryError, outside the two errors the docs
    promise; it is a CheckpointError (still an IsADirectoryError), a DCP folder named so."""
    with pytest.raises(checkpoint.CheckpointError, match="a folder, not a checkpoint file") as e:
        checkpoint.load(tmp_path)
    assert isinstance(e.value, IsADirectoryError)
    (tmp_path / ".metadata").write_bytes(b"")
    with pytest.raises(IsADirectoryError, match="a DCP checkpoint folder, not a file: torch"):
        checkpoint.load(str(tmp_path))


def test_inspect_of_no_path_names_its_argument() -> None:
    """``inspect(None)`` was an AttributeError ('NoneType' object has no attribute 'tell')."""
    with pytest.raises(TypeError, match="f: expected a path or a seekable binary file"):
        checkpoint.inspect(None)
