"""Ranks build models with different parameter shapes (a width read from per-rank config).

Without compatshim DDP fails at once with a message about parameter sizes that
names neither the parameter nor the ranks.
"""

from __future__ import annotations

from _common import Net, make_fabric


def main() -> None:
    fabric = make_fabric()
    fabric.launch()
    width = 8 if fabric.global_rank == 0 else 12
    fabric.setup_module(Net(width))  # <- shapes-site
    print(f"rank {fabric.global_rank} finished")


if __name__ == "__main__":
    main()
