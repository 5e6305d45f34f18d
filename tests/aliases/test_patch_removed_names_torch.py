"""torch.distributed names: each alias ``is`` its target where it applies, absent where not."""

from __future__ import annotations

import pytest

from tests.aliases.helpers import run

torch = pytest.importorskip("torch")

from compatshim.aliases.table import TABLE  # noqa: E402

TORCH_ENTRIES = [a for a in TABLE if a.module == "torch.distributed" and a.provides == "attribute"]


@pytest.mark.parametrize("name", [a.attribute for a in TORCH_ENTRIES])
def test_alias_is_its_target_where_it_applies_and_absent_where_not(name: str) -> None:
    found = run(
        "import json, torch.distributed as dist, compatshim\n"
        "from compatshim.aliases import needed, resolve\n"
        "from compatshim.aliases.table import TABLE\n"
        f"alias = [a for a in TABLE if a.name == 'torch.distributed.{name}'][0]\n"
        f"real = vars(dist).get({name!r})\n"
        "try:\n    target = resolve(alias.target)\nexcept (ImportError, AttributeError):\n"
        "    target = None\n"
        "compatshim.install()\n"
        f"value = getattr(dist, {name!r}, None)\n"
        "armed = [value is real if real is not None else value is target, value is None]\n"
        "compatshim.uninstall()\n"
        f"print(json.dumps([real is not None, needed(alias), target is not None, armed, "
        f"getattr(dist, {name!r}, None) is real]))"
    )
    has_real, is_needed, has_target, (is_expected, is_absent), restored = found
    assert is_expected, found
    assert restored
    if has_real or (is_needed and has_target):
        assert not is_absent
    else:
        assert is_absent  # nothing provided where the release does not need it


def test_renamed_collectives_on_four_gloo_ranks_equal_the_old_names() -> None:
    if not torch.distributed.is_available():
        pytest.skip("torch.distributed unavailable")
    from tests.aliases.dist_workers import through_aliases
    from tests.harness.dist import run_ranks

    results = run_ranks(through_aliases, world_size=4, timeout=150)
    for rank, out in enumerate(results):
        for name in ("all_gather_single", "reduce_scatter_single"):
            new, old = out[name]
            assert new == old, (rank, name)
        if "gather_single" in vars(torch.distributed) and isinstance(out["gather_single"], str):
            continue  # torch's own gather_single, which gloo does not support (2.14, 2.15)
        new, old = out["gather_single"]
        assert new == old, rank
        if rank == 0:
            assert new == [v + 10 * r for r in range(4) for v in range(3)]
    used = results[0]["used"]
    if "gather_single" not in vars(torch.distributed):
        assert "torch.distributed.gather_single" in used
    if "set_timeout" not in vars(torch.distributed) and hasattr(
        torch.distributed.distributed_c10d, "_set_pg_timeout"
    ):
        assert "torch.distributed.set_timeout" in used


@pytest.mark.filterwarnings("ignore")
def test_object_collectives_weights_only_on_four_gloo_ranks() -> None:
    """weights_only=True round-trips what torch.load(weights_only=True) accepts, refuses the
    rest on the receiving ranks, equals the plain result, and ranks that disagree all get a
    clear error instead of a hang or a pickle error."""
    if not torch.distributed.is_available():
        pytest.skip("torch.distributed unavailable")
    from tests.aliases.dist_workers import object_collectives
    from tests.harness.dist import run_ranks

    lacking = (
        "weights_only"
        not in __import__("inspect").signature(torch.distributed.all_gather_object).parameters
    )
    results = run_ranks(object_collectives, world_size=4, args=(True,), timeout=150)
    for rank, out in enumerate(results):
        for safe_rank, safe_t, plain_rank, plain_t in out["all_gather"]:
            assert (safe_rank, safe_t) == (plain_rank, plain_t)
        assert out["broadcast"] == [[1.0, 1.0], "text"]
        assert out["refused"] == (True if rank == 0 else "UnpicklingError")
        assert out["disagree"] != "no error"
        if lacking:
            assert "all ranks must pass the same value" in out["disagree"]
            assert "torch.distributed.all_gather_object(weights_only=)" in out["used"]


