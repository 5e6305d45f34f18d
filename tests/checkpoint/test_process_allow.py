"""Process-wide allow entries: code, COMPATSHIM_ALLOW, COMPATSHIM_ALLOW_FILE, entry points."""

from __future__ import annotations

import decimal
import fractions
import importlib
import io
import sys
import threading
import uuid
import warnings
from pathlib import Path
from typing import Any, Iterator

import pytest

torch = pytest.importorskip("torch")

from compatshim import checkpoint  # noqa: E402
from compatshim.checkpoint import process_allow  # noqa: E402

pytestmark = pytest.mark.usefixtures("process_allow_cleared")


def _saved(obj: Any) -> io.BytesIO:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return buffer


def _refused(obj: Any) -> tuple[str, ...]:
    with pytest.raises(checkpoint.UnsafeCheckpointError) as raised:
        checkpoint.load(_saved(obj))
    return raised.value.refused


def test_allow_needs_a_reason_and_takes_what_allow_takes() -> None:
    with pytest.raises(ValueError, match="reason"):
        checkpoint.allow("fractions.Fraction", reason=" ")
    with pytest.raises(TypeError):
        checkpoint.allow(3, reason="not a global")
    checkpoint.allow(fractions.Fraction, reason="an object")
    checkpoint.allow("fractions.Fraction", reason="twice is once")
    assert [e.qualname for e in checkpoint.allowed()] == ["fractions.Fraction"]
    assert checkpoint.load(_saved(fractions.Fraction(1, 3))) == fractions.Fraction(1, 3)
    checkpoint.disallow("fractions.Fraction")
    assert _refused(fractions.Fraction(1, 3)) == ("fractions.Fraction",)


def test_a_string_is_not_imported_until_a_file_needs_it() -> None:
    sys.modules.pop("tabnanny", None)
    checkpoint.allow("tabnanny.NannyNag", reason="the test")
    checkpoint.load(_saved({"w": torch.ones(1)}))
    assert "tabnanny" not in sys.modules


