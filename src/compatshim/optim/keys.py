"""Param-group keys torch.optim added across releases, and how a release without them behaved.

Measured with each optimizer's ``param_groups[0]`` on torch 2.1.2, 2.4.1 and
2.15.0 (no key was removed in that span):

- 2.1 -> 2.4: ``capturable`` (ASGD, Adadelta, Adamax, RAdam, RMSprop, Rprop),
  ``fused`` (Adagrad, SGD), ``maximize`` (NAdam, RAdam),
  ``decoupled_weight_decay`` (RAdam);
- 2.4 -> 2.15: ``decoupled_weight_decay`` (Adam, AdamW), ``maximize`` (LBFGS).

A release that lacked a key behaved as the key's "off" value: no capturable or
differentiable graph, no fused or forced foreach kernel, minimising, and weight
decay coupled into the gradient, except AdamW, which was always decoupled.

LR schedulers save their whole ``__dict__``; measured with every scheduler in
``tests/dcpresume/sched_job.py`` (LambdaLR, StepLR, SequentialLR, ChainedScheduler
and their inner ones) on torch 2.2.2, 2.4.1, 2.8.0, 2.11.0 and 2.15.0, two keys
differ, and only between 2.4.1 and 2.8.0:

- ``_is_initial`` (2.8+, on every scheduler whose constructor stepped it: not on a
  SequentialLR's or ChainedScheduler's own state). torch sets it True only while
  the constructor's first step runs and back to False when that step ends, so
  every state a scheduler can hand to ``state_dict()`` holds False; a release
  without the key stepped a restored scheduler as a non-initial step, which is
  what False means.
- ``verbose`` (up to 2.4.1 at least, gone in 2.8.0): whether ``step()`` printed
  the new learning rate. A release without the key never prints, and a scheduler
  built with the default (``verbose="deprecated"``) holds False.

``ReduceLROnPlateau`` (not in ``sched_job``; ``tests/dcpresume/test_sched_keys.py``): 2.8.0+
save ``default_min_lr``, 2.2.2 does not: the single ``min_lr`` that 2.8+ spreads over param
groups added after construction, None where ``min_lr`` was a list (a changed number of groups
then raises). A release without it kept ``min_lrs`` as built, so a state without it means None.

2.2.2's ``ReduceLROnPlateau`` set ``_last_lr`` in ``step()``, 2.4.1+ when built: its state
saved before the first step (``last_epoch`` 0) lacks it, and the lrs it had not yet changed
stand for it (the running scheduler's as built; ``compatshim.optim._unstepped_plateau``).

``CyclicLR(cycle_momentum=True)`` (not in ``sched_job``): 2.8.0+ save ``use_beta1`` (whether
it cycles Adam's ``betas[0]`` rather than ``momentum``); 2.2.2's CyclicLR cycled ``momentum``
only (an optimizer without it was refused), so a state without it means False.

``OneCycleLR`` (not in ``sched_job``; ``tests/dcpresume/test_edge_state.py``): 2.2.2
keeps the bound ``anneal_func`` in its state, 2.5.1 and 2.15.0 the strategy's name,
``_anneal_func_type``. A state with the name loads into 2.2 with the running
scheduler's own method where the two agree (``compatshim.optim._fix_scheduler``).
"""

from __future__ import annotations

from typing import Any

# key -> the value a release without the key behaved as
OLD_BEHAVIOUR: dict[str, Any] = {
    "capturable": False,
    "differentiable": False,
    "foreach": None,
    "fused": None,
    "maximize": False,
    "decoupled_weight_decay": False,
}
# per optimizer class, where the class behaved otherwise
OLD_BEHAVIOUR_BY_CLASS: dict[str, dict[str, Any]] = {
    "AdamW": {"decoupled_weight_decay": True},
}


# LR-scheduler state keys some releases have and others lack -> what a state without them means
SCHEDULER_KEYS: dict[str, Any] = {
    "_is_initial": False,
    "verbose": False,
    "default_min_lr": None,
    "use_beta1": False,
}


def old_value(optimizer_class: str, key: str) -> Any:
    """What a release without ``key`` behaved as, for an optimizer of this class name."""
    return OLD_BEHAVIOUR_BY_CLASS.get(optimizer_class, {}).get(key, OLD_BEHAVIOUR[key])
