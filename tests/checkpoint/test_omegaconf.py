"""omegaconf containers: real files written by omegaconf load as the real types; attacks refused.

Every file here is written by omegaconf's own pickling (``torch.save`` or
``pickle.dumps``); hostile ones are made by editing a real container's
``__dict__`` before saving, so the bytes are what omegaconf writes.
"""

from __future__ import annotations

import dataclasses
import enum
import io
import pathlib
import pickle
import sys
import time
import warnings
from collections.abc import Iterator
from typing import Any, Dict, List, Optional

import pytest

pytest.importorskip("torch")

import torch

omegaconf = pytest.importorskip("omegaconf")
from omegaconf import DictConfig, ListConfig, OmegaConf  # noqa: E402

from compatshim.checkpoint import CheckpointError, UnsafeCheckpointError, load  # noqa: E402
from compatshim.checkpoint._omegaconf import SAFE_RESOLVERS, check_text  # noqa: E402

pytestmark = pytest.mark.timeout(120)
HAS_BYTES = hasattr(omegaconf.nodes, "BytesNode")


class Colour(enum.Enum):
    RED = 1
    GREEN = 2


class Sign(str, enum.Enum):
    """An application's own enum whose ``str()`` is its value (as ``enum.StrEnum``'s)."""

    DOLLAR = "$"
    OPEN = "{eval:6*7}"

    def __str__(self) -> str:
        return str(self.value)


@dataclasses.dataclass
class Optim:
    name: str = "sgd"
    lr: float = 0.1
    momentum: Optional[float] = None  # noqa: UP045
    colour: Colour = Colour.RED
    betas: List[float] = dataclasses.field(default_factory=lambda: [0.9, 0.99])
    extra: Dict[str, int] = dataclasses.field(default_factory=lambda: {"k": 1})


def plain_hparams() -> DictConfig:
    content: dict[str, Any] = {
        "lr": 0.1,
        "layers": [4, 8, {"width": 2, "act": "relu"}],
        "model": {"name": "tiny", "dropout": None, "flag": True, "big": 10**20},
        "missing": "???",
        "ref": "${lr}",
        "nested_ref": "${model.name}",
        "relative": {"x": 3, "y": "${.x}", "up": "${..lr}"},
        "item": "${layers[1]}",
        "select": "${oc.select:model.name,default}",
        "select_missing": "${oc.select:nope,7}",
        "keys": "${oc.dict.keys:model}",
        "which": "name",
        "computed_key": "${model.${which}}",
        "text": "lr is ${lr} and name ${model.name}",
        "escaped": "\\${lr}",
        "path": "/data/${model.name}",
    }
    if HAS_BYTES:
        content["raw"] = b"\x00\x01"
        content["where"] = pathlib.Path("/tmp/x")
    return OmegaConf.create(content)


def save(obj: Any, tmp_path: pathlib.Path, name: str = "f.pt") -> pathlib.Path:
    path = tmp_path / name
    torch.save({"hparams": obj, "state_dict": {"w": torch.arange(3.0)}}, path)
    return path


def same(loaded: Any, original: Any) -> None:
    assert type(loaded) is type(original)
    assert OmegaConf.to_container(loaded) == OmegaConf.to_container(original)
    assert OmegaConf.to_container(loaded, resolve=True) == OmegaConf.to_container(
        original, resolve=True
    )
    assert OmegaConf.to_yaml(loaded) == OmegaConf.to_yaml(original)


def same_metadata(ours: Any, theirs: Any) -> None:
    """Every node's metadata equals what omegaconf's own unpickling gives (iterative walk)."""
    todo = [(ours, theirs)]
    while todo:
        mine, expected = todo.pop()
        assert type(mine) is type(expected)
        assert mine._metadata == expected._metadata, mine._get_full_key(None)
        if isinstance(mine, (DictConfig, ListConfig)) and not mine._is_none():
            keys = mine.keys() if isinstance(mine, DictConfig) else range(len(mine))
            todo.extend((mine._get_node(k), expected._get_node(k)) for k in keys)


@pytest.fixture
def marker(tmp_path: pathlib.Path) -> Iterator[pathlib.Path]:
    """A registered ``eval`` resolver (as many projects have) that leaves a file when it runs."""
    path = tmp_path / "resolver-ran"

    def run(expression: Any = "") -> Any:
        path.write_text("ran")
        return eval(str(expression))  # the gadget a hostile config would aim at

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 2.4 renamed it register_resolver
        OmegaConf.register_new_resolver("eval", run, replace=True)
    yield path
    if hasattr(OmegaConf, "clear_resolver"):
        OmegaConf.clear_resolver("eval")
    else:  # 2.1 has no clear_resolver
        omegaconf.basecontainer.BaseContainer._resolvers.pop("eval", None)


# --------------------------------------------------------------------------- real files


@pytest.mark.parametrize("protocol", [0, 1, 2, 4, 5])
def test_plain_pickles_of_every_protocol(protocol: int) -> None:
    cfg = plain_hparams()
    data = pickle.dumps({"hparams": cfg}, protocol=protocol)
    loaded = load(io.BytesIO(data))
    same(loaded["hparams"], cfg)
    same_metadata(loaded["hparams"], pickle.loads(data)["hparams"])


def test_torch_save_dict_and_list_configs(tmp_path: pathlib.Path) -> None:
    cfg = plain_hparams()
    listed = OmegaConf.create([1, {"a": "${0}"}, [True, None]])
    loaded = load(save({"cfg": cfg, "list": listed, "sub": cfg.model}, tmp_path))["hparams"]
    same(loaded["cfg"], cfg)
    same(loaded["list"], listed)
    assert type(loaded["list"]) is ListConfig
    # a sub-config keeps its parent (saved with it), as omegaconf itself does
    assert loaded["sub"]._get_parent() is not None
    assert OmegaConf.to_container(loaded["sub"]) == OmegaConf.to_container(cfg.model)


def test_flags_and_modes_survive(tmp_path: pathlib.Path) -> None:
    cfg = plain_hparams()
    OmegaConf.set_struct(cfg, True)
    OmegaConf.set_readonly(cfg.model, True)
    loaded = load(save(cfg, tmp_path))["hparams"]
    assert OmegaConf.is_struct(loaded) and OmegaConf.is_readonly(loaded.model)
    with pytest.raises(Exception, match=r"not in struct|Key 'nope'"):
        loaded.nope = 1


def test_loaded_config_is_usable(tmp_path: pathlib.Path) -> None:
    cfg = plain_hparams()
    loaded = load(save(cfg, tmp_path))["hparams"]
    assert loaded.ref == 0.1 and loaded.relative.up == 0.1 and loaded.computed_key == "tiny"
    assert loaded.select == "tiny" and loaded.select_missing == 7 and loaded.item == 8
    assert list(loaded["keys"]) == ["name", "dropout", "flag", "big"]
    assert loaded.escaped == "${lr}"
    loaded.model.name = "other"
    assert loaded.nested_ref == "other"
    merged = OmegaConf.merge(loaded, {"lr": 0.5})
    assert merged.ref == 0.5
    assert OmegaConf.is_missing(loaded, "missing")


