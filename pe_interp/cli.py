"""The ``pe-interp`` command line: an explicit table of sub-commands (:data:`COMMANDS`).

Each entry is a module of :mod:`pe_interp.commands` whose ``add_parser(subparsers)`` adds its
sub-command(s) and sets ``run`` on them. A module that fails to import fails the command line
loudly; nothing is discovered at run time.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

from pe_interp.commands import (
    ablate,
    circuit,
    convert,
    decompose,
    demo,
    dynamics,
    generalize,
    heads,
    patch,
    report,
    reproduce,
    routes,
    show,
    study,
    survey,
    sweep,
    train,
    validate,
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
    routes: ("routes",),
    heads: ("heads",),
    dynamics: ("dynamics",),
    generalize: ("generalize",),
    report: ("report",),
    reproduce: ("reproduce",),
    sweep: ("sweep", "sweep-report"),
    study: ("study",),
    validate: ("validate",),
    convert: ("convert",),
    survey: ("survey",),
}


class Parser(argparse.ArgumentParser):
    """An argparse parser whose usage errors are one line, like every other error of the CLI
    (argparse's default prints the whole usage first: some 30 lines for ``train``)."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="pe-interp",
        description="Train and probe transformers with pluggable positional encodings.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMANDS:
        module.add_parser(sub)
    return parser


# What an interrupted command says about going on (when the command itself does not say it).
RESUME_HINT = {
    "train": "rerun the same command with --resume to continue from the last checkpoint",
    "sweep": "rerun the same command to resume (finished cells are kept; running ones go on from their checkpoints)",
    "reproduce": "rerun the same command to resume (finished cells are kept)",
    "demo": "rerun the same command to resume (finished cells are kept)",
}


def main(argv: list[str] | None = None) -> int:
    from pe_interp.util import interrupts

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        with (
            interrupts.sigterm_raises()
        ):  # SIGTERM stops like Ctrl-C: locks released, nothing half-written
            return int(args.run(args) or 0)
    except (ValueError, FileNotFoundError) as err:
        print(f"pe-interp {args.command}: error: {err}", file=sys.stderr)
        return 2
    except (
        OSError
    ) as err:  # a file where a directory goes, a read-only disk, no permission: one line
        where = f"{err.filename}: " if err.filename else ""
        print(f"pe-interp {args.command}: error: {where}{err.strerror or err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as err:
        signum = getattr(err, "signum", signal.SIGINT)
        said = str(err) or f"interrupted by {interrupts.signal_name(signum)}"
        hint = RESUME_HINT.get(
            args.command,
            "nothing half-written was kept (results are written whole); rerun the command",
        )
        print(
            f"pe-interp {args.command}: {said}"
            + ("" if "rerun" in said or "resume" in said else f"; {hint}"),
            file=sys.stderr,
        )
        return interrupts.exit_code(signum)
    except Exception as err:  # a bug, not a bad input: still one line, no traceback (status 1)
        if os.environ.get("PE_INTERP_TRACEBACK"):
            raise
        first = str(err).splitlines()[0] if str(err) else ""
        print(
            f"pe-interp {args.command}: internal error: {type(err).__name__}: {first} (a bug, please report it; "
            "PE_INTERP_TRACEBACK=1 shows the traceback)",
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())
