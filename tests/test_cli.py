"""The command line is an explicit table (``pe_interp.cli.COMMANDS``): every sub-command it
names is there, and nothing else."""

from __future__ import annotations

import pytest

from pe_interp.cli import COMMANDS, build_parser, main


def test_the_parser_has_exactly_the_table_s_commands():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    assert list(sub.choices) == [name for names in COMMANDS.values() for name in names]
    for name, p in sub.choices.items():
        assert callable(p.get_default("run")), name


def test_an_unknown_command_is_an_error(capsys):
    with pytest.raises(SystemExit) as err:
        main(["no-such-command"])
    assert err.value.code == 2 and "invalid choice" in capsys.readouterr().err
