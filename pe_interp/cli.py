"""The ``pe-interp`` command line: an explicit table of sub-commands (:data:`COMMANDS`).

Each entry is a module of :mod:`pe_interp.commands` whose ``add_parser(subparsers)`` adds its
sub-command(s) and sets ``run`` on them. A module that fails to import fails the command line
loudly; nothing is discovered at run time.
"""

from __future__ import annotations

import argparse
import sys

from pe_interp.commands import (
    ablate,
    circuit,
    decompose,
    demo,
    patch,
    report,
    reproduce,
    show,
    sweep,
    train,
)

# module -> the sub-commands it adds, in the order ``pe-interp --help`` lists them
COMMANDS = {
    demo: ("demo",),
    train: ("train", "eval"),
    show: ("show",),
    ablate: ("ablate",),
    patch: ("patch",),
    circuit: ("circuit",),
    decompose: ("decompose",),
    report: ("report",),
    reproduce: ("reproduce",),
    sweep: ("sweep", "sweep-report"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pe-interp", description="Train and probe transformers with pluggable positional encodings."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMANDS:
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except (ValueError, FileNotFoundError) as err:
        print(f"pe-interp {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"pe-interp {args.command}: interrupted; rerun with --resume to continue", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
