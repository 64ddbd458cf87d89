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
    generalize,
    patch,
    report,
    reproduce,
    show,
    study,
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
    generalize: ("generalize",),
    report: ("report",),
    reproduce: ("reproduce",),
    sweep: ("sweep", "sweep-report"),
    study: ("study",),
}


class Parser(argparse.ArgumentParser):
    """An argparse parser whose usage errors are one line, like every other error of the CLI
    (argparse's default prints the whole usage first: some 30 lines for ``train``)."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
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
    except OSError as err:  # a file where a directory goes, a read-only disk, no permission: one line
        where = f"{err.filename}: " if err.filename else ""
        print(f"pe-interp {args.command}: error: {where}{err.strerror or err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"pe-interp {args.command}: interrupted; rerun with --resume to continue", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