def test_structured_config_needs_its_classes_allowed(tmp_path: pathlib.Path) -> None:
    cfg = OmegaConf.create({"optim": OmegaConf.structured(Optim), "seed": 1})
    path = save(cfg, tmp_path)
    with pytest.raises(UnsafeCheckpointError) as refused:
        load(path)
    assert f"{Optim.__module__}.Optim" in str(refused.value)
    loaded = load(path, allow=[Optim, Colour])["hparams"]
    same(loaded, cfg)
    same_metadata(loaded, pickle.loads(pickle.dumps(cfg)))
    assert OmegaConf.get_type(loaded.optim) is Optim
    assert OmegaConf.to_object(loaded.optim) == Optim()
    assert loaded.optim.colour is Colour.RED
    with pytest.raises(Exception, match="could not be converted"):
        loaded.optim.lr = "x"  # the typed node still validates


def test_enum_values_need_the_enum_allowed(tmp_path: pathlib.Path) -> None:
    cfg = OmegaConf.create({"colour": Colour.GREEN})
    path = save(cfg, tmp_path)
    with pytest.raises(UnsafeCheckpointError, match="Colour"):
        load(path)
    assert load(path, allow=[Colour])["hparams"].colour is Colour.GREEN


def test_inspect_names_only_allow_listed_globals(tmp_path: pathlib.Path) -> None:
    from compatshim.checkpoint import inspect

    info = inspect(save(plain_hparams(), tmp_path))
    assert not [g.name for g in info.globals if g.entry is None]
    assert any(g.name == "omegaconf.dictconfig.DictConfig" for g in info.globals)


# --------------------------------------------------------------------------- interpolation policy

