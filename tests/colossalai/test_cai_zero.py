"""ColossalAI LowLevelZero on a real 2-rank gloo group: masters, EMA, the Open-Sora line.

Module docstring of ``cai_standin`` lists the CPU stand-ins (hardware only).
All checks run in ONE 2-rank session (``import colossalai`` costs 10-25 s).
"""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

if importlib.util.find_spec("colossalai") is None:  # found, not imported: the import costs ~13 s
    pytest.skip("ColossalAI is not installed (tox -e colossalai-0.5.0)", allow_module_level=True)

pytest.importorskip("torch")

from packaging.version import Version

from tests.colossalai.cai_session import CONFIGS, run_session
from tests.harness.dist import run_ranks

pytestmark = [pytest.mark.dist]

CONFIG_IDS = [f"stage{s}-{d}" for s, d in CONFIGS]
# rounding of the working dtype, relative
ROUNDING = {"bf16": 2**-8, "fp16": 2**-11}


@pytest.fixture(scope="module")
def ranks() -> list[dict[str, Any]]:
    # colossalai 0.4.4+ call torch.compile at import; inductor's warm-up process pool
    # cannot start inside the (daemonic) rank processes, so compile threads = 1
    env = {"TORCHINDUCTOR_COMPILE_THREADS": "1"}
    return run_ranks(run_session, 2, args=(CONFIGS,), timeout=420, env=env)


def _version(ranks: list[dict[str, Any]]) -> Version:
    return Version(ranks[0]["version"])


@pytest.mark.parametrize("config", CONFIG_IDS)
def test_gathered_masters_equal_working_params(ranks: list[dict[str, Any]], config: str) -> None:
    for summary in ranks:
        for when in ("initial", "trained"):
            result = summary["zero"][config][when]
            assert result["cast_mismatch"] == 0, (when, result)
            # |working - master| is at most half an ulp of the working dtype (|p| < 4 here)
            assert result["max_abs_fp32"] <= 4 * ROUNDING[config.split("-")[1]], (when, result)


@pytest.mark.parametrize("config", CONFIG_IDS)
def test_shard_positions_cover_padded_param(ranks: list[dict[str, Any]], config: str) -> None:
    by_rank = [
        dict((p[0], p[1:]) for p in s["zero"][config]["initial"]["positions"]) for s in ranks
    ]
    for name, (_, length, padding, numel, world) in by_rank[0].items():
        assert world == 2
        assert padding == (2 - numel % 2) % 2
        assert length * 2 == numel + padding
        assert [r[name][0] for r in by_rank] == [0, length]


@pytest.mark.parametrize("config", CONFIG_IDS)
def test_ema_full_and_sharded_match_fp64_reference(
    ranks: list[dict[str, Any]], config: str
) -> None:
    for summary in ranks:
        result = summary["zero"][config]
        assert result["ema_full_err"] < 1e-6, result["ema_full_err"]
        assert result["ema_sharded_err"] < 1e-6, result["ema_sharded_err"]
        # the sharded EMA holds 1-D shards of the trainable, sharded params only
        shapes = result["sharded_shapes"]
        assert len(shapes["embed.weight"]) == 1
        assert shapes["pos_embed"] == (1, 3)  # excluded: left full-size
        assert shapes["frozen"] == (3,)
        assert result["pos_embed_init_kept"]


@pytest.mark.parametrize("config", CONFIG_IDS)
def test_an_ema_on_another_device_than_the_masters_is_named(
    ranks: list[dict[str, Any]], config: str
) -> None:
    """ZeRO's CPU offload keeps the fp32 masters on the CPU: an EMA elsewhere was torch's
    unnamed device error from inside the update."""
    for summary in ranks:
        error = summary["zero"][config]["master_device_error"]
        assert error.startswith("EmaMismatchError: "), error
        assert "is on meta but its fp32 master (the ZeRO optimizer's) is on cpu" in error