def test_allow_from_many_threads() -> None:
    names = [f"module{i}.Name" for i in range(50)]
    threads = [
        threading.Thread(target=checkpoint.allow, args=(n,), kwargs={"reason": "t"}) for n in names
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert sorted(e.qualname for e in checkpoint.allowed()) == sorted(names)


def test_environment_entries_and_a_malformed_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMPATSHIM_ALLOW", "fractions.Fraction, decimal.Decimal")
    assert checkpoint.load(_saved([fractions.Fraction(1, 2), decimal.Decimal("2")])) == [
        fractions.Fraction(1, 2),
        decimal.Decimal("2"),
    ]
    # one malformed entry is skipped and named; the entries beside it stay in force
    monkeypatch.setenv("COMPATSHIM_ALLOW", "fractions.Fraction,not-a-name decimal.Decimal")
    with pytest.warns(RuntimeWarning, match="1 malformed allow entry skipped") as warned:
        assert checkpoint.load(_saved(fractions.Fraction(1, 2))) == fractions.Fraction(1, 2)
    (message,) = [str(w.message) for w in warned]
    assert "COMPATSHIM_ALLOW: 'not-a-name' is not a 'module.name' global" in message
    assert [w.filename for w in warned] == [__file__]  # the line that loaded, not compatshim's
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once only
        assert checkpoint.load(_saved(decimal.Decimal("2"))) == decimal.Decimal("2")


def test_a_comment_in_the_variable_admits_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """inspect shows the file's form, ``mod.Name  # reason``; copied into the variable, a
    dotted word of the reason was an entry (``# same as decimal.Decimal`` admitted it)."""
    monkeypatch.setenv("COMPATSHIM_ALLOW", "fractions.Fraction  # same as decimal.Decimal")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing malformed: the comment is not read
        assert checkpoint.load(_saved(fractions.Fraction(1, 2))) == fractions.Fraction(1, 2)
        assert _refused(decimal.Decimal(1)) == ("decimal.Decimal",)


@pytest.mark.parametrize(
    "raw",
    [
        "fractions.Fraction;decimal.Decimal",  # another separator: one entry, malformed
        "fractions.Fraction!",
        "fractions.Fraction()",
        "fractions.Fraction\x7f",
        "omegaconf-resolver:fractions.Fraction",  # a resolver entry names no global
        "fractions.Fraction.",
        "fractions .Fraction",
        "fractions..Fraction",
        "fractions\u00a0.Fraction",
    ],
)
def test_a_malformed_entry_admits_nothing(raw: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail closed for that entry: a near-miss of a real name never admits the name."""
    monkeypatch.setenv("COMPATSHIM_ALLOW", raw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert _refused(fractions.Fraction(1, 2)) == ("fractions.Fraction",)
        assert _refused(decimal.Decimal(1)) == ("decimal.Decimal",)


def test_entry_text_is_cut_in_errors_warnings_and_the_doctor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Entries come from the environment and files: what an error, a warning or the doctor
    prints of them is cut (``_text``), however long they are."""
    from compatshim.checkpoint.doctor import safe_load_row

    long = "m" * 100_000
    for entry in (long, f"omegaconf-resolver:{long}:"):
        with pytest.raises(TypeError) as raised:
            checkpoint.load(_saved(1), allow=[entry])
        assert len(str(raised.value)) < 400
    many = ",".join(f"bad{i}" for i in range(10_000))
    monkeypatch.setenv("COMPATSHIM_ALLOW", f"fractions.Fraction,{long}!,{many}")
    with pytest.warns(RuntimeWarning) as warned:
        assert checkpoint.load(_saved(fractions.Fraction(1, 2))) == fractions.Fraction(1, 2)
    assert len(warned) == 1 and "10001 malformed allow entries" in str(warned[0].message)
    assert all(len(str(w.message)) < 1000 for w in warned)
    monkeypatch.delenv("COMPATSHIM_ALLOW")
    for index in range(15):
        checkpoint.allow(f"pkg{index}.{'N' * 10_000}", reason="ours")
    detail = safe_load_row().detail
    assert "15 process-wide allow entries" in detail and "and 5 more" in detail
    assert len(detail) < 4000


def test_a_file_of_entries_with_reasons(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    listing = tmp_path / "allow.txt"
    listing.write_text("# ours\nfractions.Fraction  # exact ratios in our files\n")
    monkeypatch.setenv("COMPATSHIM_ALLOW_FILE", str(listing))
    assert checkpoint.load(_saved(fractions.Fraction(1, 2))) == fractions.Fraction(1, 2)
    (entry,) = checkpoint.allowed()
    assert entry.reason == "exact ratios in our files" and entry.source == f"{listing}:2"
    # changed: read again; the malformed entries are named and skipped, the rest stay
    listing.write_bytes(
        b"fractions.Fraction bad-name\nuuid.UUID\xff\n# caf\xe9\ndecimal.Decimal # caf\xe9\n"
        b"fractions.Fraction\n"
    )
    with pytest.warns(RuntimeWarning, match="2 malformed allow entries skipped") as warned:
        assert checkpoint.load(_saved(fractions.Fraction(1, 2))) == fractions.Fraction(1, 2)
    (message,) = [str(w.message) for w in warned]
    assert f"{listing}:1: 'fractions.Fraction bad-name' is more than one" in message, message
    assert f"{listing}:2: 'uuid" in message
    assert checkpoint.load(_saved(decimal.Decimal(1))) == decimal.Decimal(1)
    assert {e.qualname: e.reason for e in checkpoint.allowed()} == {
        "decimal.Decimal": "caf\ufffd",  # a reason after '#'
        "fractions.Fraction": f"listed in {listing}:5",  # none: where it was listed
    }
    assert _refused(uuid.UUID(int=1)) == ("uuid.UUID",)  # its line was not UTF-8: skipped
    monkeypatch.setenv("COMPATSHIM_ALLOW_FILE", str(tmp_path / "missing.txt"))
    with pytest.warns(RuntimeWarning, match="missing.txt"):
        _refused(fractions.Fraction(1, 2))


def test_a_file_line_is_one_entry_and_its_reason_is_optional(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/checkpoint.md promises one ``module.name  # reason`` a line; the file was split
    on spaces, so a line of words (a reason written without ``#``) gave an entry per word:
    ``bad line here`` was 3 malformed entries, and a dotted word of such a reason (``uuid.UUID``
    below) was allowed. A line is one entry; a line of several words is one malformed entry."""
    listing = tmp_path / "allow.txt"
    listing.write_text(
        "fractions.Fraction  # exact ratios\n"
        "decimal.Decimal\n"
        "bad line here\n"
        "collections.Counter trusted like uuid.UUID\n"
    )
    monkeypatch.setenv("COMPATSHIM_ALLOW_FILE", str(listing))
    with pytest.warns(RuntimeWarning, match="2 malformed allow entries skipped") as warned:
        assert checkpoint.load(_saved(fractions.Fraction(1, 2))) == fractions.Fraction(1, 2)
    (message,) = [str(w.message) for w in warned]
    assert f"{listing}:3: 'bad line here' is more than one 'module.name'" in message, message
    assert f"{listing}:4: 'collections.Counter trusted like uuid.UUID'" in message, message
    assert {e.qualname: (e.reason, e.source) for e in checkpoint.allowed()} == {
        "fractions.Fraction": ("exact ratios", f"{listing}:1"),
        "decimal.Decimal": (f"listed in {listing}:2", f"{listing}:2"),
    }
    assert _refused(uuid.UUID(int=1)) == ("uuid.UUID",)


@pytest.fixture
def distribution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """An installed distribution declaring ``compatshim.allow`` entry points (one broken)."""
    module = "compatshim_test_allow_entries"
    (tmp_path / f"{module}.py").write_text(
        'ENTRIES = ["fractions.Fraction", ("decimal.Decimal", "money in its checkpoints"),\n'
        '           ("omegaconf-resolver:oc.env", "its launcher sets the variables")]\n'
        "def more():\n"
        '    return ["uuid.UUID"]\n'
    )
    info = tmp_path / "compatshim_test_allow-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: compatshim-test-allow\nVersion: 1.0\n"
    )
    (info / "entry_points.txt").write_text(
        f"[compatshim.allow]\nlisted = {module}:ENTRIES\nmade = {module}:more\n"
        f"broken = {module}:MISSING\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    yield module
    sys.modules.pop(module, None)


def test_entry_points_load_at_the_first_load_that_needs_them(distribution: str) -> None:
    checkpoint.load(_saved({"w": torch.ones(1), "n": [1, 2]}))  # allowlist only
    assert distribution not in sys.modules
    with pytest.warns(RuntimeWarning, match="broken"):
        loaded = checkpoint.load(_saved([fractions.Fraction(1, 3), decimal.Decimal("1.5")]))
    assert loaded == [fractions.Fraction(1, 3), decimal.Decimal("1.5")]
    assert distribution in sys.modules
    reasons = {e.qualname: (e.reason, e.source) for e in checkpoint.allowed()}
    assert set(reasons) == {
        "fractions.Fraction",
        "decimal.Decimal",
        "uuid.UUID",
        "omegaconf-resolver:oc.env",
    }
    assert reasons["decimal.Decimal"] == (
        "money in its checkpoints",
        f"entry point listed = {distribution}:ENTRIES",
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the broken entry point is reported once
        _refused(torch.nn.Linear)  # a global nothing allows: every source consulted again


def test_entry_points_can_keep_a_resolver(
    distribution: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    omegaconf = pytest.importorskip("omegaconf")
    monkeypatch.setenv("COMPATSHIM_TEST_HOME", "/home/test")
    cfg = omegaconf.OmegaConf.create(
        {"home": "${oc.env:COMPATSHIM_TEST_HOME}", "n": "${oc.select:x,1}"}
    )
    plain = omegaconf.OmegaConf.create({"n": "${oc.select:x,1}"})
    assert checkpoint.load(_saved(plain)).n == 1  # safe resolvers: no source is read
    assert distribution not in sys.modules
    with pytest.warns(RuntimeWarning, match="broken"):
        assert checkpoint.load(_saved(cfg)).home == "/home/test"
    with pytest.raises(checkpoint.UnsafeCheckpointError, match="'eval'"):
        checkpoint.load(_saved(omegaconf.OmegaConf.create({"x": "${eval:1}"})))


def test_an_entry_never_replaces_the_allowlists_handling() -> None:
    checkpoint.allow("torch._utils._rebuild_tensor_v2", reason="already listed")
    before = process_allow._entry_points
    assert torch.equal(checkpoint.load(_saved(torch.ones(2))), torch.ones(2))
    assert process_allow._entry_points is before  # no source beyond code was needed


@pytest.fixture
def mixed_distribution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """An installed distribution whose two ``compatshim.allow`` entry points each hold one
    malformed item beside good ones (issue 38: a bad item costs only itself)."""
    module = "compatshim_test_allow_mixed"
    (tmp_path / f"{module}.py").write_text(
        'ENTRIES = ["fractions.Fraction", "not a name!", 42,\n'
        '           ("decimal.Decimal", "money in its checkpoints")]\n'
        "def more():\n"
        '    return ["uuid.UUID", ("omegaconf-resolver:${x}", "computed")]\n'
    )
    info = tmp_path / "compatshim_test_allow_mixed-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: compatshim-test-allow-mixed\nVersion: 1.0\n"
    )
    (info / "entry_points.txt").write_text(
        f"[compatshim.allow]\nlisted = {module}:ENTRIES\nmade = {module}:more\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    yield module
    sys.modules.pop(module, None)


def test_a_malformed_item_costs_only_itself_not_its_entry_point(mixed_distribution: str) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = checkpoint.load(
            _saved([fractions.Fraction(1, 3), decimal.Decimal("1.5"), uuid.UUID(int=7)])
        )
    assert loaded == [fractions.Fraction(1, 3), decimal.Decimal("1.5"), uuid.UUID(int=7)]
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    listed = [m for m in messages if f"entry point listed = {mixed_distribution}:ENTRIES" in m]
    made = [m for m in messages if f"entry point made = {mixed_distribution}:more" in m]
    assert len(listed) == 1 and len(made) == 1, messages  # one warning per entry point
    assert "2 malformed allow entries skipped" in listed[0]
    assert "'not a name!'" in listed[0] and "42" in listed[0], listed[0]
    assert "stay in force" in listed[0] and "ignored" not in listed[0]
    assert "1 malformed allow entry skipped" in made[0] and "${x}" in made[0], made[0]
    assert {e.qualname for e in checkpoint.allowed()} == {
        "fractions.Fraction",
        "decimal.Decimal",
        "uuid.UUID",
    }
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once: the next load that reads them is quiet
        _refused(torch.nn.Linear)


def test_allow_and_disallow_name_themselves_in_argument_errors() -> None:
    """``allow(reason=5)`` said "needs a reason" (a ValueError); ``disallow(1)`` blamed
    ``allow=``, the load argument."""
    with pytest.raises(TypeError, match=r"allow\(\): reason must be a str .*got 5"):
        checkpoint.allow("fractions.Fraction", reason=5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^disallow\(\) takes classes"):
        checkpoint.disallow(1)
    with pytest.raises(TypeError, match=r"^allow\(\) takes classes"):
        checkpoint.allow(1, reason="the test")


def test_an_entry_naming_nothing_says_where_it_was_allowed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A ``COMPATSHIM_ALLOW`` entry whose module imports but lacks the name was refused
    "(named in allow=)": the user, who passed no ``allow=``, was sent to the wrong place."""
    pickled = io.BytesIO(b"\x80\x02cdecimal\nNoSuchName\nq\x00)\x81q\x01.")
    monkeypatch.setenv("COMPATSHIM_ALLOW", "decimal.NoSuchName")
    with pytest.raises(checkpoint.CheckpointError, match="cannot be imported here") as raised:
        checkpoint.load(pickled)
    assert "(named in COMPATSHIM_ALLOW)" in str(raised.value), raised.value
    pickled.seek(0)
    monkeypatch.delenv("COMPATSHIM_ALLOW")
    with pytest.raises(checkpoint.CheckpointError, match=r"\(named in allow=\)"):
        checkpoint.load(pickled, allow=["decimal.NoSuchName"])
