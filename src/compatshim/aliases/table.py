"""Every removed or renamed name compatshim provides, in one table a reader can audit.

Each :class:`Alias` is either ``identical`` (the name is bound to the very
object it names on the releases that still have it: ``alias is target``) or a
bounded ``adapter`` (compatshim code with the documented subset of the old
behaviour; anything outside it raises an error that names the missing name and
the caller). An entry is provided only

- when the installed ``distribution`` is in ``needs`` (the releases that lack
  the name; read from metadata, never by importing), and
- where the real name is absent: a module only when no other finder on
  ``sys.meta_path`` (``PathFinder`` included) can find it, an attribute only
  when the module neither has it nor answers for it in its own ``__getattr__``,
  a keyword (``weights_only=`` of the object collectives) only when the
  function's signature lacks it.

Names whose meaning changed are never aliased: ``np.bool`` (numpy 2: the
numpy bool scalar) and ``np.long`` (numpy 2: C ``long``), and ``np.object`` /
``np.str``, which numpy 1.24-2.5 reserve for its own scalars (their
``__getattr__`` warns "In the future `np.object` will be defined as the
corresponding NumPy scalar"). Providing is silent; each use is recorded
(:func:`compatshim.decisions.note_use`) and listed by ``status()`` under the
``removed-names`` patch, so users can migrate and retire the alias.

The ``evidence`` column says what was read to write the entry: the released
wheels themselves, not release notes.
"""

from __future__ import annotations

TYPE_CHECKING = False  # no ``typing`` import at run time (start-up path)
if TYPE_CHECKING:
    from typing import Literal

    Kind = Literal["identical", "adapter"]
    Provides = Literal["module", "attribute", "keyword"]


class Alias:
    """One row of the table (see the module docstring for the columns)."""

    __slots__ = (
        "distribution",
        "evidence",
        "kind",
        "name",
        "needs",
        "provides",
        "target",
        "when_not_installed",
    )

    def __init__(
        self,
        name: str,
        *,
        provides: Provides,
        kind: Kind,
        distribution: str,
        needs: str,
        target: str,
        evidence: str,
        when_not_installed: bool = False,
    ) -> None:
        self.name = name
        self.provides = provides
        self.kind = kind
        self.distribution = distribution
        self.needs = needs
        self.target = target
        self.evidence = evidence
        self.when_not_installed = when_not_installed

    @property
    def module(self) -> str:
        """The module an attribute or keyword lives in (the name itself for a module alias)."""
        if self.provides == "module":
            return self.name
        return self.name.partition("(")[0].rpartition(".")[0]

    @property
    def attribute(self) -> str:
        return self.name.rpartition(".")[2]

    @property
    def function(self) -> str:
        """For a keyword entry ``mod.fn(kw=)``: ``fn``."""
        return self.attribute.partition("(")[0]

    def __repr__(self) -> str:
        return (
            f"<Alias {self.name} ({self.kind} {self.provides}) -> {self.target} "
            f"when {self.distribution}{self.needs}>"
        )


_SHAPE = "numpy/lib/_shape_base_impl.py"

