"""Tensors rebuilt from the storages the container holds, with every view checked first.

torch's ``_rebuild_*`` functions are never called with the file's arguments:
each is re-implemented here. A view (offset, size, stride) is checked to lie
inside its storage before ``Tensor.set_``; storages come only from the
container reader (``persistent_load``), whose sizes were checked against the
bytes the file holds; hooks must be empty; attribute state is plain names only.
"""

from __future__ import annotations

import collections
import functools
from typing import Any, Callable

from .._text import cut, short
from ._limits import MAX_ITEMS, Quota, check_shape, count
from ._objects import bad, is_dunder
from .errors import CheckpointError, UnsafeCheckpointError, as_well

METADATA_KEYS = {"conj", "neg"}


def _torch() -> Any:
    import torch

    return torch


def typed_storage(untyped: Any, dtype: Any) -> Any:
    """torch.load's wrapper around each storage (what its persistent_load returns)."""
    return _torch().storage.TypedStorage(wrap_storage=untyped, dtype=dtype, _internal=True)


class Tensors:
    """The storages and tensors one load made, so later opcodes can only use those.

    Each tensor made takes a unit of ``quota`` (the load budget's :attr:`Budget.tensors`),
    except a wrapper (a Parameter, a subclass, a sparse tensor) the first time it wraps a
    tensor of this load: what torch.save writes for both, one object to the caller.
    """

    def __init__(self, quota: Quota) -> None:
        self._storages: dict[int, Any] = {}
        self._tensors: dict[int, Any] = {}
        self._dressed: set[int] = set()  # tensors given Python attributes
        self._wrapped: set[int] = set()  # tensors a wrapper already holds
        self._quota = quota

    def add_storage(self, storage: Any) -> Any:
        self._storages[id(storage)] = storage
        return storage

    def storage(self, value: Any, what: str) -> Any:
        if self._storages.get(id(value)) is not value:
            raise CheckpointError(f"{what}: first argument is {short(value)}, not a storage")
        return value

    def add_tensor(self, tensor: Any, wrapping: Any = None) -> Any:
        """``wrapping``: the tensor of this load that ``tensor`` was made around."""
        if wrapping is None or id(wrapping) in self._wrapped:  # a memo reference, again
            self._quota.take()
        else:
            self._wrapped.add(id(wrapping))  # kept alive by _tensors: the id stays its own
        self._tensors[id(tensor)] = tensor
        return tensor

    def tensor(self, value: Any, what: str) -> Any:
        if self._tensors.get(id(value)) is not value:
            raise CheckpointError(f"{what}: data is {short(value)}, not a tensor of this file")
        return value

    def bare(self) -> dict[int, Any]:
        """The tensors this load made without Python attributes: nothing in them to walk."""
        return {key: t for key, t in self._tensors.items() if key not in self._dressed}


def check_view(
    offset: Any, size: Any, stride: Any, storage_items: int, what: str
) -> tuple[int, tuple[int, ...], tuple[int, ...]]:
    """Offset/size/stride as ints whose furthest element lies inside the storage."""
    if type(offset) is not int or offset < 0:
        raise CheckpointError(f"{what}: storage offset is {short(offset)}")
    kinds = (tuple, list, _torch().Size)
    size_t = check_shape(size, what, "size", kinds)
    stride_t = check_shape(stride, what, "stride", kinds)
    if len(size_t) != len(stride_t):
        raise CheckpointError(f"{what}: {len(size_t)} sizes but {len(stride_t)} strides")
    numel = count(size_t, what)
    furthest = offset
    for dim, step in zip(size_t, stride_t):
        furthest += (dim - 1) * step if dim else 0
    if numel and furthest >= storage_items:
        raise CheckpointError(
            f"{what}: a view reaching element {furthest} of a storage of {storage_items} "
            "elements (size/stride/offset larger than the data)"
        )
    return offset, size_t, stride_t


def _hooks_empty(hooks: Any, what: str) -> None:
    if hooks is None:
        return
    if type(hooks) not in (dict, collections.OrderedDict) or hooks:
        raise UnsafeCheckpointError(
            f"{what}: backward hooks in a file refused (hooks are callables)", (f"{what} hooks",)
        )


@functools.cache
def _item_size(dtype: Any) -> int:
    return int(_torch().empty((), dtype=dtype).element_size())