def test_a_library_wrapper_over_the_weights_only_collective_survives_uninstall() -> None:
    """A library wraps ``all_gather_object`` after install: uninstall keeps its wrapper, and
    ours under it then acts as torch's own (``weights_only=`` is torch's TypeError where torch
    lacks it); installing again gives ``weights_only=`` back through the library's wrapper."""
    if not torch.distributed.is_available():
        pytest.skip("torch.distributed unavailable")
    found = run(
        "import functools, json, os, tempfile\n"
        "import torch.distributed as dist, compatshim\n"
        "store = dist.FileStore(os.path.join(tempfile.mkdtemp(), 'store'), 1)\n"
        "dist.init_process_group('gloo', store=store, rank=0, world_size=1)\n"
        "torchs = dist.all_gather_object\n"
        "compatshim.install(['removed-names'])\n"
        "under = dist.all_gather_object\n"
        "@functools.wraps(under)\n"
        "def library(*args, **kwargs):\n"
        "    return under(*args, **kwargs)\n"
        "dist.all_gather_object = library\n"
        "def call():\n"
        "    out = [None]\n"
        "    try:\n"
        "        dist.all_gather_object(out, {'step': 3}, weights_only=True)\n"
        "    except TypeError:\n"
        "        return 'TypeError'\n"
        "    return out\n"
        "compatshim.uninstall(['removed-names'])\n"
        "after = [dist.all_gather_object is library, call()]\n"
        "compatshim.install(['removed-names'])\n"
        "row = [r for r in compatshim.status() if r.name == 'removed-names'][0]\n"
        "again = [dist.all_gather_object is not library, call(), row.applied]\n"
        "compatshim.uninstall(['removed-names'])\n"
        "dist.destroy_process_group()\n"
        "print(json.dumps([under is not torchs, after, again]))"
    )
    wrapped, (kept, after), (rewrapped, again, applied) = found
    assert kept, found
    assert again == [{"step": 3}], found
    if wrapped:  # torch lacks weights_only=: ours was there
        assert after == "TypeError", found
        assert rewrapped and applied, found
    else:
        assert after == [{"step": 3}], found


def test_a_revert_landing_mid_call_never_turns_weights_only_into_a_full_unpickle() -> None:
    """``uninstall()`` in another thread sets the patcher's ``live`` to False before it puts
    the attributes back: an object collective called with ``weights_only=True`` while the
    patch was live still loads weights-only in that window (here: refused), never with
    torch's pickle path, which would run the global (``os.getpid`` standing for worse).
    The window is reached deterministically: the revert lands just before the helper."""
    if not torch.distributed.is_available():
        pytest.skip("torch.distributed unavailable")
    found = run(
        "import json, os, tempfile\n"
        "import torch.distributed as dist\n"
        "from torch.distributed import distributed_c10d as c10d\n"
        "from compatshim._engine.patching import Patcher\n"
        "from compatshim.aliases.collectives import apply_weights_only, keyword_missing\n"
        "store = dist.FileStore(os.path.join(tempfile.mkdtemp(), 'store'), 1)\n"
        "dist.init_process_group('gloo', store=store, rank=0, world_size=1)\n"
        "needed = bool(keyword_missing(dist))\n"
        "patcher = Patcher()\n"
        "apply_weights_only(dist, patcher)\n"
        "ours = vars(c10d)['_object_to_tensor']\n"
        "def revert_lands_here(*args):\n"
        "    patcher.live = False  # what Patcher.revert() does first\n"
        "    return ours(*args)\n"
        "c10d._object_to_tensor = revert_lands_here\n"
        "class Hostile:\n"
        "    def __reduce__(self):\n"
        "        return (os.getpid, ())\n"
        "out = [None]\n"
        "try:\n"
        "    dist.all_gather_object(out, Hostile(), weights_only=True)\n"
        "    got = 'ran' if out == [os.getpid()] else repr(out)\n"
        "except Exception as exc:\n"
        "    got = type(exc).__name__\n"
        "c10d._object_to_tensor = ours\n"
        "patcher.live = True\n"
        "patcher.revert()\n"
        "dist.destroy_process_group()\n"
        "print(json.dumps([needed, got]))"
    )
    needed, got = found
    if not needed:
        pytest.skip("this torch has weights_only= on its object collectives")
    assert got == "UnpicklingError", found