HOSTILE = {
    "env": "${oc.env:HOME}",
    "legacy_env": "${env:HOME}",
    "eval": "${eval:'1+1'}",
    "spaced": "${ eval :1}",
    "in_text": "x ${lr} y ${eval:1}",
    "nested_arg": "${oc.select:${eval:1},2}",
    "quoted_arg": "${oc.select:a,'}${eval:1}'}",
    "computed_name": "${${which}:1}",
    "computed_dotted": "${oc.${which}:HOME}",
    "escaped_after_live": "${lr}\\${eval:1}",
    "escaped": "\\${eval:1}",
    "escaped_env": "\\${oc.env:HOME}",
    "decode": "${oc.decode:'1'}",
    "create": "${oc.create:{}}",
    "values": "${oc.dict.values:model}",
    "deprecated": "${oc.deprecated:lr}",
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_resolvers_are_refused_naming_key_and_resolver(
    case: str, tmp_path: pathlib.Path, marker: pathlib.Path
) -> None:
    cfg = OmegaConf.create({"lr": 0.1, "which": "env", "model": {"a": 1}, "deep": [{}]})
    cfg.deep[0][case] = HOSTILE[case]
    path = save(cfg, tmp_path)
    with pytest.raises(UnsafeCheckpointError) as refused:
        load(path)
    message = str(refused.value)
    assert f"deep[0].{case}" in message
    if case.startswith("computed"):  # no entry can allow a name known only when read
        assert "computed" in message and "omegaconf-resolver:" not in message
    else:
        assert "omegaconf-resolver:" in message
    assert not marker.exists()


def test_a_hostile_key_is_refused(tmp_path: pathlib.Path, marker: pathlib.Path) -> None:
    """``oc.dict.keys`` turns keys into values: keys pass the same policy."""
    cfg = OmegaConf.create({"d": {"${eval:1}": 1}, "k": "${oc.dict.keys:d}"})
    with pytest.raises(UnsafeCheckpointError, match="'eval'"):
        load(save(cfg, tmp_path))
    assert not marker.exists()


def test_a_hostile_container_interpolation_is_refused(tmp_path: pathlib.Path) -> None:
    cfg = OmegaConf.create({"a": {"b": 1}})
    cfg.a = "${oc.env:HOME}"  # the whole container is an interpolation
    with pytest.raises(UnsafeCheckpointError, match=r"resolver 'oc\.env'"):
        load(save(cfg, tmp_path))


def test_allowed_resolver_loads_and_runs_only_when_read(
    tmp_path: pathlib.Path, marker: pathlib.Path
) -> None:
    cfg = OmegaConf.create({"two": "${eval:'1+1'}"})
    loaded = load(save(cfg, tmp_path), allow=["omegaconf-resolver:eval"])["hparams"]
    assert not marker.exists()  # loading never resolves anything
    assert loaded.two == 2
    assert marker.exists()


# --------------------------------------------------------------------------- process-wide resolvers


def _two_resolvers(tmp_path: pathlib.Path) -> pathlib.Path:
    """A file calling a user resolver (eval) and one that reads the environment (oc.env)."""
    cfg = OmegaConf.create({"two": "${eval:'1+1'}", "home": "${oc.env:COMPATSHIM_TEST_HOME}"})
    return save(cfg, tmp_path)


def test_a_resolver_allowed_in_code_is_kept_and_others_stay_refused(
    tmp_path: pathlib.Path, marker: pathlib.Path, process_allow_cleared: None
) -> None:
    """The file names eval and oc.env; only the allowed one is admitted, for every load."""
    import compatshim.checkpoint as ckpt

    path = _two_resolvers(tmp_path)
    with pytest.raises(UnsafeCheckpointError) as refused:
        load(path)
    assert refused.value.refused == ("omegaconf-resolver:eval",)
    assert "compatshim.checkpoint.allow('omegaconf-resolver:eval'" in str(refused.value)
    assert "COMPATSHIM_ALLOW=omegaconf-resolver:eval" in str(refused.value)
    ckpt.allow("omegaconf-resolver:eval", reason="our configs compute with it")
    with pytest.raises(UnsafeCheckpointError) as refused:
        load(path)  # the resolver named in the file but not allowed stays refused
    assert refused.value.refused == ("omegaconf-resolver:oc.env",)
    assert not marker.exists()
    loaded = load(path, allow=["omegaconf-resolver:oc.env"])["hparams"]  # with the call's
    assert not marker.exists()  # loading resolves nothing
    assert loaded.two == 2 and marker.exists()
    (entry,) = ckpt.allowed()
    assert (entry.qualname, entry.reason) == (
        "omegaconf-resolver:eval",
        "our configs compute with it",
    )
    ckpt.disallow("omegaconf-resolver:eval")
    with pytest.raises(UnsafeCheckpointError, match="'eval'"):
        load(path, allow=["omegaconf-resolver:oc.env"])


def test_resolvers_from_the_environment_and_a_file(
    tmp_path: pathlib.Path,
    marker: pathlib.Path,
    process_allow_cleared: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COMPATSHIM_TEST_HOME", "/home/test")
    path = _two_resolvers(tmp_path)
    monkeypatch.setenv("COMPATSHIM_ALLOW", "omegaconf-resolver:eval")
    with pytest.raises(UnsafeCheckpointError, match=r"'oc\.env'"):
        load(path)
    listing = tmp_path / "allow.txt"
    listing.write_text("omegaconf-resolver:oc.env  # our launcher sets it\n")
    monkeypatch.setenv("COMPATSHIM_ALLOW_FILE", str(listing))
    loaded = load(path)["hparams"]
    assert loaded.home == "/home/test" and loaded.two == 2
    import compatshim.checkpoint as ckpt

    sources = {e.qualname: (e.reason, e.source) for e in ckpt.allowed()}
    assert sources == {
        "omegaconf-resolver:eval": ("listed in COMPATSHIM_ALLOW", "COMPATSHIM_ALLOW"),
        "omegaconf-resolver:oc.env": ("our launcher sets it", f"{listing}:1"),
    }


@pytest.mark.parametrize(
    "entry", ["omegaconf-resolver:", "omegaconf-resolver:${x}", "omegaconf-resolver:a b"]
)
def test_a_computed_or_malformed_resolver_name_is_never_an_entry(
    entry: str, tmp_path: pathlib.Path, process_allow_cleared: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    import compatshim.checkpoint as ckpt

    with pytest.raises(TypeError, match="resolver"):
        ckpt.allow(entry, reason="tries to open computed names")
    with pytest.raises(TypeError, match="resolver"):
        load(save(OmegaConf.create({"a": 1}), tmp_path), allow=[entry])
    monkeypatch.setenv("COMPATSHIM_ALLOW", f"omegaconf-resolver:eval,{entry}")
    computed = save(OmegaConf.create({"which": "eval", "x": "${${which}:1}"}), tmp_path, "c.pt")
    with pytest.raises(UnsafeCheckpointError, match="computed"):
        load(computed)  # refused before any process-wide source is read
    hostile = save(OmegaConf.create({"x": "${eval:1}"}), tmp_path)
    # the malformed entry is named and skipped, admitting nothing; the well-formed one beside
    # it stays in force (issue 38: fail closed for that entry only, not the whole variable)
    with pytest.warns(RuntimeWarning, match="malformed allow entr.*skipped.*COMPATSHIM_ALLOW"):
        allowed = [e.qualname for e in ckpt.allowed()]
    # ("a b" is two entries to the variable, which splits on spaces: "omegaconf-resolver:a"
    # is well formed, "b" is the malformed one)
    assert "omegaconf-resolver:eval" in allowed and entry not in allowed
    load(hostile)  # ${eval:1} is admitted by omegaconf-resolver:eval alone


def test_a_computed_resolver_name_stays_refused_whatever_is_allowed(
    tmp_path: pathlib.Path, marker: pathlib.Path, process_allow_cleared: None
) -> None:
    import compatshim.checkpoint as ckpt

    ckpt.allow("omegaconf-resolver:eval", reason="trusted")
    path = save(OmegaConf.create({"which": "eval", "x": "${${which}:1}"}), tmp_path)
    with pytest.raises(UnsafeCheckpointError, match="computed") as refused:
        load(path, allow=["omegaconf-resolver:eval"])
    assert "allow(" not in str(refused.value).partition(". allow=[...]")[0]  # no advice to allow
    assert check_text("${${which}:1}", frozenset({"", "eval"})) == ""


def test_a_resolver_entry_names_no_global(
    tmp_path: pathlib.Path, process_allow_cleared: None
) -> None:
    """A pickle may spell any module: ``omegaconf-resolver:`` + ``eval`` stays no global."""
    import compatshim.checkpoint as ckpt

    ckpt.allow("omegaconf-resolver:eval", reason="trusted")
    path = tmp_path / "g.pkl"
    path.write_bytes(b"\x80\x02comegaconf-resolver:\neval\nq\x00.")
    with pytest.raises(UnsafeCheckpointError) as refused:
        load(path)
    assert refused.value.refused == ("omegaconf-resolver:.eval",)


def test_the_patched_torch_load_honours_process_wide_resolvers(
    tmp_path: pathlib.Path, marker: pathlib.Path, process_allow_cleared: None
) -> None:
    """Frameworks call torch.load, which has no allow=: armed, it keeps the allowed resolver."""
    import compatshim
    import compatshim.checkpoint as ckpt

    path = save(OmegaConf.create({"two": "${eval:'1+1'}"}), tmp_path)
    compatshim.install(include=["torch-load-safe-globals"])
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # CheckpointRefusedWarning
            with pytest.raises(pickle.UnpicklingError) as refused:
                torch.load(path)
        text = str(refused.value) + " ".join(getattr(refused.value, "__notes__", []))
        if torch_weights_only_by_default():
            assert "compatshim.checkpoint.allow('omegaconf-resolver:eval'" in text
        ckpt.allow("omegaconf-resolver:eval", reason="trusted")
        loaded = torch.load(path)["hparams"]
    finally:
        compatshim.uninstall(["torch-load-safe-globals"])
    assert type(loaded) is DictConfig and not marker.exists()
    assert loaded.two == 2


def torch_weights_only_by_default() -> bool:
    major, minor = (int(p) for p in torch.__version__.split(".")[:2])
    return (major, minor) >= (2, 6)


def test_reading_an_accepted_file_runs_nothing(
    tmp_path: pathlib.Path, marker: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COMPATSHIM_SECRET", "s3cret")
    loaded = load(save(plain_hparams(), tmp_path))["hparams"]
    resolved = OmegaConf.to_container(loaded, resolve=True)
    for key in loaded:
        if not OmegaConf.is_missing(loaded, key):
            loaded[key]
    assert "s3cret" not in repr(resolved) and not marker.exists()


def test_check_text_rules() -> None:
    safe = SAFE_RESOLVERS
    assert check_text("plain", safe) is None
    assert check_text("${a.b} ${..c} ${d[0]} ${e.${f}.g}", safe) is None
    # escaped: omegaconf hands back "${oc.env:HOME}", live once saved and read again
    assert check_text("\\${oc.env:HOME}", safe) == "oc.env"
    assert check_text("\\\\${oc.env:HOME}", safe) == "oc.env"  # an escaped backslash
    assert check_text("\\\\\\${oc.env:HOME}", safe) == "oc.env"
    assert check_text("\\${a.b}", safe) is None
    # "${d}{oc.env:X}" with d = "$" resolves to "${oc.env:X}": live where the load holds a "$"
    assert check_text("${d}{oc.env:X}", safe) is None
    assert check_text("${d}{oc.env:X}", safe, dollar=True) == "oc.env"
    assert check_text("{eval:1}", safe, dollar=True) == "eval"
    assert check_text("{epoch:02d}-{step}", safe) is None  # a format string, no "$" around
    assert check_text("${oc.select:a,${oc.env:X}}", safe) == "oc.env"
    assert check_text("${oc.env:X}", safe | {"oc.env"}) is None
    assert check_text("${${a}:x}", safe) == ""
    assert check_text("${${oc.select:a,'}'}:x}", safe) == ""
    assert check_text("${a.${b}}", safe) is None


def _shown_dollar() -> dict[str, Any]:
    """Values that are not str but show a ``$`` once made text (issue 37 item 8)."""
    return {
        "a path $": {"d": pathlib.Path("$"), "x": "${d}{oc.env:COMPATSHIM_SECRET}"},
        "a path {": {"d": "$", "p": pathlib.Path("{eval:6*7}"), "x": "${d}${p}"},
        "bytes": {"d": b"${eval:6*7}", "x": "pre${d}"},
        "a bytes key": {"c": {b"${eval:6*7}": 1}, "x": "p${c}"},
        "an enum's str": {"d": Sign.DOLLAR, "e": Sign.OPEN, "x": "${d}${e}"},
    }


@pytest.mark.skipif(not HAS_BYTES, reason="omegaconf < 2.2 holds no bytes or paths")
@pytest.mark.parametrize("case", sorted(_shown_dollar()))
def test_a_dollar_shown_by_a_path_bytes_or_enum_is_text(
    case: str, tmp_path: pathlib.Path, marker: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 37 item 8: path, bytes and enum values were never scanned, so ``d = Path("$")``
    made ``"${d}{eval:...}"`` resolve to a call, live once the resolved config is saved as
    YAML (Lightning's hparams.yaml) and read back. omegaconf's own pickle shows it runs."""
    monkeypatch.setenv("COMPATSHIM_SECRET", "s3cret")
    path = save(OmegaConf.create(_shown_dollar()[case]), tmp_path)
    plain = torch.load(path, weights_only=False)["hparams"]  # omegaconf's own __setstate__
    again = OmegaConf.create(OmegaConf.to_yaml(plain, resolve=True))
    resolved = str(OmegaConf.to_container(again, resolve=True)["x"])
    assert marker.exists() or resolved == "s3cret", resolved  # eval ran, or the secret read
    with pytest.raises(UnsafeCheckpointError, match="omegaconf-resolver:"):
        load(path, allow=[Sign])


GLUED = {  # "$" and "{" from separate pieces, joined by resolution into ${oc.env:...}
    "a quoted '{'": {"d": "$", "x": "${d}${oc.select:zz,'{'}oc.env:COMPATSHIM_SECRET}"},
    "both quoted": {"x": "${oc.select:a,'$'}${oc.select:b,'{'}oc.env:COMPATSHIM_SECRET}"},
    "three nodes": {"a": "$", "b": "{o", "c": "c.env:COMPATSHIM_SECRET}", "x": "${a}${b}${c}"},
    "an escaped {": {"d": "$", "x": "${d}${oc.select:zz,\\{oc.env:COMPATSHIM_SECRET\\}}"},
    "a spaced $": {"x": "${oc.select:zz, $ }${oc.select:b,'{'}oc.env:COMPATSHIM_SECRET}"},
    "spaced, escaped": {"x": "${oc.select:zz, $ }${oc.select:zz,\\{}oc.env:COMPATSHIM_SECRET}"},
}


@pytest.mark.parametrize("case", sorted(GLUED))
def test_interpolation_syntax_glued_from_pieces_is_refused(
    case: str, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second-order check looked for a "{" at a text's start or after "}": a "{" from a
    quoted resolver argument, or a name split over several values, resolved to
    ${oc.env:...} unseen, and the saved-and-reloaded config (hparams.yaml) read the secret.
    omegaconf's own pickle shows it does."""
    monkeypatch.setenv("COMPATSHIM_SECRET", "s3cret")
    path = save(OmegaConf.create(GLUED[case]), tmp_path)
    plain = torch.load(path, weights_only=False)["hparams"]
    again = OmegaConf.create(OmegaConf.to_yaml(plain, resolve=True))
    assert OmegaConf.to_container(again, resolve=True)["x"] == "s3cret"
    with pytest.raises(UnsafeCheckpointError, match="join them into new interpolation syntax"):
        load(path)


def test_dollars_and_braces_that_cannot_be_joined_load(tmp_path: pathlib.Path) -> None:
    """Lightning's checkpoint file names ("{epoch}-{val_loss:.2f}"), shell variables and an
    interpolation in one config: no piece ends in "$", so nothing can be joined."""
    original = OmegaConf.create(
        {
            "name": "run",
            "filename": "{epoch}-{val_loss:.2f}",
            "home": "$HOME/data",
            "cost": "$5",
            "out": "${home}/${name}",
        }
    )
    loaded = load(save(original, tmp_path))["hparams"]
    assert OmegaConf.to_container(loaded, resolve=True)["out"] == "$HOME/data/run"
    regex = OmegaConf.create({"pattern": "^.*ckpt$", "name": "run", "out": "${name}.ckpt"})
    assert load(save(regex, tmp_path, "regex.pt"))["hparams"].out == "run.ckpt"
    both = OmegaConf.create(  # a piece ends in "$", one starts with "{": none is joined
        {
            "pattern": "^.*ckpt$",
            "label": "$\\alpha$",
            "filename": "{epoch}-{val_loss:.2f}",
            "tag": "{model}_{seed}",
            "name": "run",
            "out": "${name}.ckpt",
            "dir": "${name}/${tag}",
        }
    )
    loaded = load(save(both, tmp_path, "both.pt"))["hparams"]
    assert loaded.out == "run.ckpt" and loaded.dir == "run/{model}_{seed}"


@pytest.mark.skipif(not HAS_BYTES, reason="omegaconf < 2.2 holds no bytes or paths")
def test_paths_bytes_and_enums_without_a_live_call_load(tmp_path: pathlib.Path) -> None:
    original = OmegaConf.create(
        {
            "home": pathlib.Path("/data/$USER/${a}"),  # a $ but no call: text like a str's
            "raw": b"${a}\x00$",
            "sign": Sign.DOLLAR,
            "a": "x",
            "name": "${a}-${home}",
            "keys": {b"$k": 1, Sign.DOLLAR: 2},
        }
    )
    loaded = load(save(original, tmp_path), allow=[Sign])["hparams"]
    same(loaded, original)


def test_check_text_is_linear() -> None:
    for text in ("${" * 200_000, "${a" * 100_000 + "}" * 100_000, "\\" * 200_000 + "${x:1}"):
        started = time.perf_counter()
        check_text(text, SAFE_RESOLVERS)
        assert time.perf_counter() - started < 2.0


# --------------------------------------------------------------------------- forged state


def forged(tmp_path: pathlib.Path, edit: Any) -> pathlib.Path:
    cfg = OmegaConf.create({"a": 1, "b": {"c": [1, 2]}})
    edit(cfg)
    return save(cfg, tmp_path)


def _set(obj: Any, **fields: Any) -> None:
    obj.__dict__.update(fields)


FORGERIES = {
    "object_type_gadget": lambda c: setattr(c._metadata, "object_type", pathlib.Path.write_text),
    "object_type_allow_listed_constructor": lambda c: setattr(
        c._metadata, "object_type", __import__("collections").OrderedDict
    ),
    "ref_type_set": lambda c: setattr(c._get_node("a")._metadata, "ref_type", set),
    "value_set": lambda c: _set(c._get_node("a"), _val={1, 2}),
    "value_tensor": lambda c: _set(c._get_node("a"), _val=torch.zeros(1)),
    "flags_not_bool": lambda c: setattr(c._metadata, "flags", {"readonly": "yes"}),
    "optional_not_bool": lambda c: setattr(c._metadata, "optional", 1),
    "unknown_field": lambda c: _set(c._get_node("a"), __class__=dict),
    "content_not_nodes": lambda c: _set(c, _content={"a": 1}),
    "list_content_in_dict": lambda c: _set(c, _content=[c._get_node("a")]),
    "parent_foreign": lambda c: _set(c._get_node("a"), _parent={"not": "a container"}),
    "parent_not_holding": lambda c: _set(c._get_node("a"), _parent=c.b),
    "parent_none_but_held": lambda c: _set(c._get_node("a"), _parent=None),
    "node_shared": lambda c: c.b._content.__setitem__("x", c._get_node("a")),
    "metadata_shared": lambda c: _set(c._get_node("a"), _metadata=c.b._get_node("c")._metadata),
    "metadata_wrong_kind": lambda c: _set(c, _metadata=c._get_node("a")._metadata),
    "key_object": lambda c: setattr(c._metadata, "key", torch.zeros(1)),
}


@pytest.mark.parametrize("case", sorted(FORGERIES))
def test_forged_state_is_refused(case: str, tmp_path: pathlib.Path) -> None:
    path = forged(tmp_path, FORGERIES[case])
    with pytest.raises(CheckpointError):
        load(path)


def test_parent_cycle_is_refused(tmp_path: pathlib.Path) -> None:
    def cycle(cfg: Any) -> None:
        _set(cfg, _parent=cfg.b)
        cfg.b._content["loop"] = cfg

    with pytest.raises(CheckpointError):
        load(forged(tmp_path, cycle))


def test_a_container_holding_itself_is_refused(tmp_path: pathlib.Path) -> None:
    def loop(cfg: Any) -> None:
        cfg.b._content["self"] = cfg.b  # held by itself, its _parent still the root

    with pytest.raises(CheckpointError):
        load(forged(tmp_path, loop))


def test_legacy_torch_format(tmp_path: pathlib.Path) -> None:
    cfg = plain_hparams()
    path = tmp_path / "legacy.pt"
    torch.save({"hparams": cfg}, path, _use_new_zipfile_serialization=False)
    same(load(path)["hparams"], cfg)


def test_a_file_written_by_omegaconf_2_0_loads_as_omegaconf_itself_loads_it() -> None:
    """Lightning 1.x-era hparams: omegaconf 2.0 wrote no key/element types nor flags_root."""
    path = pathlib.Path(__file__).parent / "omegaconf_fixtures" / "omegaconf-2.0.6.pkl"
    ours = load(path)["hparams"]
    theirs = pickle.loads(path.read_bytes())["hparams"]  # our own fixture: trusted
    same(ours, theirs)
    for key in ("", "model", "model.layers", "model.layers.2"):
        mine = OmegaConf.select(ours, key) if key else ours
        expected = OmegaConf.select(theirs, key) if key else theirs
        assert mine._metadata == expected._metadata, key


def test_resolver_cache_from_the_file_is_dropped(tmp_path: pathlib.Path) -> None:
    cfg = OmegaConf.create({"a": 1})
    cfg._metadata.resolver_cache["now"] = {("x",): "forged"}
    loaded = load(save(cfg, tmp_path))["hparams"]
    assert dict(loaded._metadata.resolver_cache) == {}


def test_deep_nesting_is_bounded() -> None:
    """omegaconf recurses per level; deeper than _omegaconf.MAX_DEPTH is refused, iteratively."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(20_000)  # only to write the file: omegaconf and pickle recurse
    try:
        cfg = OmegaConf.create({})
        inner = cfg
        for _ in range(150):
            inner.x = {}
            inner = inner.x
        data = pickle.dumps(cfg)
    finally:
        sys.setrecursionlimit(limit)
    with pytest.raises(CheckpointError, match="nested deeper"):
        load(io.BytesIO(data))


# --------------------------------------------------------------------------- differential


def _resolvers_omegaconf_calls(text: str) -> list[str] | None:
    """The resolver names omegaconf's own parser finds ("" when computed); None: no parse."""
    from omegaconf.grammar.gen.OmegaConfGrammarParser import OmegaConfGrammarParser as P
    from omegaconf.grammar_parser import parse

    try:
        tree = parse(text)
    except Exception:
        return None
    found: list[str] = []
    todo: list[Any] = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, P.InterpolationResolverContext):
            name = node.resolverName()
            computed = any(isinstance(c, P.InterpolationContext) for c in name.children or [])
            found.append("" if computed else name.getText())
        todo.extend(getattr(node, "children", None) or [])
    return found


class _Strings:
    """Random interpolation strings: nested resolvers, computed names, quotes, escapes."""

    def __init__(self, seed: int) -> None:
        import random

        self.r = random.Random(seed)

    def ws(self) -> str:
        return self.r.choice(["", "", " ", "\t"])

    def interpolation(self, depth: int) -> str:
        r = self.r
        if r.random() < 0.35 or depth > 3:
            key = r.choice(["a", "b.c", "..x", "a[0]", "x-y", "$a"])
            if r.random() < 0.3 and depth <= 3:
                key = r.choice(["a.", ""]) + self.interpolation(depth + 1) + r.choice(["", ".b"])
            return "${" + self.ws() + key + self.ws() + "}"
        name = r.choice(["oc.env", "oc.select", "eval", "a", "b.c", "oc.dict.keys"])
        if r.random() < 0.2 and depth <= 3:
            name = r.choice(["", "oc."]) + self.interpolation(depth + 1)
        args = ",".join(self.argument(depth + 1) for _ in range(r.randint(0, 3)))
        return "${" + self.ws() + name + self.ws() + ":" + self.ws() + args + self.ws() + "}"

    def argument(self, depth: int) -> str:
        r = self.r
        roll = r.random()
        if roll < 0.3:
            return self.interpolation(depth)
        if roll < 0.5:
            inner = r.choice(["x", "}", "{", "\\'", "${a}", "\\${eval:1}", "${eval:2}"])
            quote = r.choice(["'", '"'])
            return quote + inner + quote
        if roll < 0.7 and depth < 4:
            return (
                "[" + self.argument(depth + 1) + "]"
                if roll < 0.6
                else "{k:" + self.argument(depth + 1) + "}"
            )
        return r.choice(["1", "x", "\\,", "\\}", "a b", "-", "$", "\\\\", "null"])

    def text(self) -> str:
        parts = []
        for _ in range(self.r.randint(1, 3)):
            parts.append(self.r.choice(["", "t ", "\\", "\\\\", "\\${eval:1}", "$"]))
            parts.append(self.interpolation(0))
        return "".join(parts)


@pytest.mark.parametrize("seed", [0, 1])
def test_check_text_never_misses_a_call_omegaconf_would_make(seed: int) -> None:
    """Against omegaconf's own grammar: every resolver it would call is kept or refused."""
    strings = _Strings(seed)
    parsed = 0
    for _ in range(2500):
        text = strings.text()
        calls = _resolvers_omegaconf_calls(text)
        if calls is None:
            continue
        parsed += 1
        refused = [name for name in calls if name not in SAFE_RESOLVERS]
        if refused:
            assert check_text(text, SAFE_RESOLVERS) is not None, (text, calls)
    assert parsed > 1000


# --------------------------------------------------------------------------- references that expand


def _doubling(step: str, depth: int = 30) -> dict[str, Any]:
    """a_0 = "x" * 8, a_i = two references to a_(i-1): 2**depth copies of a few bytes."""
    return {"a0": "x" * 8, **{f"a{i}": step.format(p=f"a{i - 1}") for i in range(1, depth + 1)}}


def _computed_doubling() -> dict[str, Any]:
    values = _doubling("${{${{k_{p}}}}}${{${{k_{p}}}}}")
    return {**values, **{f"k_a{i}": f"a{i}" for i in range(31)}}


def _container_doubling() -> dict[str, Any]:
    levels: dict[str, Any] = {"c0": {"v": "x" * 8}}
    for i in range(1, 31):
        levels[f"c{i}"] = {"left": f"${{c{i - 1}}}", "right": f"${{..c{i - 1}}}"}
    return levels


EXPANDING: dict[str, Any] = {
    "absolute": lambda: _doubling("${{{p}}}${{{p}}}"),
    "relative": lambda: _doubling("${{.{p}}}${{.{p}}}"),
    "oc.select": lambda: _doubling("${{oc.select:{p},d}}${{oc.select:.{p}}}"),
    "computed key": _computed_doubling,
    "containers": _container_doubling,
    "empty strings": lambda: {**_doubling("${{{p}}}${{{p}}}"), "a0": ""},  # work, not length
    # issue 37 item 9: oc.select's default is returned as is; through a list literal it
    # is printed with repr, which doubles a backslash per level (2**26 of them)
    "oc.select defaults": lambda: _doubling("${{oc.select:no,${{{p}}}}}${{oc.select:no,${{{p}}}}}"),
    "oc.select list default": lambda: {
        **_doubling("p${{oc.select:no,[${{{p}}}]}}", depth=26),
        "a0": "\\",
    },
}


@pytest.mark.parametrize("case", sorted(EXPANDING))
def test_references_that_expand_are_refused_naming_key_and_bound(
    case: str, tmp_path: pathlib.Path
) -> None:
    """Issue 26 case 11: a 5 KB file whose references resolve to 2**30 copies (before: loaded;
    reading it took minutes, ``to_container(resolve=True)`` raised MemoryError)."""
    path = save(OmegaConf.create(EXPANDING[case]()), tmp_path)
    start = time.perf_counter()
    with pytest.raises(UnsafeCheckpointError, match="resolves to at most") as refused:
        load(path)
    assert time.perf_counter() - start < 10
    assert refused.value.refused[0].startswith("omegaconf interpolation ")
    assert any(f"at {key}{n} " in str(refused.value) for key in "ac" for n in range(31))


def _decoys() -> dict[str, Any]:
    chain = {"a0": "x", **{f"a{i}": f"${{a{i - 1}}}" for i in range(1, 31)}}
    names = [f"${{a{i}}}" for i in range(31)]
    return {  # read first, each names a0..a30 as something small (or nothing)
        "the same names, small": lambda: OmegaConf.create(chain),
        "the same names, missing": lambda: OmegaConf.create({"z": "".join(names)}),
        "a list": lambda: OmegaConf.create(names),
    }


@pytest.mark.parametrize("decoy", sorted(_decoys()))
def test_a_decoy_config_cannot_make_references_that_double_look_small(
    decoy: str, tmp_path: pathlib.Path
) -> None:
    """Issue 37 item 2: the bound cached ``${a_i}`` by its text over all configs of a load, so
    a decoy config read first made a chain that doubles look small (before: a 12 KB file
    loaded in 0.02 s; resolving it, MemoryError at +2 GB). Each config's names are its own."""
    attack = OmegaConf.create(_doubling("${{{p}}}${{{p}}}"))
    path = save({"decoy": _decoys()[decoy](), "cfg": attack}, tmp_path)
    start = time.perf_counter()
    with pytest.raises(UnsafeCheckpointError, match=r"at a\d+ resolves to at most"):
        load(path)
    assert time.perf_counter() - start < 10
    alone = load(save({"decoy": _decoys()[decoy](), "x": 1}, tmp_path, "decoy.pt"))
    assert OmegaConf.to_container(alone["hparams"]["decoy"], resolve=False)


def test_many_configs_sharing_names_load_in_linear_time(tmp_path: pathlib.Path) -> None:
    """The per-config names cost no more than one config holding them all."""
    configs = {
        f"c{i}": OmegaConf.create({"a": "x", "b": "${a}/${a}", "c": "${oc.select:b,${a}}"})
        for i in range(2000)
    }
    path = save(configs, tmp_path)
    start = time.perf_counter()
    loaded = load(path)["hparams"]
    assert time.perf_counter() - start < 20
    assert loaded["c1999"].c == "x/x"


def _select_chain(levels: int, keys: int = 12) -> DictConfig:
    """Hydra-style stages: each stage's values default to the previous stage's through
    ``oc.select`` (an override wins where given), and a launcher's nested defaults."""
    names = [f"k{i}" for i in range(keys)]
    content: dict[str, Any] = {
        "base": {name: 0.001 * (i + 1) for i, name in enumerate(names)},
        "override": {"stage2": {"k0": 0.5}},
    }
    previous = "base"
    for level in range(1, levels + 1):
        stage = f"stage{level}"
        content[stage] = {
            name: f"${{oc.select:override.{stage}.{name},${{{previous}.{name}}}}}" for name in names
        }
        previous = stage
    nested = "0.1"
    for level in range(levels, 0, -1):
        nested = f"${{oc.select:override.stage{level}.lr,{nested}}}"
    content["lr"] = nested
    content["run"] = {
        "name": f"exp-${{stage{levels}.k0}}-${{lr}}",
        "dir": "/runs/${run.name}/${oc.select:override.tag,default}",
        "quoted": "${oc.select:override.tag,'[${run.name}]'}",
    }
    return OmegaConf.create(content)


@pytest.mark.parametrize("levels", [5, 12])
def test_nested_oc_select_defaults_load(levels: int, tmp_path: pathlib.Path) -> None:
    """Issue 37 item 9: each default that is a reference counted 10x (a repr bound), so five
    levels of a genuine 6 KiB config bounded to 178 M characters and were refused.
    ``oc.select`` returns its default as is: only a list or dict literal prints with repr."""
    original = _select_chain(levels)
    loaded = load(save(original, tmp_path))["hparams"]
    same(loaded, original)
    assert loaded.run.name == "exp-0.5-0.1" and loaded[f"stage{levels}"].k1 == 0.002


@pytest.mark.parametrize(
    "values",
    [
        {"a": "${b}", "b": "${a}"},
        {"a": "x${a}"},
        {"s": {"t": "${.u}", "u": "${s.t}"}},
        {"a": "${b.c}", "b": "${a}"},  # an intermediate key that is a reference back
        {"u": {"v": "${..u}"}},  # 2.4 refuses to read it; 2.2 recurses until RecursionError
    ],
)
def test_a_reference_cycle_is_refused(values: dict[str, Any], tmp_path: pathlib.Path) -> None:
    """omegaconf raises reading a cycle; the loader refuses it rather than guess its size."""
    cfg = OmegaConf.create({})
    for key, value in values.items():  # OmegaConf.create would not object either
        cfg[key] = value
    with pytest.raises(UnsafeCheckpointError, match=r"cycle|a container that holds it"):
        load(save(cfg, tmp_path))


@pytest.mark.parametrize(
    "text",
    ["${a.${b}}", "${a[${b}]}", "${oc.select:${b}}", "${a\\.b}", "${a b}", "${.}", "${a[x]y}"],
)
def test_references_that_cannot_be_resolved_statically_are_refused(
    text: str, tmp_path: pathlib.Path
) -> None:
    """A key computed from interpolated text, an escaped key, text outside the grammar."""
    cfg = OmegaConf.create({"a": {"x": "y"}, "b": "${c}", "c": "x"})
    cfg._set_value({**OmegaConf.to_container(cfg), "t": "placeholder"})
    cfg._get_node("t").__dict__["_val"] = text
    with pytest.raises(UnsafeCheckpointError, match="cannot be bounded"):
        load(save(cfg, tmp_path))


def test_a_config_with_many_references_loads(tmp_path: pathlib.Path) -> None:
    """Hydra-style configs: thousands of references, chains, relative keys, oc.select."""
    content: dict[str, Any] = {
        "name": "run",
        "data": {"root": "/data", "train": "${.root}/train", "val": "${data.root}/val"},
        "model": {"width": 64, "layers": [1, 2, 3], "depth": "${model.layers[2]}"},
        "trainer": {"epochs": 10, "run": "${name}-${trainer.epochs}", "n": "${oc.select:x,1}"},
        "paths": {f"p{i}": f"${{data.train}}/{i}/${{..name}}" for i in range(3000)},
        "chain": {f"c{i}": (f"${{.c{i - 1}}}/{i}" if i else "root") for i in range(30)},
    }
    original = OmegaConf.create(content)
    loaded = load(save(original, tmp_path))["hparams"]
    same(loaded, original)


def test_references_to_missing_keys_list_items_and_containers_load(
    tmp_path: pathlib.Path,
) -> None:
    content = {
        "u": {"v": 1},
        "w": "x${u}",
        "z": "${u}",
        "gone": "${nothere}",
        "deep": "${a.b.c}",
        "items": [5, 6],
        "last": "${items[1]}",
        "negative": "${items[-1]}",  # 2.4 reads it; 2.2 raises (not found)
        "dotted": "${items.0}",
        "which": "x",
        "bracket": {"x": 1, "y": "${.[${..which}]}"},
    }
    cfg = OmegaConf.create(content)
    loaded = load(save(cfg, tmp_path))["hparams"]
    assert OmegaConf.to_container(loaded) == OmegaConf.to_container(cfg)
    assert loaded.last == 6 and loaded.dotted == 5 and loaded.bracket.y == 1


class _Values:
    """Random acyclic configs of references, resolver calls and containers (seeded)."""

    def __init__(self, seed: int) -> None:
        import random

        self.r = random.Random(seed)

    def text(self, i: int, inside: bool) -> Any:
        r = self.r
        j = r.randrange(i) if i else None
        up = ".." if inside else "."
        choices: list[Any] = [
            "x" * r.randrange(12) + r.choice(["", "\x00", "é", "😀"]),
            r.randrange(-(10**30), 10**30),
            r.random(),
            [r.randrange(9), "q" * r.randrange(5)],
        ]
        if j is not None:
            choices += [
                f"${{a{j}}}",
                f"<${{a{j}}}|${{a{j}}}>",
                f"${{{up}a{j}}}",
                f"${{oc.select:a{j},d}}",
                f"p${{oc.select:zz,[${{a{j}}}]}}",
                f"${{${{k{j}}}}}",
                "-${oc.dict.keys:s}",
            ]
            if inside:
                choices.append(f"${{s.b{j}}}${{.b{j}}}")
        return r.choice(choices)

    def config(self) -> DictConfig:
        content: dict[str, Any] = {"s": {}}
        for i in range(8):
            content[f"k{i}"] = f"a{i}"
            content[f"a{i}"] = self.text(i, False)
            content["s"][f"b{i}"] = self.text(i, True)
        return OmegaConf.create(content)


def _built(value: Any) -> int:
    """Characters omegaconf built resolving a value (strings, keys, numbers' text)."""
    if isinstance(value, dict):
        return sum(len(str(k)) + _built(v) for k, v in value.items())
    if isinstance(value, list):
        return sum(_built(v) for v in value)
    return len(str(value))


@pytest.mark.parametrize("seed", range(4))
def test_the_bound_is_never_below_what_omegaconf_builds(seed: int, tmp_path: pathlib.Path) -> None:
    """Soundness against omegaconf itself: each top-level value's bound covers its resolved
    container and, for text, its resolved string."""
    from compatshim.checkpoint import _interp_size
    from compatshim.checkpoint._omegaconf import path_of

    values = _Values(seed)
    checked = 0
    for _ in range(40):
        cfg = values.config()
        loaded = load(save(cfg, tmp_path))["hparams"]
        nodes: list[tuple[Any, str]] = []
        stack: list[Any] = [loaded]
        while stack:
            node = stack.pop()
            nodes.append((node, f"{type(node).__module__}.{type(node).__name__}"))
            content = node.__dict__.get("_content")
            if isinstance(content, dict):
                stack.extend(content.values())
            elif isinstance(content, list):
                stack.extend(content)
        sizes = _interp_size._Sizes(nodes, lambda units, what: None, path_of)
        for key in loaded:
            node = loaded._get_node(key)
            bound = sizes.of(node, node)
            try:
                resolved = OmegaConf.to_container(loaded, resolve=True)[key]
                text = str(loaded[key])
            except omegaconf.errors.OmegaConfBaseException:
                continue  # omegaconf cannot read it (a missing key, a type): nothing built
            assert bound >= _built(resolved), (key, loaded._get_node(key)._value(), resolved)
            if not isinstance(loaded[key], (DictConfig, ListConfig)):  # those print unresolved
                assert bound >= len(text), (key, text)
            checked += 1
    assert checked > 300


# --------------------------------------------------------------------------- inspect agrees


def _shared_content() -> DictConfig:
    cfg = OmegaConf.create({"a": {"k": 1}, "b": {}})
    cfg._get_node("b").__dict__["_content"] = cfg._get_node("a").__dict__["_content"]
    return cfg


def _cycle() -> DictConfig:
    cfg = OmegaConf.create({})
    cfg.a, cfg.b = "${b}", "${a}"  # OmegaConf.create would not object either
    return cfg


WHOLE_LOAD: dict[str, Any] = {
    **{
        f"expanding {case}": lambda case=case: OmegaConf.create(EXPANDING[case]())
        for case in EXPANDING
    },
    "second order": lambda: OmegaConf.create({"d": "$", "x": "${d}{oc.env:HOME}"}),
    "escaped": lambda: OmegaConf.create({"x": "\\${eval:1}"}),
    "resolver": lambda: OmegaConf.create({"x": "${oc.env:HOME}"}),
    "shared content": _shared_content,
    "reference cycle": _cycle,
}


@pytest.mark.parametrize("case", sorted(WHOLE_LOAD))
def test_inspect_refuses_what_load_refuses_once_configs_are_built(
    case: str, tmp_path: pathlib.Path
) -> None:
    """Issue 26 items 1 and 5: every global is admitted, so only the whole-load checks (case 11
    references, shared content, case 12 second-order syntax) refuse; inspect used to say
    loadable. Now it reports load's own refusal."""
    from compatshim.checkpoint import inspect

    path = save(WHOLE_LOAD[case](), tmp_path)
    with pytest.raises(UnsafeCheckpointError) as refused:
        load(path)
    start = time.perf_counter()
    info = inspect(path)
    assert time.perf_counter() - start < 10
    assert not info.unknown and not info.loadable
    assert info.refusals and info.refusals[-1] in str(refused.value)


def _cli(path: pathlib.Path, *args: str) -> Any:
    import subprocess

    return subprocess.run(
        [sys.executable, "-m", "compatshim", "inspect", str(path), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("case", "code"),  # 3 dangerous: nothing admits it; 1 needs-allow: the resolver it calls
    [("expanding absolute", 3), ("shared content", 3), ("second order", 1)],
)
def test_the_cli_refuses_what_load_refuses_once_configs_are_built(
    case: str, code: int, tmp_path: pathlib.Path
) -> None:
    import json

    path = save(WHOLE_LOAD[case](), tmp_path)
    human = _cli(path)
    assert human.returncode == code, human.stderr
    assert "  REFUSED: " in human.stdout and human.stdout.rstrip().endswith("NOT loadable as is")
    as_json = _cli(path, "--json")
    assert as_json.returncode == code, as_json.stderr
    found = json.loads(as_json.stdout)
    assert found["loadable"] is False and found["unknown"] == [] and found["refusals"]


def test_a_genuine_hydra_config_inspects_clean_without_reading_tensor_data(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hparams with references, oc.select, escapes and 3 000 relative paths: load's machine
    reads it for inspect with every storage on meta; no tensor record is read."""
    from compatshim.checkpoint import inspect
    from tests.checkpoint.helpers import storage_reads

    cfg = plain_hparams()
    cfg.paths = {f"p{i}": f"${{lr}}/{i}/${{..model.name}}" for i in range(3000)}
    path = tmp_path / "hydra.pt"
    torch.save({"hparams": cfg, "state_dict": {"w": torch.zeros(1 << 20)}}, path)
    reads = storage_reads(monkeypatch)
    assert load(path)["state_dict"]["w"].shape == (1 << 20,) and reads == ["data/0"]
    reads.clear()
    info = inspect(path)
    assert info.loadable and not info.refusals and info.tensor_bytes == 4 << 20
    assert reads == []
    monkeypatch.undo()
    human = _cli(path)
    assert human.returncode == 0 and "REFUSED" not in human.stdout, human.stdout


def test_nesting_is_not_lowered_by_closers_before_the_value_or_in_quotes() -> None:
    from compatshim.checkpoint._interp_size import nesting

    deep = "${oc.select:zz," + "[" * 120 + "]" * 120 + "}"
    assert nesting(deep) == 121
    assert nesting("]" * 120 + deep) == 121  # was 1: the charge of a 1-deep text
    quoted = "${oc.select:zz,'" + "]" * 50 + "'," + "[" * 30 + "]" * 30 + "}"
    assert nesting(quoted) == 31  # was 3


def test_brackets_nested_deep_in_an_interpolation_are_charged_by_their_nesting(
    tmp_path: pathlib.Path,
) -> None:
    """omegaconf's parse of ``${oc.select:k,[[[...]]]}`` is quadratic in the nesting, at every
    read: 3,800 values sharing one 120-deep string (407 KB) loaded in 0.3 s and then took
    93 ms a read, about 6 minutes for the values Lightning reads."""
    deep = "${oc.select:zz," + "[" * 120 + "]" * 120 + "}"
    path = save(OmegaConf.create({f"k{i}": deep for i in range(3800)}), tmp_path)
    assert path.stat().st_size < 500_000
    with pytest.raises(UnsafeCheckpointError, match="work budget"):
        load(path)
    shallow = "${oc.select:zz,[[1, 2], [3, 4]]}"  # what a config writes
    loaded = load(save(OmegaConf.create({"k": shallow}), tmp_path, "ok.pt"))["hparams"]
    assert OmegaConf.to_container(loaded, resolve=True)["k"] == [[1, 2], [3, 4]]


@pytest.mark.timeout(120)
def test_a_shared_string_is_scanned_once_for_joins(tmp_path: pathlib.Path) -> None:
    """The glue check ran once per value, not per string: 2,000 values sharing one string of
    200,000 "}" (a 414 KB file) took 97 s before any refusal."""
    shared = "}" * 200_000  # one object: pickle writes it once, every value refers to it
    cfg = OmegaConf.create({"d": "$", "b": "{x", **{f"k{i}": shared for i in range(2000)}})
    path = save(cfg, tmp_path)
    assert path.stat().st_size < 500_000
    started = time.perf_counter()
    with pytest.raises(UnsafeCheckpointError):
        load(path)
    assert time.perf_counter() - started < 15
