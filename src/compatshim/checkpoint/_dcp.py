"""The pickle handlers for torch.distributed.checkpoint (DCP) ``.metadata`` classes.

torch writes a DCP folder's ``.metadata`` with plain ``pickle.dump`` and reads it
with ``pickle.load`` (any global, any code). Here it is read by ``load``'s machine
with the DCP rows of the allowlist: the dataclasses are filled field by field,
``TensorProperties``' tuple state is checked here instead of its ``__setstate__``
running, and a ``torch.layout`` comes from a fixed set of names. Reading a
folder (the file, its summary for ``inspect``) is ``_dcp_folder``'s.
"""

from __future__ import annotations

import enum
from typing import Any

from ._limits import check_shape
from .errors import CheckpointError

_TENSOR_PROPERTIES = (
    "torch.distributed.checkpoint.metadata.TensorProperties",
    "torch.distributed._shard.sharded_tensor.metadata.TensorProperties",
)
_ENCODINGS = {"_MEM_FORMAT_ENCODING", "MEM_FORMAT_ENCODING"}
_MEMORY_FORMATS = ("contiguous_format", "channels_last", "preserve_format")  # by encoding value
_LAYOUTS = frozenset(
    ("strided", "sparse_coo", "sparse_csr", "sparse_csc", "sparse_bsr", "sparse_bsc", "_mkldnn")
)


def layout(args: tuple[Any, ...]) -> Any:
    """``torch.serialization._get_layout(name)``: torch's own layout object of that name."""
    import torch

    name = args[0] if len(args) == 1 else None
    if type(name) is not str or not name.startswith("torch.") or name[6:] not in _LAYOUTS:
        raise CheckpointError("torch.serialization._get_layout: not a known torch.layout name")
    found = vars(torch).get(name[6:])
    if type(found) is not torch.layout:
        raise CheckpointError(f"torch.serialization._get_layout: {name} is not a layout here")
    return found


def build_tensor_properties(inst: Any, state: Any) -> None:
    """BUILD for ``TensorProperties``: what its ``__setstate__`` sets, from checked fields."""
    import torch

    if type(state) is not tuple or len(state) not in (5, 6):
        raise CheckpointError("TensorProperties state is not a tuple of 5 or 6 fields")
    dtype, kind, requires_grad, encoding, pin_memory = state[:5]
    strides = state[5] if len(state) == 6 else None
    if (
        type(dtype) is not torch.dtype
        or type(kind) is not torch.layout
        or type(requires_grad) is not bool
        or type(pin_memory) is not bool
        or not isinstance(encoding, enum.Enum)
        or type(encoding).__name__ not in _ENCODINGS
        or encoding.value not in (0, 1, 2)
    ):
        raise CheckpointError("TensorProperties state holds an unexpected field")
    if strides is not None:
        check_shape(strides, "TensorProperties", "strides")
    known = getattr(type(inst), "__dataclass_fields__", {})
    if strides is not None and "strides" not in known:
        raise CheckpointError(
            "TensorProperties state holds strides (a .metadata written by a newer torch, "
            f"2.14+); torch {torch.__version__}'s TensorProperties has no strides field, so "
            "this torch cannot read it (its own pickle.load fails on it too)"
        )
    fields = {
        "dtype": dtype,
        "layout": kind,
        "requires_grad": requires_grad,
        "memory_format": getattr(torch, _MEMORY_FORMATS[encoding.value]),
        "pin_memory": pin_memory,
    }
    if "strides" in known:
        fields["strides"] = strides
    object.__getattribute__(inst, "__dict__").update(fields)


BUILDERS = {name: build_tensor_properties for name in _TENSOR_PROPERTIES}
"""BUILD handlers by allowlist name, for classes whose state is not a dict of fields."""