def _rebuild(
    tensors: Tensors,
    storage: Any,
    offset: Any,
    size: Any,
    stride: Any,
    dtype: Any,
    requires_grad: Any,
    hooks: Any,
    metadata: Any,
    what: str,
) -> Any:
    torch = _torch()
    storage = tensors.storage(storage, what)
    if not isinstance(dtype, torch.dtype):
        raise CheckpointError(f"{what}: dtype is {short(dtype)}")
    if type(requires_grad) is not bool:
        raise CheckpointError(f"{what}: requires_grad is {short(requires_grad)}")
    _hooks_empty(hooks, what)
    untyped = storage._untyped_storage if hasattr(storage, "_untyped_storage") else storage
    items = untyped.nbytes() // _item_size(dtype)
    offset, size_t, stride_t = check_view(offset, size, stride, items, what)
    if untyped.device.type == "meta":
        # one meta storage per view: torch < 2.2's set_ shrinks a meta storage to the view it
        # is given, and a shared one would then be too small for the next view (meta holds no
        # data, so nothing is shared that could differ)
        untyped = torch.UntypedStorage(untyped.nbytes(), device="meta")
    tensor = torch.empty((0,), dtype=dtype, device=untyped.device)
    tensor.set_(untyped, offset, size_t, stride_t)
    if requires_grad:
        tensor.requires_grad = True
    if metadata:
        if type(metadata) is not dict or not set(metadata) <= METADATA_KEYS:
            raise CheckpointError(f"{what}: tensor metadata is {short(metadata)}")
        if not all(type(v) is bool for v in metadata.values()):
            raise CheckpointError(f"{what}: tensor metadata values must be bools")
        torch._C._set_tensor_metadata(tensor, metadata)
    # the file's (empty) hooks are not kept: the tensor has None, like any new tensor
    # (torch.load sets an empty dict for old callers; register_hook makes one when needed,
    # and an empty one costs a dict and an autograd pre-hook per tensor)
    return tensors.add_tensor(tensor)


def _storage_dtype(storage: Any) -> Any:
    return storage.dtype


def rebuild_tensor(tensors: Tensors, args: tuple[Any, ...]) -> Any:
    what = "torch._utils._rebuild_tensor"
    if len(args) != 4:
        raise bad(what, args)
    storage = tensors.storage(args[0], what)
    return _rebuild(tensors, storage, *args[1:], _storage_dtype(storage), False, None, None, what)


def rebuild_tensor_v2(tensors: Tensors, args: tuple[Any, ...]) -> Any:
    what = "torch._utils._rebuild_tensor_v2"
    if len(args) not in (6, 7):
        raise bad(what, args)
    storage = tensors.storage(args[0], what)
    offset, size, stride, requires_grad, hooks = args[1:6]
    metadata = args[6] if len(args) == 7 else None
    return _rebuild(
        tensors, storage, offset, size, stride, _storage_dtype(storage), requires_grad, hooks,
        metadata, what,
    )  # fmt: skip


def rebuild_tensor_v3(tensors: Tensors, args: tuple[Any, ...]) -> Any:
    what = "torch._utils._rebuild_tensor_v3"
    if len(args) not in (7, 8):
        raise bad(what, args)
    storage, offset, size, stride, requires_grad, hooks, dtype = args[:7]
    metadata = args[7] if len(args) == 8 else None
    return _rebuild(
        tensors, storage, offset, size, stride, dtype, requires_grad, hooks, metadata, what
    )


def rebuild_meta(tensors: Tensors, args: tuple[Any, ...]) -> Any:
    what = "torch._utils._rebuild_meta_tensor_no_storage"
    torch = _torch()
    if len(args) != 4 or not isinstance(args[0], torch.dtype) or type(args[3]) is not bool:
        raise bad(what, args)
    _, size_t, stride_t = check_view(0, args[1], args[2], MAX_ITEMS, what)
    tensor = torch.empty_strided(size_t, stride_t, dtype=args[0], device="meta")
    if args[3]:
        tensor.requires_grad = True
    return tensors.add_tensor(tensor)


def set_plain_attributes(tensors: Tensors, obj: Any, state: Any, what: str) -> None:
    """Python attributes saved with a tensor/Parameter: plain names not defined by torch."""
    if type(state) is tuple and len(state) == 2:
        if state[1]:
            raise UnsafeCheckpointError(f"{what}: slot state refused", (f"{what} slots",))
        state = state[0]
    if state is None:
        return
    tensors._dressed.add(id(obj))
    if type(state) not in (dict, collections.OrderedDict):
        raise CheckpointError(f"{what}: attribute state is {short(state)}")
    for key in state:
        if type(key) is not str or is_dunder(key) or hasattr(type(obj), key):
            raise UnsafeCheckpointError(
                f"{what}: attribute {short(key)} refused (not a plain attribute name)",
                (f"{what} attribute",),
            )
    for key, value in state.items():
        setattr(obj, key, value)


def rebuild_parameter(tensors: Tensors, args: tuple[Any, ...]) -> Any:
    what = "torch._utils._rebuild_parameter"
    if len(args) != 3 or type(args[1]) is not bool:
        raise bad(what, args)
    data = tensors.tensor(args[0], what)
    _hooks_empty(args[2], what)
    param = _torch().nn.Parameter(data, args[1])
    param._backward_hooks = collections.OrderedDict()
    return tensors.add_tensor(param, data)


def rebuild_parameter_with_state(tensors: Tensors, args: tuple[Any, ...]) -> Any:
    what = "torch._utils._rebuild_parameter_with_state"
    if len(args) != 4:
        raise bad(what, args)
    param = rebuild_parameter(tensors, args[:3])
    set_plain_attributes(tensors, param, args[3], what)
    return param


