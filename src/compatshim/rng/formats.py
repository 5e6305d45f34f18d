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

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from .._text import short
from .errors import RNGStateError
from .state import (
    FILE_FORMAT,
    MAX_STATE_ELEMENTS,
    STATE_FORMAT,
    NumpyMT,
    Parts,
    byte_state,
    captured_position,
    check_file_header,
    cpu_state,
    cuda_state,
    is_file,
    is_state,
    make_file,
    numpy_state,
    python_state,
    to_state,
)


@dataclass(frozen=True)
class Layout:
    """Where one framework keeps each generator in its RNG dict ("" = not stored)."""

    name: str
    python: str
    numpy: str
    cpu: str
    cuda: str
    xpu: str = ""
    mps: str = ""

    def keys(self) -> list[str]:
        return [k for k in (self.python, self.numpy, self.cpu, self.cuda, self.xpu, self.mps) if k]


LAYOUTS: dict[str, Layout] = {
    layout.name: layout
    for layout in (
        Layout("transformers", python="python", numpy="numpy", cpu="cpu", cuda="cuda", xpu="xpu",
               mps="mps"),
        Layout(
            "accelerate",
            python="random_state",
            numpy="numpy_random_seed",
            cpu="torch_manual_seed",
            cuda="torch_cuda_manual_seed",
            xpu="torch_xpu_manual_seed",
        ),
        Layout("lightning", python="python", numpy="numpy", cpu="torch", cuda="torch.cuda"),
        Layout("sana", python="python", numpy="numpy", cpu="torch", cuda="torch_cuda"),
        Layout("python-numpy", python="python", numpy="numpy", cpu="", cuda=""),
    )
}  # fmt: skip
_SEARCH_DEPTH = 4


def lacks_format(obj: Mapping[str, Any]) -> bool:
    """compatshim's own state or file dict without its ``format`` key: named as such, not
    read as another framework's layout (its ``python``/``numpy`` keys match one)."""
    return "format" not in obj and "version" in obj and ("torch_cpu" in obj or "ranks" in obj)


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


def _other_bit_generator(value: Any) -> str | None:
    """The name of a bit generator other than MT19937 that numpy's dict state names
    (``np.random.get_state()`` after ``set_bit_generator``, numpy 1.25+), else None."""
    if not isinstance(value, Mapping):
        return None
    name = value.get("bit_generator")
    return name if isinstance(name, str) and name != "MT19937" else None


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
        raise RNGStateError(
            f"invalid RNG state at {where}: bit generator {short(name)} unsupported"
        )
    if hasattr(key, "tolist") and not _is_tensor(key):
        if getattr(key, "size", 0) > MAX_STATE_ELEMENTS or getattr(key, "ndim", 1) != 1:
            raise RNGStateError(f"invalid RNG state at {where}: the key is not 624 words")
        key = key.tolist()  # a numpy array
    return numpy_state(key, _plain(pos), _plain(has_gauss), _plain(cached), where)


def _plain(value: Any) -> Any:
    """numpy scalars and 0-d arrays to Python numbers; everything else unchanged."""
    if isinstance(value, (int, float)) or _is_tensor(value):
        return value
    if hasattr(value, "item") and getattr(value, "shape", None) == ():
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
    keys = LAYOUTS[layout]
    parts = Parts(meta={"writer": layout})
    if keys.python and obj.get(keys.python) is not None:
        parts.python = python_state(obj[keys.python], f"{where}.{keys.python}")
    if keys.numpy and obj.get(keys.numpy) is not None:
        other = _other_bit_generator(obj[keys.numpy])
        if other is not None:  # left out, as capture() leaves it out: restore says so
            parts.meta["numpy_generator"] = other
        else:
            parts.numpy = _numpy_entry(obj[keys.numpy], f"{where}.{keys.numpy}")
    if keys.cpu and obj.get(keys.cpu) is not None:
        parts.torch_cpu = cpu_state(obj[keys.cpu], f"{where}.{keys.cpu}")
    if keys.cuda:
        parts.cuda = _devices(obj.get(keys.cuda), f"{where}.{keys.cuda}")
    if keys.xpu and obj.get(keys.xpu) is not None:
        value = obj[keys.xpu]
        listed = list(value) if isinstance(value, (list, tuple)) else [value]
        parts.xpu = [byte_state(v, f"{where}.{keys.xpu}[{i}]") for i, v in enumerate(listed)]
    if keys.mps and obj.get(keys.mps) is not None:
        parts.mps = byte_state(obj[keys.mps], f"{where}.{keys.mps}")
    return parts


