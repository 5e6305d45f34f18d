"""The patch catalogue: every patch's declaration in one table; its code in its own module.

A row says what the patch is for, which distribution and releases it targets,
and which modules' import triggers it. Its probe and fix (``probe(module)``,
``apply(module, patcher)``, and optionally ``confirm(module)``, a cheap check
that the fix is in place where probing through the fix would be costly inside
the user's import) live in ``compatshim/patches/<name>.py`` (dashes as
underscores), whose docstring reads top to bottom: what breaks, which versions,
detection, fix, revert. That module is imported only when a target module is
imported, so ``install()`` at start-up imports this table and nothing else:
its cost does not grow with the catalogue.

To support a new release: widen ``tested`` here and add the pin file in
``matrix/``. To add a patch: one row here and its module (and its tests in
``tests/<family>/test_patch_<module>.py``).
"""

from __future__ import annotations

from .._engine.patch import Patch

CATALOGUE: tuple[Patch, ...] = (
    Patch(
        name="torch-processgroup-copy",
        distribution="torch",
        requires=">=2.0",
        tested=">=2.1,<=2.15.0",
        targets=("torch.distributed",),
        description=(
            "copy.deepcopy shares ProcessGroups instead of failing; pickle/torch.save re-bind "
            "them on load to the group with the same global ranks"
        ),
    ),
    Patch(
        name="nuscenes-dict-views",
        distribution="nuscenes-devkit",
        requires="",
        tested=">=1.1.11,<=1.2.0",
        # the modules of nuscenes_dict_views.AFFECTED
        targets=("nuscenes.eval.detection.data_classes", "nuscenes.eval.panoptic.evaluate"),
        description=(
            "devkit objects storing dict views (DetectionConfig.class_names, "
            "NuScenesPanopticEval.things/stuff) become picklable and deep-copyable"
        ),
    ),
    Patch(
        name="lightning-fabric-desync",
        distribution="lightning",
        requires=">=2.4",
        tested=">=2.4,<=2.6.6",
        targets=("lightning.fabric.fabric", "lightning_fabric.fabric"),
        target_distributions={"lightning_fabric.fabric": "lightning-fabric"},
        description="Fabric ranks out of step: a DesyncError report within a timeout, not a hang",
    ),
    Patch(
        name="torch-load-safe-globals",
        distribution="torch",
        requires=">=2.1",
        tested=">=2.1,<2.16",
        targets=("torch",),
        description=(
            "a weights-only torch.load that torch refuses is read again by "
            "compatshim.checkpoint.load (same weights-only guarantees, curated allowlist), so "
            "frameworks resume on torch 2.6+ without weights_only=False; a refusal by both warns"
        ),
    ),
    Patch(
        name="torch-dcp-safe-metadata",
        distribution="torch",
        requires=">=2.1",
        tested=">=2.1,<2.16",
        # the fsspec reader of torch 2.1-2.3 has its own pickle.load (a FileSystemReader from 2.4)
        targets=(
            "torch.distributed.checkpoint.filesystem",
            "torch.distributed.checkpoint._fsspec_filesystem",
            # a refused item names its key and file; DCP's error is compatshim's too
            "torch.distributed.checkpoint.default_planner",
            "torch.distributed.checkpoint.utils",
        ),
        description=(
            "hardened mode (COMPATSHIM_SAFE_LOAD=1) only: a torch.distributed.checkpoint "
            "folder's .metadata, which torch reads with pickle.load, is read by "
            "compatshim.checkpoint's loader (DCP's classes allow-listed); a poisoned one is "
            "refused naming its globals, never run"
        ),
    ),
    Patch(
        name="torch-dcp-metadata-error",
        distribution="torch",
        requires=">=2.1",
        tested=">=2.1,<2.16",
        targets=("torch.distributed.checkpoint.state_dict_loader",),
        description=(
            "a DCP load whose .metadata cannot be read (missing, corrupt, from a newer torch, "
            "refused in hardened mode) says why, as torch 2.12 does, instead of torch "
            "2.9-2.11's bare 'metadata is None'"
        ),
    ),
    Patch(
        name="torch-gloo-reduce-scatter-op",
        distribution="torch",
        requires=">=2.2,<2.9",
        tested=">=2.8,<2.9",
        targets=("torch.distributed",),
        description=(
            "reduce_scatter_tensor on a gloo group applies its ReduceOp instead of summing "
            "(pytorch 162338): AVG is SUM then a divide by the group size, so FSDP2 on CPU "
            "averages its gradients; MIN/MAX/PRODUCT/bitwise go through all_reduce"
        ),
    ),
    Patch(
        name="numpy-core-names",
        distribution="numpy",
        requires=">=1.17",
        tested=">=1.24,<=2.5.5",
        targets=("numpy",),
        description=(
            "pickles naming numpy._core.* load under numpy 1.x, and numpy.core.* ones load "
            "without warnings under numpy 2 (same objects; torch's weights-only allowlist takes "
            "both names); numpy 2's Generator/RandomState/bit generator pickles load under "
            "numpy 1.x"
        ),
    ),
    Patch(
        name="numpy-load-hardened",
        distribution="numpy",
        requires=">=1.17",
        tested=">=1.24,<=2.5.5",
        # read_array and load, wherever numpy defines them (numpy.lib._*_impl from 2.0)
        targets=("numpy.lib.format", "numpy"),
        description=(
            "hardened mode (COMPATSHIM_SAFE_LOAD=1) only: numpy.load(allow_pickle=True) "
            "unpickles object arrays (.npy, .npz) and pickle files with compatshim.checkpoint's "
            "loader (plain object arrays admitted); a hostile pickle is refused naming its "
            "globals, never run; numpy's .npy header limit stays with allow_pickle=True"
        ),
    ),
    Patch(
        name="multiprocessing-pickle-paths",
        distribution="python",
        requires=">=3.9",
        tested=">=3.9,<3.16",
        targets=("multiprocessing.reduction",),
        description=(
            "a child process (spawn/forkserver DataLoader worker, mp.spawn rank) whose arguments "
            "cannot be pickled fails with the same error plus one line naming the attribute paths "
            "and the compatshim fix for each"
        ),
    ),
    Patch(
        name="removed-names",
        distribution="compatshim",
        requires="",  # each entry is gated by its own versions (compatshim.aliases.table)
        tested="",
        # "compatshim": decided at install() (module aliases); then the modules named by
        # compatshim.aliases.table.ATTRIBUTE_MODULES, gated by their own distribution
        targets=("compatshim", "numpy", "torch.distributed"),
        target_distributions={"numpy": "numpy", "torch.distributed": "torch"},
        description=(
            "removed or renamed names (pkg_resources, torch._six, np.row_stack, np.float, "
            "dist.all_gather_single, ...) provided where missing; see compatshim.aliases.table"
        ),
    ),
)