_COMPRESSED = ("sparse_csr", "sparse_csc", "sparse_bsr", "sparse_bsc")


def rebuild_sparse(
    tensors: Tensors, args: tuple[Any, ...], charge: Callable[[int, str], None]
) -> Any:
    """(layout, (indices..., values, size[, is_coalesced])): torch's constructors with their
    invariants checked, on every release (torch's weights-only load checks them after its load,
    but torch 2.8-2.13 only under ``torch.sparse.check_sparse_tensor_invariants``).

    The check reads every index and value (and sorts a copy of COO indices): that work is
    charged to the load's budget at each use, so views that repeat one element (stride 0)
    or one tensor shared by many sparse tensors cannot make it exceed what the file holds.
    """
    what = "torch._utils._rebuild_sparse_tensor"
    torch = _torch()
    if len(args) != 2 or type(args[1]) is not tuple:
        raise bad(what, args)
    layout, data = args
    make: Callable[[bool], Any]
    if layout is torch.sparse_coo and len(data) in (3, 4):
        parts = indices, values = [tensors.tensor(item, what) for item in data[:2]]
        size = _sparse_size(data[2], what)
        coalesced = data[3] if len(data) == 4 else None
        if coalesced is not None and type(coalesced) is not bool:
            raise bad(what, args)

        def make(check: bool) -> Any:
            return torch.sparse_coo_tensor(
                indices, values, size, check_invariants=check, is_coalesced=coalesced
            )

    elif any(layout is getattr(torch, name) for name in _COMPRESSED) and len(data) == 4:
        parts = compressed, plain, values = [tensors.tensor(item, what) for item in data[:3]]
        size = _sparse_size(data[3], what)

        def make(check: bool) -> Any:
            return torch.sparse_compressed_tensor(
                compressed, plain, values, size, layout=layout, check_invariants=check
            )

    else:
        raise bad(what, args)
    charge(2 * sum(t.numel() * t.element_size() for t in parts), what)
    try:  # on meta there is no data to check, nor to read outside of
        return tensors.add_tensor(make(values.device.type != "meta"), values)
    except (RuntimeError, ValueError, TypeError, IndexError) as exc:  # torch's own words
        text = cut(exc.args[0], 300) if exc.args and type(exc.args[0]) is str else ""
        invalid = as_well(CheckpointError, type(exc))  # torch's type too, as torch raises it
        raise invalid(f"{what}: not a valid sparse tensor ({text})") from None


def _sparse_size(size: Any, what: str) -> tuple[int, ...]:
    return check_shape(size, what, "size", (tuple, _torch().Size))


TensorRebuild = Callable[[Tensors, tuple[Any, ...]], Any]
REBUILDS: dict[str, TensorRebuild] = {
    "torch._utils._rebuild_tensor": rebuild_tensor,
    "torch._utils._rebuild_tensor_v2": rebuild_tensor_v2,
    "torch._utils._rebuild_tensor_v3": rebuild_tensor_v3,
    "torch._utils._rebuild_meta_tensor_no_storage": rebuild_meta,
    "torch._utils._rebuild_parameter": rebuild_parameter,
    "torch._utils._rebuild_parameter_with_state": rebuild_parameter_with_state,
}


def rebuild_from_type_v2(
    tensors: Tensors, args: tuple[Any, ...], rebuild_of: Callable[[Any], TensorRebuild | None]
) -> Any:
    """Tensors with Python attributes: (rebuild function, torch.Tensor, args, attribute state)."""
    what = "torch._tensor._rebuild_from_type_v2"
    torch = _torch()
    if len(args) != 4 or type(args[2]) is not tuple:
        raise bad(what, args)
    func, new_type, inner_args, state = args
    rebuild = rebuild_of(func)
    if rebuild is None:
        raise UnsafeCheckpointError(f"{what}: rebuild function {short(func)} refused", (what,))
    if new_type is not torch.Tensor and new_type is not torch.nn.Parameter:
        name = getattr(new_type, "__qualname__", type(new_type).__name__)
        raise UnsafeCheckpointError(
            f"{what}: tensor subclass {name} refused (only torch.Tensor and Parameter)",
            (f"{what}({name})",),
        )
    tensor = rebuild(tensors, inner_args)
    if type(tensor) is not new_type:
        tensor = tensors.add_tensor(tensor.as_subclass(new_type), tensor)
    set_plain_attributes(tensors, tensor, state, what)
    return tensor


def make_size(_: Any, args: tuple[Any, ...]) -> Any:
    if len(args) != 1:
        raise bad("torch.Size", args)
    torch = _torch()
    return torch.Size(check_shape(args[0], "torch.Size", "dims", (tuple, list, torch.Size)))


def make_device(_: Any, args: tuple[Any, ...]) -> Any:
    if not 1 <= len(args) <= 2 or type(args[0]) is not str or len(args[0]) > 64:
        raise bad("torch.device", args)
    if len(args) == 2 and (type(args[1]) is not int or not 0 <= args[1] < 2**16):
        raise bad("torch.device", args)
    return _torch().device(*args)
