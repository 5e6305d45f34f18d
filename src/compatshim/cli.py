"""Command line: ``compatshim doctor`` (also ``python -m compatshim doctor``)."""

from __future__ import annotations

import argparse
from typing import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="compatshim", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    doctor = commands.add_parser(
        "doctor", help="report installed frameworks, known breakages and whether they are fixed"
    )
    doctor.add_argument("--json", action="store_true", help="machine-readable output")
    doctor.add_argument(
        "--timeout", type=float, default=None, help="seconds allowed for the live probes"
    )
    inspect = commands.add_parser(
        "inspect", help="what a checkpoint needs and holds, and whether compatshim can load it"
    )
    inspect.add_argument(
        "file", help="a torch.save file, pickle, safetensors file or DCP checkpoint folder"
    )
    inspect.add_argument("--json", action="store_true", help="machine-readable output")
    args = parser.parse_args(argv)
    if args.command == "inspect":
        from .checkpoint.report import main as inspect_main

        return inspect_main(args.file, as_json=args.json)
    from . import doctor as doctor_module

    return doctor_module.main(as_json=args.json, timeout=args.timeout)