TABLE: tuple[Alias, ...] = (
    # -- modules ---------------------------------------------------------------------------
    Alias(
        "pkg_resources",
        provides="module",
        kind="adapter",
        distribution="setuptools",
        needs=">=82",
        when_not_installed=True,  # it only ever came from setuptools
        target="compatshim.aliases._pkg_resources_subset",
        evidence=(
            "setuptools 82.0.0 wheel (built 2026-02-08) has no pkg_resources/ (81.0.0: 19 files); "
            "lightning 2.3.3 lightning/fabric/__init__.py:41 and lightning/pytorch/__init__.py:37 "
            'call __import__("pkg_resources").declare_namespace(__name__); '
            "lightning-utilities 0.11.3 core/imports.py:14 imports it at top level"
        ),
    ),
    Alias(
        "torch._six",
        provides="module",
        kind="adapter",
        distribution="torch",
        needs=">=2.0",
        target="compatshim.aliases._torch_six",
        evidence=(
            "torch 1.13.1 torch/_six.py defines inf, nan, string_classes, with_metaclass; "
            "no torch/_six.py in the 2.1.2, 2.13.0 and 2.15.0 wheels"
        ),
    ),
    Alias(
        "torchvision.transforms.functional_tensor",
        provides="module",
        kind="identical",
        distribution="torchvision",
        needs=">=0.17",
        target="torchvision.transforms._functional_tensor",
        evidence=(
            "torchvision 0.16.0 transforms/functional_tensor.py is `from "
            "torchvision.transforms._functional_tensor import *` plus a warning; 0.17.0 has only "
            "_functional_tensor.py"
        ),
    ),
    # -- numpy attributes ------------------------------------------------------------------
    Alias(
        "numpy.row_stack",
        provides="attribute",
        kind="identical",
        distribution="numpy",
        needs=">=2.5",
        target="numpy.vstack",
        evidence=(
            f"numpy 2.4.6 {_SHAPE}:607 row_stack(tup, *, dtype, casting) warns, then returns "
            "vstack(...) (its __doc__ is vstack's); numpy 1.x: row_stack = vstack; numpy 2.5.5 "
            "has no row_stack"
        ),
    ),
    Alias(
        "numpy.chararray",
        provides="attribute",
        kind="identical",
        distribution="numpy",
        needs=">=2.5",
        target="numpy.char.chararray",
        evidence=(
            "numpy 1.24.4: chararray's __module__ is numpy (its pickles name numpy.chararray); "
            "numpy 2.4.6 numpy/__init__.py __getattr__ warns for chararray, then returns "
            "numpy.char.chararray; numpy 2.5.5 has no numpy.chararray (numpy.char.chararray stays)"
        ),
    ),
    *(
        Alias(
            f"numpy.{name}",
            provides="attribute",
            kind="identical",
            distribution="numpy",
            needs=">=1.24",
            target=f"builtins.{name}",
            evidence=(
                f"numpy 1.24.4, 1.26.4, 2.0.2, 2.5.5: np.{name} raises AttributeError "
                f"('`np.{name}` was a deprecated alias for the builtin `{name}`') and is not in "
                "numpy.__future_scalars__ (unlike object, str, bool, long)"
            ),
        )
        for name in ("float", "int", "complex")
    ),
    # -- torch.distributed attributes ------------------------------------------------------
    Alias(
        "torch.distributed.all_gather_single",
        provides="attribute",
        kind="identical",
        distribution="torch",
        needs="<2.13",
        target="torch.distributed.all_gather_into_tensor",
        evidence=(
            "torch 2.13.0 and 2.14.0: all_gather_into_tensor(output_tensor, input_tensor, group, "
            "async_op) is deprecated and returns all_gather_single(same arguments); 2.12.1 has "
            "all_gather_into_tensor only"
        ),
    ),
    Alias(
        "torch.distributed.reduce_scatter_single",
        provides="attribute",
        kind="identical",
        distribution="torch",
        needs="<2.13",
        target="torch.distributed.reduce_scatter_tensor",
        evidence=(
            "torch 2.13.0 and 2.14.0: reduce_scatter_tensor(output, input, op, group, async_op) "
            "is deprecated and returns reduce_scatter_single(same arguments); 2.12.1 has "
            "reduce_scatter_tensor only"
        ),
    ),
    Alias(
        "torch.distributed.set_timeout",
        provides="attribute",
        kind="identical",
        distribution="torch",
        needs="<2.14",
        target="torch.distributed.distributed_c10d._set_pg_timeout",
        evidence=(
            "torch 2.14.0 and 2.15.0: set_timeout(timeout, group=None) added; "
            "_set_pg_timeout(timeout, group=None) deprecated and calling it; 2.5.1, 2.12.1 and "
            "2.13.0 have _set_pg_timeout (default timeout of the group's gloo/nccl backends) "
            "only; 2.1.2 has neither, so nothing is provided there"
        ),
    ),
    Alias(
        "torch.distributed.gather_single",
        provides="attribute",
        kind="adapter",
        distribution="torch",
        needs="<2.14",
        target="compatshim.aliases.collectives.gather_single",
        evidence=(
            "torch 2.14.0: gather_single(tensor, gather_tensor=None, dst=None, group=None, "
            "async_op=False, group_dst=None) added (gather into one contiguous tensor of "
            "world_size * tensor.numel() elements on dst); 2.13.0 and 2.12.1 have gather(tensor, "
            "gather_list, dst, group, async_op, group_dst) only"
        ),
    ),
    *(
        Alias(
            f"torch.distributed.{name}(weights_only=)",
            provides="keyword",
            kind="adapter",
            distribution="torch",
            needs="<2.14",
            target="compatshim.aliases.collectives.apply_weights_only",
            evidence=(
                f"torch 2.14.0: {name}(..., weights_only: bool = False): True serialises with "
                "torch.save and loads with torch.load(weights_only=True) (exceptions and "
                "traceback summaries allow-listed), 'All ranks must pass the same value'; "
                f"torch 2.13.0 {name} has no weights_only (a TypeError)"
            ),
        )
        for name in (
            "all_gather_object",
            "gather_object",
            "send_object_list",
            "recv_object_list",
            "broadcast_object_list",
            "scatter_object_list",
        )
    ),
)

