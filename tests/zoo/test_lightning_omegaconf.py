"""A real Lightning run configured the Hydra way (a ``DictConfig`` ``cfg``) resumes, armed.

``Model(cfg)`` calls ``save_hyperparameters()``, so Lightning's own
``ModelCheckpoint`` writes ``hyper_parameters = {"cfg": DictConfig}``. Plain
torch >= 2.6 refuses that file in ``load_from_checkpoint`` and
``Trainer.fit(ckpt_path=...)`` on Lightning 2.3 and 2.6 (the baseline
recorded below); with ``torch-load-safe-globals`` armed both resume: same
hyper-parameters of the same types, same weights, ``global_step`` continues.
A checkpoint whose config holds ``${oc.env:...}`` or a registered ``eval``
resolver stays refused, before Lightning can read a value.
"""

from __future__ import annotations

import pathlib
import pickle
import warnings
from collections.abc import Iterator
from importlib.metadata import version
from typing import Any

import pytest

pytest.importorskip("torch")

import torch

L = pytest.importorskip("lightning")
omegaconf = pytest.importorskip("omegaconf")
from omegaconf import DictConfig, ListConfig, OmegaConf  # noqa: E402

import compatshim  # noqa: E402

pytestmark = pytest.mark.timeout(300)
STEPS = 2


def release(distribution: str) -> tuple[int, int]:
    major, minor = version(distribution).split(".")[:2]
    return int(major), int(minor)


def plain_torch_refuses() -> bool:
    """torch 2.6+ loads weights-only by default; Lightning 2.4 and 2.5 pass weights_only=False."""
    return release("torch") >= (2, 6) and release("lightning") not in ((2, 4), (2, 5))


class Model(L.LightningModule):
    def __init__(self, cfg: DictConfig) -> None:
        super().__init__()
        self.save_hyperparameters()  # as Hydra projects do: hparams["cfg"] is the DictConfig
        torch.manual_seed(0)
        self.linear = torch.nn.Linear(4, 1)

    def training_step(self, batch: Any, index: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.linear(x), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.cfg.optim.lr, momentum=0.9)


def data() -> Any:
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(8, 4, generator=g), torch.randn(8, 1, generator=g)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)


def trainer(root: pathlib.Path, steps: int, **kwargs: Any) -> Any:
    return L.Trainer(
        max_steps=steps,
        default_root_dir=str(root),
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **kwargs,
    )


def hydra_cfg(**extra: Any) -> DictConfig:
    cfg = OmegaConf.create(
        {
            "optim": {"lr": 0.05, "betas": [0.9, 0.99], "name": "sgd"},
            "model": {"width": 4, "depth": "${optim.lr}"},
            "data": {"root": "/data/${model.width}", "fallback": "${oc.select:data.none,8}"},
            **extra,
        }
    )
    OmegaConf.set_struct(cfg, True)  # as Hydra hands it to the task function
    return cfg


def fit_and_save(root: pathlib.Path, cfg: DictConfig) -> tuple[pathlib.Path, Model]:
    model = Model(cfg)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's hints about workers and logging
        trainer(root, STEPS).fit(model, data())
    path = root / "last.ckpt"
    model.trainer.save_checkpoint(path)
    return path, model


@pytest.fixture
def armed() -> Iterator[None]:
    compatshim.install(include=["torch-load-safe-globals"])
    try:
        yield
    finally:
        compatshim.uninstall(["torch-load-safe-globals"])


def test_plain_torch_baseline(tmp_path: pathlib.Path) -> None:
    """What users see today, recorded: a refusal on torch >= 2.6 (Lightning 2.3, 2.6)."""
    path, _ = fit_and_save(tmp_path, hydra_cfg())
    if not plain_torch_refuses():
        assert type(Model.load_from_checkpoint(path).hparams.cfg) is DictConfig
        return
    with pytest.raises(pickle.UnpicklingError, match=r"omegaconf|Unsupported global"):
        Model.load_from_checkpoint(path)