def test_ema_buffers_of_a_batchnorm_model_under_zero(ranks: list[dict[str, Any]]) -> None:
    """The default buffer policy on the ZeRO path: statistics averaged into the fp32 EMA
    (full-size and sharded alike), counters copied, params from the masters."""
    for summary in ranks:
        result = summary["batchnorm"]
        assert result["ema_full_err"] < 1e-6 and result["ema_sharded_err"] < 1e-6, result
        assert result["buffers_full_err"] < 1e-6 and result["buffers_sharded_err"] < 1e-6, result
        assert result["buffer_dtypes"] == ["torch.float32", "torch.int64"]
        assert result["counters"] == [5, 5]
        assert result["moved"]


@pytest.mark.parametrize("config", CONFIG_IDS)
def test_map_api(ranks: list[dict[str, Any]], config: str) -> None:
    result = ranks[0]["zero"][config]
    assert result["map_len"] == 6  # trainable params; frozen is not in ZeRO
    assert result["map_keys_are_params"]
    assert result["id_key_same"]
    assert result["master_dtype"] == "torch.float32"
    assert "no master" in result["frozen_error"]


def test_open_sora_line_breaks_from_041_compatshim_works(ranks: list[dict[str, Any]]) -> None:
    error = ranks[0]["zero"]["stage2-bf16"]["open_sora_line_error"]
    if _version(ranks) >= Version("0.4.1"):
        assert error.startswith("AttributeError") and "_param_store" in error
    else:
        assert error == ""
    assert ranks[0]["zero"]["stage2-bf16"]["ema_full_err"] < 1e-6


def test_get_working_to_master_map_exists_from_033(ranks: list[dict[str, Any]]) -> None:
    has = ranks[0]["zero"]["stage1-bf16"]["get_working_to_master_map"]
    assert has == (_version(ranks) >= Version("0.3.3"))


def test_unknown_layout_error_names_everything(ranks: list[dict[str, Any]]) -> None:
    message = ranks[0]["zero"]["stage1-bf16"]["unknown_layout_error"]
    assert message.startswith("UnknownLayoutError")
    assert f"colossalai {ranks[0]['version']}" in message
    assert "colossalai.zero.future.LowLevelZeroOptimizer" in message
    assert "optimizer._param_store.working_to_master_param" in message  # looked for
    assert "zero-optimizer-attribute (colossalai 0.4.1-0.5.0" in message  # known layouts


def test_plain_torch_optimizer_maps_params_to_themselves(ranks: list[dict[str, Any]]) -> None:
    for summary in ranks:
        plain = summary["plain"]
        assert plain["identity"] and plain["master_is_param"] and plain["whole"]
        assert plain["ema_err"] < 1e-6


def test_booster_low_level_zero_stage2(ranks: list[dict[str, Any]]) -> None:
    for summary in ranks:
        booster = summary["booster"]
        assert booster["optimizer_type"] == "LowLevelZeroOptimizer"
        expected = (
            "zero-param-store"
            if _version(ranks) <= Version("0.4.0")
            else ("zero-optimizer-attribute")
        )
        assert booster["layout"] == expected
        assert booster["masters"]["cast_mismatch"] == 0
        assert booster["ema_err"] < 1e-6


@pytest.mark.parametrize("zero_stage", [0, 1])
def test_hybrid_parallel_plugin(ranks: list[dict[str, Any]], zero_stage: int) -> None:
    result = ranks[0]["hybrid"][zero_stage]
    if "unavailable" in result:
        pytest.skip(
            f"HybridParallelPlugin on colossalai {ranks[0]['version']}: {result['unavailable']}"
        )
    expected = "mixed-precision-map" if zero_stage == 0 else "zero-"
    for summary in ranks:
        result = summary["hybrid"][zero_stage]
        assert result["layout"].startswith(expected), result
        assert result["masters"]["cast_mismatch"] == 0
        assert result["ema_err"] < 1e-6


def test_doctor_reads_the_layout_the_optimizer_uses(ranks: list[dict[str, Any]]) -> None:
    """The source marker each layout declares is in this release's installed source."""
    from compatshim.master import doctor_rows
    from compatshim.master.doctor import detected_layout

    layout = detected_layout()
    assert layout is not None
    assert layout.name == ranks[0]["booster"]["layout"]
    (row,) = doctor_rows()
    assert row.applies and row.fixed
    assert row.detail == f"colossalai {ranks[0]['version']}: {layout.describe()}"