#: No entry, and why (claims checked against the released wheels).
NOT_WRITTEN: dict[str, str] = {
    "old torch.distributed names on releases that drop them": (
        "no release drops them: torch 2.15.0 still defines all_gather_into_tensor, "
        "reduce_scatter_tensor and gather_into_tensor (as plain aliases, no warning)"
    ),
    "numpy.object, numpy.str": (
        "numpy 1.24-2.5 list them in __future_scalars__: their meaning is announced to change"
    ),
    "numpy.bool, numpy.long": "numpy 2 defines them with another meaning",
}


class Removed:
    """A name removed upstream that compatshim does not provide, because no alias keeps its
    meaning: the doctor names the break (``distribution`` in ``removed``) and what replaces it."""

    __slots__ = ("distribution", "evidence", "instead", "name", "removed")

    def __init__(
        self, name: str, *, distribution: str, removed: str, instead: str, evidence: str
    ) -> None:
        self.name = name
        self.distribution = distribution
        self.removed = removed
        self.instead = instead
        self.evidence = evidence


#: Removed names with no alias: reported by ``compatshim doctor`` (metadata only, no import).
REMOVED: tuple[Removed, ...] = (
    Removed(
        "transformers.modeling_attn_mask_utils",
        distribution="transformers",
        removed=">=5.24",
        instead=(
            "transformers.masking_utils (create_causal_mask, sdpa_mask, eager_mask, ...: "
            "built from the model config, input embeddings, cache position and cache)"
        ),
        evidence=(
            "transformers 5.23.0 modeling_attn_mask_utils.py: AttentionMaskConverter, "
            "_prepare_4d_causal_attention_mask(_for_sdpa), _prepare_4d_attention_mask(_for_sdpa), "
            "_create_4d_causal_attention_mask, all deprecated ('will be removed in Transformers "
            "v5.10. Please use the new API in transformers.masking_utils'); the 5.24.0 wheel has "
            "no modeling_attn_mask_utils.py and none of those names in any module; "
            "masking_utils's functions take other arguments and return other mask types, so an "
            "alias could keep no name's meaning (compatshim does not ship transformers' code)"
        ),
    ),
)


def entries_for(module: str) -> tuple[Alias, ...]:
    """The attribute aliases that live in ``module``."""
    return tuple(a for a in TABLE if a.provides == "attribute" and a.module == module)


MODULE_ALIASES: tuple[Alias, ...] = tuple(a for a in TABLE if a.provides == "module")
ATTRIBUTE_MODULES: tuple[str, ...] = tuple(
    dict.fromkeys(a.module for a in TABLE if a.provides != "module")
)
