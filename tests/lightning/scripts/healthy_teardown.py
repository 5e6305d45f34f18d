"""A healthy run that ends by destroying the process group, then looks for leftovers.

After ``destroy_process_group()`` nothing of compatshim may remain that the
framework's own tests can see: no compatshim thread, no ``sys.excepthook`` of
compatshim's, no ``atexit`` handler added. Each rank prints one ``TEARDOWN``
line; the test compares it with and without compatshim. (Lightning's launcher
leaves its own "child-process-observer" thread, with or without compatshim.)
"""

from __future__ import annotations

import atexit
import sys
import threading

import torch
import torch.distributed
from _common import Net, make_fabric


def state() -> tuple[str, int, set[str]]:
    """sys.excepthook's name, compatshim's atexit handlers still registered, thread names."""
    from compatshim.dist.monitor import get_monitor

    hook = f"{getattr(sys.excepthook, '__module__', '?')}.{sys.excepthook.__qualname__}"
    before = atexit._ncallbacks()
    atexit.unregister(get_monitor()._at_exit)  # a no-op unless it is still registered
    return hook, before - atexit._ncallbacks(), {t.name for t in threading.enumerate()}


def main(devices: int) -> None:
    fabric = make_fabric(devices)
    threads = state()[2]
    fabric.launch()
    model = fabric.setup_module(Net())
    loss = model(torch.ones(2, 4)).sum()
    fabric.backward(loss)
    fabric.all_reduce(loss.detach())
    fabric.barrier()
    while_running = {t.name for t in threading.enumerate()} - threads
    torch.distributed.destroy_process_group()
    after_hook, handlers, after_threads = state()
    left = sorted(after_threads - threads)
    sys.stdout.write(
        f"TEARDOWN rank={fabric.global_rank} excepthook={after_hook} "
        f"compatshim_atexit_handlers={handlers} threads_left={left} "
        f"monitor_ran={'compatshim-dist-monitor' in while_running}\n"
    )
    sys.stdout.flush()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
