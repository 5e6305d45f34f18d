"""One name gate: ``load``, its refusal message, ``inspect`` and ``_gate.judge`` give the
same verdict for every allowlist row, every denied name, every alias spelling (numpy's two
core modules, ``__builtin__``, any split of a dotted name) and every allow entry form.

Each name is written into a real pickle (protocol 4 ``STACK_GLOBAL``) after a global no
source admits, so ``load`` always refuses and its message lists every other global it would
refuse: the name is in ``refused`` exactly when ``judge`` refuses it, and ``inspect`` calls
it covered exactly when ``judge`` admits it."""

from __future__ import annotations

import fractions
import os
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from compatshim import checkpoint  # noqa: E402
from compatshim.checkpoint import _gate, _names, deny, process_allow  # noqa: E402
from compatshim.checkpoint.allowlist import entries  # noqa: E402

UNKNOWN = ("compatshim_no_such_module", "Refused")  # admitted by nothing


pytestmark = pytest.mark.usefixtures("process_allow_cleared")


def _text(value: str) -> bytes:
    data = value.encode("utf-8", "surrogatepass")
    return b"\x8c" + bytes([len(data)]) + data if len(data) < 256 else b"X" + _len(data) + data


def _len(data: bytes) -> bytes:
    return len(data).to_bytes(4, "little")


def _naming(path: Path, split: tuple[str, str]) -> Path:
    """A pickle that names ``split`` then ``UNKNOWN`` as globals and returns None."""
    body = b"".join(_text(part) for part in split) + b"\x930"
    body += b"".join(_text(part) for part in UNKNOWN) + b"\x930N."
    path.write_bytes(b"\x80\x04" + body)
    return path


def _load_refuses(path: Path, allow: Any = ()) -> bool:
    """Whether ``load``'s refusal lists the first global (it always refuses ``UNKNOWN``)."""
    with pytest.raises(checkpoint.UnsafeCheckpointError) as raised:
        checkpoint.load(path, allow=allow)
    refused = raised.value.refused
    assert ".".join(UNKNOWN) in refused, refused
    return len(refused) == 2


def _inspect_covers(path: Path) -> bool:
    uses = {use.name: use for use in checkpoint.inspect(path).globals}
    assert not uses.pop(".".join(UNKNOWN)).covered
    (use,) = uses.values()
    return use.covered


def _resolvable(verdict: _gate.Verdict) -> bool:
    """Whether an admitted allowlist row's object exists here (load resolves it; a row for
    a name this release lacks is refused by load with the reason, after the gate)."""
    if verdict.entry is None or verdict.source != _gate.ALLOWLIST:
        return True
    try:
        verdict.entry.resolve()
    except LookupError:
        return False
    return True


def _agree(tmp_path: Path, split: tuple[str, str], allow: Any = ()) -> _gate.Verdict:
    """The verdicts of load (and its message) and inspect agree with ``judge``'s."""
    path = _naming(tmp_path / "named.pkl", split)
    verdict = _gate.judge(*split, _gate.Allow(allow))
    if not _resolvable(verdict):
        return verdict
    assert _load_refuses(path, allow) is not verdict.admitted, (split, verdict)
    if not allow:  # inspect has no call: it judges with the process-wide sources only
        assert _inspect_covers(path) is verdict.admitted, (split, verdict)
    return verdict


def _rows() -> list[tuple[str, str]]:
    """Every allowlist row as pickle writes it, and under its other spellings."""
    found = []
    for entry in entries():
        found.append((entry.module, entry.name))
        joined = entry.qualname
        found.append(tuple(joined.split(".", 1)))  # another split of the same name
        for old, new in (("numpy._core.", "numpy.core."), ("builtins.", "__builtin__.")):
            if joined.startswith(old):
                found.append(tuple((new + joined[len(old) :]).rpartition(".")[::2]))
    return found  # type: ignore[return-value]


def _denied() -> list[tuple[str, str]]:
    found = []
    for key in deny.DENIED:
        name = key.replace(".*", ".anything").replace("*", "anything")
        found.append(tuple(name.rpartition(".")[::2]))
        if name.startswith("builtins."):  # Python 2's spelling
            found.append(tuple(("__builtin__" + name[8:]).rpartition(".")[::2]))
    return found  # type: ignore[return-value]


