"""Bounded adapters for ``torch.distributed`` names that older releases spell differently.

Imported only by the ``removed-names`` alias of ``torch.distributed`` (torch is
already imported then); see :mod:`compatshim.aliases.table` for the releases.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._engine.patching import mark, ours, wrapping
from . import needed, note_use
from .table import TABLE

if TYPE_CHECKING:
    from types import ModuleType

    from .._engine.patching import Patcher
    from .table import Alias

__all__ = ["apply_weights_only", "gather_single", "keyword_missing"]


def gather_single(
    tensor: Any,
    gather_tensor: Any = None,
    dst: int | None = None,
    group: Any = None,
    async_op: bool = False,
    group_dst: int | None = None,
) -> Any:
    """torch 2.14's ``gather_single`` on torch < 2.14: ``gather`` into views of one tensor.

    Same arguments and checks as torch 2.14 (``gather_tensor`` only on the
    destination, contiguous, ``world_size * tensor.numel()`` elements, either
    flat or stacked); the ranks' contributions land in ``gather_tensor`` in
    rank order. It runs ``torch.distributed.gather`` with a list of views of
    ``gather_tensor``, so the data moves as ``gather`` moves it.
    """
    import torch.distributed as dist

    if dst is not None and group_dst is not None:
        raise ValueError("Cannot specify both dst and group_dst")
    kwargs: dict[str, Any] = {"group": group, "async_op": async_op}
    if group_dst is not None:
        kwargs["group_dst"] = group_dst
        destination = group_dst
    else:
        kwargs["dst"] = 0 if dst is None else dst
        destination = kwargs["dst"] if group is None else dist.get_group_rank(group, kwargs["dst"])
    gather_list = None
    if dist.get_rank(group) == destination:
        if gather_tensor is None:
            raise ValueError("gather_tensor must be specified on the destination rank")
        if not gather_tensor.is_contiguous():
            raise ValueError("gather_tensor must be contiguous")
        world = dist.get_world_size(group)
        if gather_tensor.numel() != world * tensor.numel():
            raise ValueError(
                f"gather_tensor has {gather_tensor.numel()} elements; expected "
                f"world_size * tensor.numel() = {world * tensor.numel()}"
            )
        if gather_tensor.dtype != tensor.dtype:
            raise ValueError(
                f"gather_tensor dtype {gather_tensor.dtype} differs from tensor dtype "
                f"{tensor.dtype}"
            )
        gather_list = list(gather_tensor.view(world, *tensor.shape).unbind(0))
    return dist.gather(tensor, gather_list, **kwargs)


# -- weights_only= on the object collectives (torch < 2.14) ------------------------------------
_UNSET: Any = object()
_ZIP_MAGIC = b"PK\x03\x04"  # torch.save's format; a pickle (protocol >= 2) starts with b"\x80"
_mode: Any = None  # a ContextVar, made on first use (no contextvars import at start-up)


def _weights_only_mode() -> Any:
    global _mode
    if _mode is None:
        from contextvars import ContextVar

        _mode = ContextVar("compatshim_weights_only", default=None)
    return _mode


def _disagree(mine: bool) -> RuntimeError:
    theirs = not mine
    return RuntimeError(
        f"object collective: this rank passed weights_only={mine} but the rank that sent this "
        f"object passed weights_only={theirs}; all ranks must pass the same value "
        "(compatshim's weights_only= for torch < 2.14)"
    )


def _object_to_tensor(original: Any, patcher: Patcher) -> Any:
    def object_to_tensor(obj: Any, device: Any, *rest: Any) -> Any:  # rest: group (2.2+)
        # the mode, not patcher.live: only a collective of ours that was live when called sets
        # it, and a revert landing mid-call must not turn its weights_only=True into a pickle
        if not _weights_only_mode().get():
            return original(obj, device, *rest)
        import io

        import torch

        buffer = io.BytesIO()
        torch.save(obj, buffer)
        data = bytearray(buffer.getvalue())
        byte_tensor = torch.frombuffer(data, dtype=torch.uint8).clone().to(device)
        return byte_tensor, torch.LongTensor([byte_tensor.numel()]).to(device)

    return ours(mark(object_to_tensor, __wrapped__=original), original, patcher)


def _tensor_to_object(original: Any, patcher: Patcher) -> Any:
    def tensor_to_object(tensor: Any, tensor_size: Any, *rest: Any) -> Any:
        mode = _weights_only_mode().get()  # set by a collective of ours, live when called
        if mode is None and not patcher.live:
            return original(tensor, tensor_size, *rest)
        weights_only = bool(mode)
        head = bytes(tensor[: len(_ZIP_MAGIC)].cpu().tolist())
        if (head == _ZIP_MAGIC) != weights_only:
            raise _disagree(weights_only)
        if not weights_only:
            return original(tensor, tensor_size, *rest)
        import io
        import traceback

        import torch

        data = tensor.cpu().numpy().tobytes()[: int(tensor_size)]
        import builtins

        # what torch 2.14 allow-lists for object collectives (exceptions travel as errors)
        safe = [
            t
            for t in vars(builtins).values()
            if isinstance(t, type) and issubclass(t, BaseException)
        ] + [traceback.StackSummary, traceback.FrameSummary]
        scoped = getattr(torch.serialization, "safe_globals", None)
        if scoped is None:
            return torch.load(io.BytesIO(data), weights_only=True)
        with scoped(safe):
            return torch.load(io.BytesIO(data), weights_only=True)

    return ours(mark(tensor_to_object, __wrapped__=original), original, patcher)


def _accepting_weights_only(original: Any, on_use: Any, patcher: Patcher) -> Any:
    import functools

    @functools.wraps(original)
    def collective(*args: Any, weights_only: bool = _UNSET, **kwargs: Any) -> Any:
        if not patcher.live:  # reverted, still held by a library that wrapped it: torch's call
            if weights_only is not _UNSET:
                kwargs["weights_only"] = weights_only  # torch's own TypeError
            return original(*args, **kwargs)
        if weights_only is _UNSET:
            weights_only = False
        else:
            on_use()
        if not isinstance(weights_only, bool):
            raise TypeError(f"weights_only must be a bool, got {type(weights_only).__name__}")
        mode = _weights_only_mode()
        token = mode.set(weights_only)
        try:
            return original(*args, **kwargs)
        finally:
            mode.reset(token)

    ours(collective, original, patcher)
    try:  # inspect.signature shows weights_only, as on torch 2.14 (code probes for it)
        import inspect

        signature = _signature(original)
        keyword = inspect.Parameter(
            "weights_only", inspect.Parameter.KEYWORD_ONLY, default=False, annotation=bool
        )
        params = [p for p in signature.parameters.values() if p.kind != p.VAR_KEYWORD]
        mark(collective, __signature__=signature.replace(parameters=[*params, keyword]))
    except (TypeError, ValueError):
        pass
    return collective


_signatures: dict[Any, Any] = {}  # function -> its signature (probe and apply both ask)


def _signature(function: Any) -> Any:
    """``inspect.signature(function)``, once per function object."""
    found = _signatures.get(function)
    if found is None:
        import inspect

        found = _signatures[function] = inspect.signature(function)
    return found


def lacks_weights_only(function: Any) -> bool:
    """Whether ``function`` takes no ``weights_only`` and is not our wrapper in force. A
    retired wrapper of ours is judged by the function under it, and so is another library's
    ``functools.wraps`` wrapper of ours: it carries our signature, with ``weights_only``."""
    for _ in range(8):  # a chain of wrappers
        under = wrapping(function)
        if under is None:
            return False  # ours, in force
        if under is function and hasattr(function, "__compatshim_patcher__"):
            under = getattr(function, "__wrapped__", None)  # a library's, copying our marks
        if under is function:
            break
        function = under
    try:
        return "weights_only" not in _signature(function).parameters
    except (TypeError, ValueError):
        return False


def keyword_missing(module: ModuleType) -> dict[str, Alias]:
    """The object collectives of ``module`` (``torch.distributed``) to give ``weights_only=``."""
    import sys

    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    if c10d is None:
        return {}
    found: dict[str, Alias] = {}
    for alias in TABLE:
        if alias.provides != "keyword" or alias.module != module.__name__:
            continue
        function = vars(c10d).get(alias.function)
        if function is not None and needed(alias) and lacks_weights_only(function):
            found[alias.function] = alias
    return found


def apply_weights_only(module: ModuleType, patcher: Patcher) -> None:
    """Wrap each collective lacking ``weights_only=`` (in ``torch.distributed`` and c10d)."""
    import sys

    entries = keyword_missing(module)
    if not entries:
        return
    c10d = sys.modules["torch.distributed.distributed_c10d"]
    for name, alias in entries.items():
        made: dict[int, Any] = {}  # one wrapper per function (both names hold torch's)
        for owner in (c10d, module):
            current = vars(owner).get(name)
            if current is None or not lacks_weights_only(current):
                continue  # not this module's collective, or ours in force
            if id(current) not in made:
                made[id(current)] = _accepting_weights_only(
                    wrapping(current), lambda alias=alias: note_use(alias), patcher
                )
            patcher.setattr(owner, name, made[id(current)])
    for name, wrap in (
        ("_object_to_tensor", _object_to_tensor),
        ("_tensor_to_object", _tensor_to_object),
    ):
        original = wrapping(vars(c10d)[name])
        if original is not None:
            patcher.setattr(c10d, name, wrap(original, patcher))
