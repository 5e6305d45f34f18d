"""launch() inside an object only the main process builds ("evaluate on rank 0 only").

Fabric re-executes this script for rank 1 with LOCAL_RANK=1; that copy never
builds the Evaluator, never calls launch(), and exits 0. Rank 0 waits in the
rendezvous for it forever (torch's 30-minute timeout), printing nothing.
"""

from __future__ import annotations

import os

from _common import Net, make_fabric


class Evaluator:
    def __init__(self) -> None:
        self.fabric = make_fabric()
        self.fabric.launch()  # <- launch-site
        self.model = self.fabric.setup_module(Net())


def main() -> None:
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:  # "evaluate on the main process only"
        Evaluator()
    print("child done without launching")


if __name__ == "__main__":
    main()