def test_load_from_checkpoint_and_resume_armed(tmp_path: pathlib.Path, armed: None) -> None:
    cfg = hydra_cfg()
    path, saved = fit_and_save(tmp_path, cfg)
    loaded = Model.load_from_checkpoint(path)
    got = loaded.hparams.cfg
    assert type(got) is DictConfig and type(got.optim.betas) is ListConfig
    assert OmegaConf.to_container(got) == OmegaConf.to_container(cfg)
    assert got.model.depth == 0.05 and got.data.root == "/data/4" and got.data.fallback == 8
    for mine, theirs in zip(loaded.parameters(), saved.parameters()):
        assert torch.equal(mine, theirs)

    resumed = Model(cfg)
    seen: dict[str, int] = {}

    class Start(L.Callback):
        def on_train_start(self, trainer: Any, module: Any) -> None:
            seen["start"] = trainer.global_step

    run = trainer(tmp_path / "resumed", STEPS + 2, callbacks=[Start()])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run.fit(resumed, data(), ckpt_path=str(path))
    assert seen["start"] == STEPS and run.global_step == STEPS + 2
    assert OmegaConf.to_container(resumed.hparams.cfg) == OmegaConf.to_container(cfg)


@pytest.fixture
def marker(tmp_path: pathlib.Path) -> Iterator[pathlib.Path]:
    path = tmp_path / "resolver-ran"

    def run(expression: Any = "") -> Any:
        path.write_text("ran")
        return expression

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 2.4 renamed it register_resolver
        OmegaConf.register_new_resolver("eval", run, replace=True)
    yield path
    if hasattr(OmegaConf, "clear_resolver"):
        OmegaConf.clear_resolver("eval")
    else:
        omegaconf.basecontainer.BaseContainer._resolvers.pop("eval", None)


