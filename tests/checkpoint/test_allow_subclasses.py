"""An allow entry for a numpy array subclass admits it: what a user allows is what loads.

numpy's own regression test ``test_char_dump`` (a ``chararray`` through ``pickle.dump``
and ``numpy.load(allow_pickle=True)``) failed hardened, and allowing the class did not help:
``_reconstruct`` took a plain ``ndarray`` only, whatever was allowed, and the refusal still
advised ``allow=[...]``. Real numpy objects, pickled by plain ``pickle``.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

import pytest

np = pytest.importorskip("numpy")
pytestmark = pytest.mark.filterwarnings("ignore:the matrix subclass:PendingDeprecationWarning")

from compatshim.checkpoint import UnsafeCheckpointError, load  # noqa: E402


def _pickled(obj: Any, protocol: int) -> io.BytesIO:
    return io.BytesIO(pickle.dumps(obj, protocol=protocol))


def _name(obj: Any) -> str:
    """The class as pickle names it (numpy 1.x: ``numpy.chararray``; 2.x: ``numpy.char...``)."""
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


CASES = {
    "chararray": lambda: np.char.array(np.arange(1000, 1010), itemsize=4),
    "matrix": lambda: np.matrix([[1.0, 2.0], [3.0, 4.0]]),
    # its own reconstructor and __setstate__ (mask, fill value): both allowed
    "masked": lambda: np.ma.masked_array([1, 2, 3], mask=[0, 1, 0], fill_value=7),
}
MASKED = "numpy.ma.core._mareconstruct"


@pytest.mark.parametrize("protocol", [2, pickle.HIGHEST_PROTOCOL])
@pytest.mark.parametrize("case", sorted(CASES))
def test_an_allowed_array_subclass_loads_as_saved(case: str, protocol: int) -> None:
    saved = CASES[case]()
    names = [_name(saved), *([MASKED] if case == "masked" else [])]
    # objects, not names: numpy 2.5 makes numpy.char.chararray in a module __getattr__ only
    allowed = [type(saved), *([np.ma.core._mareconstruct] if case == "masked" else [])]
    with pytest.raises(UnsafeCheckpointError) as refused:
        load(_pickled(saved, protocol))
    assert set(refused.value.refused) <= set(names)  # named, so the advice admits it
    loaded = load(_pickled(saved, protocol), allow=allowed)
    assert type(loaded) is type(saved)
    assert loaded.dtype == saved.dtype and loaded.shape == saved.shape
    assert loaded.tolist() == saved.tolist()
    if case == "masked":
        assert loaded.mask.tolist() == saved.mask.tolist() and loaded.fill_value == 7


def test_allowing_one_class_admits_no_other() -> None:
    matrix = np.matrix([[1.0]])
    with pytest.raises(UnsafeCheckpointError) as refused:
        load(_pickled(matrix, 2), allow=[type(CASES["chararray"]())])
    assert refused.value.refused == (_name(matrix),)
    masked = np.ma.masked_array([1, 2], mask=[0, 1])
    with pytest.raises(UnsafeCheckpointError) as refused:  # the function alone: not the class
        load(_pickled(masked, 2), allow=[MASKED])
    assert _name(masked) in refused.value.refused


def test_an_allowed_subclass_state_is_still_checked() -> None:
    """The array's own state is checked as for a plain array (a data length that does not
    match its shape is damage), where the subclass keeps ndarray's ``__setstate__``."""
    data = pickle.dumps(np.matrix([[1.0, 2.0]]), 3)  # no frames: bytes edited in place
    raw = np.array([1.0, 2.0]).tobytes()
    cut = data.replace(b"C\x10" + raw, b"C\x08" + raw[:8])  # SHORT_BINBYTES of 8, not 16
    assert cut != data
    with pytest.raises(Exception) as failed:
        load(io.BytesIO(cut), allow=[_name(np.matrix([[1.0]]))])
    assert "needs 16 bytes" in str(failed.value)


def test_a_name_a_module_makes_lazily_says_to_allow_the_object(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A name the module makes in its ``__getattr__`` (numpy 2.5's deprecated
    ``numpy.char.chararray``) cannot be allowed by name: compatshim reads ``vars()`` and runs
    no module code to find it. The error said it "does not exist"; it says what works now."""
    (tmp_path / "lazy_mod_for_allow.py").write_text(
        "class _Made:\n    pass\n\n"
        "def __getattr__(name):\n"
        "    if name == 'Thing':\n"
        "        return _Made\n"
        "    raise AttributeError(name)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    data = b"\x80\x02clazy_mod_for_allow\nThing\nq\x00."  # the class itself, as a value
    with pytest.raises(Exception) as failed:
        load(io.BytesIO(data), allow=["lazy_mod_for_allow.Thing"])
    assert "module __getattr__" in str(failed.value)
    assert "allow the object itself" in str(failed.value)
    import lazy_mod_for_allow

    assert load(io.BytesIO(data), allow=[(lazy_mod_for_allow.Thing, "lazy_mod_for_allow.Thing")])
