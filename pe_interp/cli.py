"""The ``pe-interp`` command line: one sub-command per module in :mod:`pe_interp.commands`."""

from __future__ import annotations

import argparse
import importlib
import sys

# Each module has add_parser(subparsers), and its parsers set_defaults(run=...).
COMMANDS = ["train", "ablate", "patch", "decompose", "reproduce", "sweep"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pe-interp", description="Train and probe transformers with pluggable positional encodings."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"pe_interp.commands.{name}")
        except ModuleNotFoundError as err:
            if err.name == f"pe_interp.commands.{name}":
                continue  # not built yet
            raise
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = getattr(args, "run", None)
    if handler is None:  # a module that sets run only on its sub-parsers
        handler = args.func
    try:
        return int(handler(args) or 0)
    except (ValueError, FileNotFoundError) as err:
        print(f"pe-interp {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"pe-interp {args.command}: interrupted; rerun with --resume to continue", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