@pytest.mark.parametrize("hostile", ["${oc.env:COMPATSHIM_TEST_SECRET}", "${eval:1}"])
def test_hostile_interpolations_stay_refused(
    hostile: str,
    tmp_path: pathlib.Path,
    marker: pathlib.Path,
    armed: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COMPATSHIM_TEST_SECRET", "s3cret")
    cfg = hydra_cfg()
    path, _ = fit_and_save(tmp_path, cfg)
    checkpoint = torch.load(path, weights_only=False)  # our own file: rewrite its config
    checkpoint["hyper_parameters"]["cfg"].optim.name = hostile
    torch.save(checkpoint, path)
    assert not marker.exists()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # CheckpointRefusedWarning: asserted through the error
        with pytest.raises(pickle.UnpicklingError) as refused:
            Model.load_from_checkpoint(path)
    notes = str(refused.value) + " ".join(getattr(refused.value, "__notes__", []))
    if release("torch") >= (2, 6):
        assert "optim.name" in notes and "omegaconf-resolver:" in notes
    assert not marker.exists()


@pytest.mark.parametrize("source", ["code", "environment"])
def test_a_resolver_allowed_process_wide_loads_armed(
    source: str,
    tmp_path: pathlib.Path,
    marker: pathlib.Path,
    armed: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``load_from_checkpoint`` calls torch.load, which has no allow=: a process-wide
    ``omegaconf-resolver:eval`` entry keeps the trusted resolver, and only that one."""
    from compatshim.checkpoint import process_allow

    if not plain_torch_refuses():
        pytest.skip("Lightning passes weights_only=False here: armed mode leaves the load alone")
    monkeypatch.delenv("COMPATSHIM_ALLOW_FILE", raising=False)
    monkeypatch.setenv("COMPATSHIM_TEST_SECRET", "s3cret")
    process_allow._reset()
    cfg = hydra_cfg()
    path, _ = fit_and_save(tmp_path, cfg)
    checkpoint = torch.load(path, weights_only=False)  # our own file: rewrite its config
    checkpoint["hyper_parameters"]["cfg"].optim.name = "${eval:7}"
    torch.save(checkpoint, path)
    checkpoint["hyper_parameters"]["cfg"].data.root = "${oc.env:COMPATSHIM_TEST_SECRET}"
    both = tmp_path / "both.ckpt"
    torch.save(checkpoint, both)
    try:
        if source == "code":
            compatshim.checkpoint.allow("omegaconf-resolver:eval", reason="our configs use it")
        else:
            monkeypatch.setenv("COMPATSHIM_ALLOW", "omegaconf-resolver:eval")
        loaded = Model.load_from_checkpoint(path)
        assert loaded.hparams.cfg.optim.name == 7 and marker.exists()
        marker.unlink()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # CheckpointRefusedWarning
            with pytest.raises(pickle.UnpicklingError) as refused:
                Model.load_from_checkpoint(both)  # a resolver named but not allowed
        notes = " ".join(getattr(refused.value, "__notes__", [])) + str(refused.value)
        assert "'oc.env'" in notes and "data.root" in notes
        assert not marker.exists()
    finally:
        process_allow._reset()


def test_a_config_composed_by_hydra_resumes_armed(tmp_path: pathlib.Path, armed: None) -> None:
    """Where hydra-core is installed (it pins omegaconf < 2.4): its own ``compose`` output."""
    hydra = pytest.importorskip("hydra")
    conf = tmp_path / "conf"
    (conf / "optim").mkdir(parents=True)
    (conf / "config.yaml").write_text(
        "defaults:\n  - optim: sgd\n  - _self_\n"
        "model:\n  width: 4\n  depth: ${optim.lr}\ndata:\n  root: /data/${model.width}\n"
    )
    (conf / "optim" / "sgd.yaml").write_text("lr: 0.05\nbetas: [0.9, 0.99]\nname: sgd\n")
    with hydra.initialize_config_dir(config_dir=str(conf), version_base=None):
        cfg = hydra.compose(config_name="config", overrides=["optim.lr=0.02"])
    path, saved = fit_and_save(tmp_path, cfg)
    loaded = Model.load_from_checkpoint(path)
    assert type(loaded.hparams.cfg) is DictConfig and OmegaConf.is_struct(loaded.hparams.cfg)
    assert OmegaConf.to_container(loaded.hparams.cfg) == OmegaConf.to_container(cfg)
    assert loaded.hparams.cfg.model.depth == 0.02
    for mine, theirs in zip(loaded.parameters(), saved.parameters()):
        assert torch.equal(mine, theirs)


def test_inspect_judges_lightning_checkpoints_as_load_does(tmp_path: pathlib.Path) -> None:
    """``compatshim inspect`` on Lightning's own file: the Hydra-style run inspects clean; the
    same file with hparams whose references expand (issue 26 case 11) is refused, as ``load``
    refuses it (before, inspect called it loadable)."""
    import subprocess
    import sys

    from compatshim.checkpoint import UnsafeCheckpointError, inspect, load

    path, _ = fit_and_save(tmp_path, hydra_cfg())
    info = inspect(path)
    assert info.loadable and not info.refusals, info.refusals
    checkpoint = torch.load(path, weights_only=False)  # our own file: rewrite its config
    cfg = checkpoint["hyper_parameters"]["cfg"]
    OmegaConf.set_struct(cfg, False)
    cfg.refs = {"a0": "x" * 8, **{f"a{i}": f"${{.a{i - 1}}}${{.a{i - 1}}}" for i in range(1, 31)}}
    doubled = tmp_path / "doubled.ckpt"
    torch.save(checkpoint, doubled)
    with pytest.raises(UnsafeCheckpointError) as refused:
        load(doubled)
    info = inspect(doubled)
    assert not info.loadable and info.refusals[-1] in str(refused.value)
    assert "resolves to at most" in info.refusals[-1]
    for file, code in ((path, 0), (doubled, 3)):  # 3: dangerous, what no allow entry admits
        done = subprocess.run(
            [sys.executable, "-m", "compatshim", "inspect", str(file), "--json"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == code, done.stderr