def test_every_allowlist_row_and_its_aliases(tmp_path: Path) -> None:
    admitted = 0
    for split in _rows():
        verdict = _agree(tmp_path, split)
        admitted += verdict.admitted
        entry = verdict.entry
        assert entry is not None and verdict.name == _names.canonical(*split)
        assert verdict.admitted is entry.applies() or deny.denied(verdict.name) is not None
    assert admitted > 100  # the rows of this install's torch, numpy and standard library


@pytest.mark.filterwarnings("ignore:compatshim.*is ignored:RuntimeWarning")
def test_every_denied_name_whatever_allows_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    names = _denied()
    monkeypatch.setenv("COMPATSHIM_ALLOW", ",".join(".".join(n) for n in names))
    for split in names:
        verdict = _agree(tmp_path, split, allow=[".".join(split)])
        listed = verdict.source == _gate.ALLOWLIST  # a denied name only as its checked rule
        assert listed or (not verdict.admitted and verdict.dangerous), (split, verdict)


@pytest.mark.parametrize(
    "form",
    [
        "fractions.Fraction",
        fractions.Fraction,
        (fractions.Fraction, "fractions.Fraction"),
        (eval, "fractions.Fraction"),  # the object's own name is denied
        "compatshim_no_such_module.Thing",  # admitted by name; load cannot import it
    ],
    ids=["string", "object", "pair", "denied-object", "missing"],
)
def test_every_allow_form_for_one_call_and_for_the_process(tmp_path: Path, form: Any) -> None:
    split = ("fractions", "Fraction") if form != "compatshim_no_such_module.Thing" else None
    split = split or ("compatshim_no_such_module", "Thing")
    path = _naming(tmp_path / "named.pkl", split)
    verdict = _gate.judge(*split, _gate.Allow([form]))
    importable = split[0] != "compatshim_no_such_module"
    assert verdict.admitted is (form != (eval, "fractions.Fraction"))
    if importable:
        assert _load_refuses(path, [form]) is not verdict.admitted
    else:
        _cannot_import(path, [form])
    if form == (eval, "fractions.Fraction"):
        with pytest.raises(ValueError, match="denied"):
            checkpoint.allow(form, reason="the test")
        return
    checkpoint.allow(form, reason="the test")
    verdict = _gate.judge(*split)
    assert verdict.source == "compatshim.checkpoint.allow" and _inspect_covers(path)
    if importable:
        assert not _load_refuses(path)
    else:
        _cannot_import(path)


def _cannot_import(path: Path, allow: Any = ()) -> None:
    """An admitted global this process cannot import: no refusal (the file is no attack, an
    allow entry already names it), an error saying what is missing here."""
    with pytest.raises(checkpoint.CheckpointError, match="is allowed but cannot be imported") as e:
        checkpoint.load(path, allow=allow)
    assert not isinstance(e.value, checkpoint.UnsafeCheckpointError), e.value


@pytest.mark.parametrize("source", ["COMPATSHIM_ALLOW", "COMPATSHIM_ALLOW_FILE"])
def test_environment_and_file_entries_under_either_numpy_spelling(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str
) -> None:
    """An entry written with numpy 1's core module admits numpy 2's spelling and back."""
    for written, named in (
        ("numpy.core.records.record", ("numpy._core.records", "record")),
        ("numpy._core.records.record", ("numpy.core.records", "record")),
    ):
        process_allow._reset()
        if source == "COMPATSHIM_ALLOW":
            monkeypatch.setenv(source, written)
        else:
            listing = tmp_path / "allow.txt"
            listing.write_text(f"{written}  # the test\n")
            monkeypatch.setenv(source, str(listing))
        verdict = _agree(tmp_path, named)
        assert verdict.admitted and verdict.source != _gate.ALLOWLIST
        assert verdict.name == "numpy._core.records.record"
    assert os.environ[source]


def test_the_allowlist_comes_before_any_allow_entry(tmp_path: Path) -> None:
    """A call's allow= never replaces the allowlist's checked handling of a row that applies."""
    verdict = _gate.judge("torch", "Size", _gate.Allow([torch.Size]))
    assert verdict.source == _gate.ALLOWLIST
    assert checkpoint.load(_saved(tmp_path, torch.Size([2, 3])), allow=[torch.Size]) == (2, 3)


def _saved(folder: Path, value: Any) -> Path:
    path = folder / "saved.pt"
    torch.save(value, path)
    return path