def _find(obj: Any, path: str, depth: int, found: list[tuple[str, Any, str]],
          seen: set[int]) -> None:  # fmt: skip
    """Each mapping visited once (a dict holding itself, or one dict under many keys, is one
    place, not an exponential number of paths); keys shown bounded (they come from the file)."""
    if not isinstance(obj, Mapping) or depth > _SEARCH_DEPTH or id(obj) in seen:
        return
    seen.add(id(obj))
    if is_state(obj) or is_file(obj) or lacks_format(obj):
        found.append((path, obj, "compatshim"))
        return
    layout = layout_of(obj)
    if layout is not None:
        found.append((path, obj, layout))
        return
    for key, value in obj.items():
        if isinstance(value, Mapping) and id(value) not in seen:
            _find(value, f"{path}[{short(key)}]", depth + 1, found, seen)


def single_rank_file(parts: Parts, source: str, saved_rank: int | None) -> dict[str, Any]:
    return make_file([to_state(parts)], source=source, world_size=None, saved_rank=saved_rank)


def to_file(obj: Any, *, saved_rank: int | None = None, what: str = "the object") -> dict[str, Any]:
    """A compatshim file dict for ``obj``: compatshim's own, or a known layout anywhere inside."""
    found: list[tuple[str, Any, str]] = []
    _find(obj, "", 0, found, set())
    if not found:
        top = (
            sorted(short(k) for k in list(obj)[:50])[:12]
            if isinstance(obj, Mapping)
            else short(obj)
        )
        raise RNGStateError(
            f"no RNG state found in {what} (top level: {top}); looked for compatshim's own "
            f"format and these layouts, up to {_SEARCH_DEPTH} dicts deep: {describe_layouts()}"
        )
    if len(found) > 1:
        paths = ", ".join(f"{p or '<top>'} ({layout})" for p, _, layout in found[:12])
        paths += f" and {len(found) - 12} more" if len(found) > 12 else ""
        raise RNGStateError(f"several RNG states in {what}: {paths}; pass the one you mean")
    path, inner, layout = found[0]
    where = f"state{path}"
    if layout == "compatshim" and lacks_format(inner):
        at = f" at {where}" if path else ""
        raise RNGStateError(
            f"the RNG state{at} lacks its 'format' key, which compatshim.rng.capture() and "
            f"save() write ({STATE_FORMAT!r} in a state, {FILE_FORMAT!r} in a saved file); "
            "pass the dict as they wrote it"
        )
    if is_file(inner):
        check_file_header(inner)  # before read() rebuilds it as a version 1 file
        return dict(inner)
    if layout == "compatshim":
        from .state import parse_state

        parts = parse_state(inner, where)
        rank = captured_position(parts)[0]
        return single_rank_file(parts, "compatshim", saved_rank if rank is None else rank)
    return single_rank_file(convert(inner, layout, where), layout, saved_rank)


def merge_ranks(
    files: Sequence[dict[str, Any]], source: str, names: Sequence[str]
) -> dict[str, Any]:
    """One file dict from per-rank files 0..N-1 (transformers, accelerate checkpoints), named
    ``names``. A file of every rank (what ``compatshim.rng.save`` writes) is taken whole when
    it is the only one; beside others, or holding another rank than its name says, it is
    refused: keeping its first rank gave every rank rank 0's stream."""
    lone = files[0].get("ranks") if len(files) == 1 else None
    if isinstance(lone, list) and len(lone) > 1:
        return files[0]
    for rank, (found, name) in enumerate(zip(files, names)):
        ranks = found.get("ranks")
        if not isinstance(ranks, list) or len(ranks) != 1:
            count = len(ranks) if isinstance(ranks, list) else short(ranks)
            raise RNGStateError(
                f"{short(name, 80)} holds {count} rank states, where a file of a folder of "
                "per-rank files holds one (a file compatshim.rng.save wrote for the whole run "
                "is read alone): pass the path of the file you mean"
            )
        saved = found.get("saved_rank")
        if saved is None:  # rng.save(state=...) of one rank: the rank its capture() recorded
            meta = ranks[0].get("meta") if isinstance(ranks[0], Mapping) else None
            saved = meta.get("rank") if isinstance(meta, Mapping) else None
            saved = saved if type(saved) is int else None
        if saved is not None and saved != rank:
            raise RNGStateError(
                f"{short(name, 80)} holds the state rank {saved} captured, where its name says "
                f"rank {rank}: rename the files to the ranks that saved them"
            )
    return make_file([f["ranks"][0] for f in files], source=source, world_size=len(files))


def describe_layouts() -> str:
    return "; ".join(f"{name}: {{{', '.join(keys.keys())}}}" for name, keys in LAYOUTS.items())
