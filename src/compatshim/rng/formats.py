"""Other frameworks' RNG dicts, recognised by their keys and converted to compatshim state.

Known layouts (each checked against files the real releases wrote; see
tests/rng/fixtures/README.md):

* ``transformers`` Trainer ``rng_state[_N].pth``: ``python``, ``numpy``,
  ``cpu``, ``cuda`` (a list when the run was distributed, one tensor
  otherwise), optional ``mps``/``xpu``/``npu``/``mlu``/``musa``/``hpu``.
* ``accelerate`` ``random_states_N.pkl`` (a torch.save zip despite the name):
  ``random_state``, ``numpy_random_seed``, ``torch_manual_seed``,
  ``torch_cuda_manual_seed`` (list), optional ``torch_xpu_manual_seed``, ``step``.
* Lightning / Fabric ``_collect_rng_states()``: ``torch``, ``numpy``,
  ``python``, ``torch.cuda`` (list), anywhere inside a checkpoint.
* Sana-style ``rng_state``: ``torch``, ``torch_cuda`` (list), ``numpy``, ``python``.
* plain pickles of ``{"python": random.getstate(), "numpy": np.random.get_state()}``.

numpy's entry is ``('MT19937', uint32[624], pos, has_gauss, cached_gaussian)``
in every one of them (or a dict with those fields, as some projects store it).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from .errors import RNGStateError
from .state import (
    FILE_FORMAT,
    SCHEMA_VERSION,
    NumpyMT,
    Parts,
    cpu_state,
    cuda_state,
    is_file,
    is_state,
    numpy_state,
    python_state,
    to_state,
)

# layout name -> (python key, numpy key, cpu key, cuda key, xpu key, mps key)
LAYOUTS: dict[str, tuple[str, str, str, str, str, str]] = {
    "transformers": ("python", "numpy", "cpu", "cuda", "xpu", "mps"),
    "accelerate": (
        "random_state",
        "numpy_random_seed",
        "torch_manual_seed",
        "torch_cuda_manual_seed",
        "torch_xpu_manual_seed",
        "",
    ),
    "lightning": ("python", "numpy", "torch", "torch.cuda", "", ""),
    "sana": ("python", "numpy", "torch", "torch_cuda", "", ""),
    "python-numpy": ("python", "numpy", "", "", "", ""),
}
_SEARCH_DEPTH = 4


def layout_of(obj: Mapping[str, Any]) -> str | None:
    """The name of the known layout ``obj`` has, or None."""
    keys = set(obj)
    if "cpu" in keys and keys & {"python", "numpy"}:
        return "transformers"
    if "torch_manual_seed" in keys and "random_state" in keys:
        return "accelerate"
    if "torch" in keys and "torch_cuda" in keys:
        return "sana"
    if "torch" in keys and keys & {"python", "numpy"}:
        return "lightning"
    if {"python", "numpy"} <= keys:
        return "python-numpy"
    return None


def _numpy_entry(value: Any, where: str) -> NumpyMT:
    if isinstance(value, Mapping):  # {"bit_generator"|"name", "state"|"keys"|"key", ...}
        name = value.get("bit_generator", value.get("name", "MT19937"))
        words = next((value[k] for k in ("key", "keys", "state") if k in value), None)
        fields = (
            name,
            words,
            value.get("pos", value.get("position")),
            value.get("has_gauss"),
            value.get("cached_gaussian"),
        )
    elif isinstance(value, (tuple, list)) and len(value) == 5:
        fields = tuple(value)
    else:
        raise RNGStateError(f"invalid RNG state at {where}: not a numpy MT19937 state")
    name, pos, has_gauss, cached = fields[0], fields[2], fields[3], fields[4]
    key: Any = fields[1]
    if not (isinstance(name, str) and name == "MT19937"):
        raise RNGStateError(f"invalid RNG state at {where}: bit generator {name!r:.40} unsupported")
    if hasattr(key, "tolist") and not _is_tensor(key):
        key = key.tolist()  # a real ndarray (trusted load) or the safe loader's stand-in
    return numpy_state(key, _plain(pos), _plain(has_gauss), _plain(cached), where)


def _plain(value: Any) -> Any:
    """numpy scalars (trusted loads) to Python numbers; everything else unchanged."""
    if hasattr(value, "item") and not isinstance(value, (int, float)) and not _is_tensor(value):
        return value.item()
    return value


def _is_tensor(value: Any) -> bool:
    import torch

    return isinstance(value, torch.Tensor)


def _devices(value: Any, where: str) -> list[Any]:
    if value is None:
        return []
    if _is_tensor(value):  # transformers outside distributed runs: the current device only
        return [cuda_state(value, where)]
    if not isinstance(value, (list, tuple)):
        raise RNGStateError(f"invalid RNG state at {where}: expected a list of device states")
    return [cuda_state(v, f"{where}[{i}]") for i, v in enumerate(value)]


def convert(obj: Mapping[str, Any], layout: str, where: str = "state") -> Parts:
    """Parts from a dict in one of :data:`LAYOUTS`."""
    py_key, np_key, cpu_key, cuda_key, xpu_key, mps_key = LAYOUTS[layout]
    parts = Parts(meta={"writer": layout})
    if py_key and obj.get(py_key) is not None:
        value = obj[py_key]
        if isinstance(value, (tuple, list)) and len(value) == 3 and _is_tensor(value[1]):
            value = (value[0], value[1].tolist(), value[2])
        parts.python = python_state(value, f"{where}.{py_key}")
    if np_key and obj.get(np_key) is not None:
        parts.numpy = _numpy_entry(obj[np_key], f"{where}.{np_key}")
    if cpu_key and obj.get(cpu_key) is not None:
        parts.torch_cpu = cpu_state(obj[cpu_key], f"{where}.{cpu_key}")
    if cuda_key:
        parts.cuda = _devices(obj.get(cuda_key), f"{where}.{cuda_key}")
    if xpu_key and obj.get(xpu_key) is not None:
        value = obj[xpu_key]
        parts.xpu = list(value) if isinstance(value, (list, tuple)) else [value]
    if mps_key and obj.get(mps_key) is not None:
        parts.mps = obj[mps_key]
    return parts


def _find(obj: Any, path: str, depth: int, found: list[tuple[str, Any, str]]) -> None:
    if not isinstance(obj, Mapping) or depth > _SEARCH_DEPTH:
        return
    if is_state(obj) or is_file(obj):
        found.append((path, obj, "compatshim"))
        return
    layout = layout_of(obj)
    if layout is not None:
        found.append((path, obj, layout))
        return
    for key, value in obj.items():
        if isinstance(value, Mapping):
            _find(value, f"{path}[{key!r}]", depth + 1, found)


def single_rank_file(parts: Parts, source: str, saved_rank: int | None) -> dict[str, Any]:
    return {
        "format": FILE_FORMAT,
        "version": SCHEMA_VERSION,
        "source": source,
        "world_size": None,
        "saved_rank": saved_rank,
        "ranks": [to_state(parts)],
    }


def to_file(obj: Any, *, saved_rank: int | None = None, what: str = "the object") -> dict[str, Any]:
    """A compatshim file dict for ``obj``: compatshim's own, or a known layout anywhere inside."""
    found: list[tuple[str, Any, str]] = []
    _find(obj, "", 0, found)
    if not found:
        top = sorted(map(str, obj))[:12] if isinstance(obj, Mapping) else type(obj).__name__
        raise RNGStateError(
            f"no RNG state found in {what} (top level: {top}); looked for compatshim's own "
            f"format and these layouts, up to {_SEARCH_DEPTH} dicts deep: {describe_layouts()}"
        )
    if len(found) > 1:
        paths = ", ".join(f"{p or '<top>'} ({layout})" for p, _, layout in found)
        raise RNGStateError(f"several RNG states in {what}: {paths}; pass the one you mean")
    path, inner, layout = found[0]
    where = f"state{path}"
    if is_file(inner):
        return dict(inner)
    if layout == "compatshim":
        from .state import parse_state

        parts = parse_state(inner, where)
        rank = parts.meta.get("rank")
        return single_rank_file(parts, "compatshim", rank if isinstance(rank, int) else saved_rank)
    return single_rank_file(convert(inner, layout, where), layout, saved_rank)


def merge_ranks(files: Sequence[dict[str, Any]], source: str) -> dict[str, Any]:
    """One file dict from per-rank files 0..N-1 (transformers, accelerate checkpoints)."""
    return {
        "format": FILE_FORMAT,
        "version": SCHEMA_VERSION,
        "source": source,
        "world_size": len(files),
        "ranks": [f["ranks"][0] for f in files],
    }


def describe_layouts() -> str:
    return "; ".join(
        f"{name}: {{{', '.join(k for k in keys if k)}}}" for name, keys in LAYOUTS.items()
    )
