"""A healthy run that ends by destroying the process group, then looks for leftovers.

After ``destroy_process_group()`` nothing of compatshim may remain that the
framework's own tests can see: no compatshim thread, no ``sys.excepthook`` of
compatshim's, no ``atexit`` handler added. Each rank prints one ``TEARDOWN``
line; the test compares it with and without compatshim. (Other threads are
left out: Lightning's launcher runs a "child-process-observer" thread that ends
a few seconds after the child rank does, whenever that is.)
"""

from __future__ import annotations

import atexit
import sys
import threading

import torch
import torch.distributed
from _common import Net, make_fabric


def compatshim_threads() -> list[str]:
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("compatshim"))


def leftovers() -> str:
    """sys.excepthook's name, compatshim's atexit handlers still registered, its threads."""
    from compatshim.desync.monitor import get_monitor

    hook = f"{getattr(sys.excepthook, '__module__', '?')}.{sys.excepthook.__qualname__}"
    before = atexit._ncallbacks()
    atexit.unregister(get_monitor()._at_exit)  # a no-op unless it is still registered
    handlers = before - atexit._ncallbacks()
    return f"excepthook={hook} compatshim_atexit_handlers={handlers} threads={compatshim_threads()}"


def main(devices: int) -> None:
    fabric = make_fabric(devices)
    fabric.launch()
    model = fabric.setup_module(Net())
    loss = model(torch.ones(2, 4)).sum()
    fabric.backward(loss)
    fabric.all_reduce(loss.detach())
    fabric.barrier()
    monitor_ran = bool(compatshim_threads())
    torch.distributed.destroy_process_group()
    sys.stdout.write(
        f"TEARDOWN rank={fabric.global_rank} {leftovers()} monitor_ran={monitor_ran}\n"
    )
    sys.stdout.flush()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
