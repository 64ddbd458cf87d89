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


# ------------------------------------------------------------------------------------------------
# pe-interp train: a flag for every config field, generated from the dataclasses
# ------------------------------------------------------------------------------------------------
def _train_args(*argv: str):
    return build_parser().parse_args(["train", "--out", "RUN", *argv])


def test_every_config_and_task_field_has_a_flag_or_a_reason():
    import dataclasses

    from pe_interp.commands.options import DERIVED, NOT_FLAGS
    from pe_interp.config.model import ModelConfig, TrainConfig
    from pe_interp.tasks import TASKS

    fields = {
        f.name
        for cls in (ModelConfig, TrainConfig, *TASKS.values())
        for f in dataclasses.fields(cls)
    }
    args = _train_args()
    flagged = set(args.setting_names)
    assert fields == flagged | set(NOT_FLAGS), (fields - flagged - set(NOT_FLAGS), flagged - fields)
    assert set(DERIVED) <= flagged and not flagged & set(NOT_FLAGS)
    help_text = build_parser()._subparsers._group_actions[0].choices["train"].format_help()
    for name in (
        "--act-fn",
        "--final-norm",
        "--no-final-norm",
        "--init-mode",
        "--betas",
        "--lr-schedule",
        "--embed-dropout",
        "--max-between",
        "--n-triggers",
        "--ignore-index",
        "--kv-source",
    ):
        assert name in help_text, name
    assert "--n-ctx" not in help_text  # accepted only to say why it cannot be set


def test_flags_build_the_configs_the_api_builds():
    """Every kind of flag (int, float, bool on/off, optional 'none', a pair, a task field, a string
    choice) reaches the same ModelConfig, task and TrainConfig as the same keywords in Python."""
    from pe_interp.commands.train import train_kwargs
    from pe_interp.config.presets import build_run_configs

    argv = [
        "--preset",
        "smoke",
        "--encoding",
        "sinusoidal(layout=concat)+rope(base=500)",
        "--seed",
        "3",
        "--n-layers",
        "3",
        "--act-fn",
        "relu",
        "--no-final-norm",
        "--normalization-type",
        "none",
        "--init-mode",
        "torch",
        "--embed-dropout",
        "0",
        "--dropout",
        "0.1",
        "--no-mask-padding",
        "--betas",
        "0.98",
        "0.9",
        "--lr",
        "1e-4",
        "--lr-schedule",
        "authors",
        "--ignore-index",
        "none",
        "--max-between",
        "5",
        "--distinct-fillers",
        "--d-vocab",
        "40",
    ]
    kwargs = train_kwargs(_train_args(*argv))
    api = dict(
        task="distance",
        encoding="sinusoidal(layout=concat)+rope(base=500)",
        preset="smoke",
        seed=3,
        authors_quirks=False,
        n_layers=3,
        act_fn="relu",
        final_norm=False,
        normalization_type=None,
        init_mode="torch",
        embed_dropout=0.0,
        dropout=0.1,
        mask_padding=False,
        betas=(0.98, 0.9),
        lr=1e-4,
        lr_schedule="authors",
        ignore_index=None,
        max_between=5,
        distinct_fillers=True,
        d_vocab=40,
        device="cpu",
    )
    assert kwargs == api
    m, k, t = build_run_configs(**{n: v for n, v in kwargs.items()})
    assert (m.act_fn, m.final_norm, m.normalization_type, m.init_mode, m.n_layers) == (
        "relu",
        False,
        None,
        "torch",
        3,
    )
    assert m.encoding_name == "sinusoidal(layout=concat)+rope(base=500)" and not m.mask_padding
    assert (
        t.betas == (0.98, 0.9)
        and t.lr_schedule == "authors"
        and k.max_between == 5
        and k.distinct_fillers
    )
    # a flag not given is not passed: the preset's value stands
    assert train_kwargs(_train_args("--preset", "smoke")) == dict(
        task="distance", encoding="rope", preset="smoke", seed=0, authors_quirks=False, device="cpu"
    )


def test_the_recorded_command_recreates_the_run(tmp_path):
    """config.json records the `pe-interp train` command of any run, made from the CLI or the API;
    parsing it gives the configs the run was trained with."""
    import json
    import shlex

    import pe_interp
    from pe_interp.commands.train import train_kwargs
    from pe_interp.config.model import ModelConfig, TrainConfig
    from pe_interp.config.presets import build_run_configs

    pe_interp.train(
        task="count",
        encoding={"name": "alibi", "slopes": "authors"},
        preset="smoke",
        seed=2,
        out=tmp_path / "r",
        progress=False,
        n_layers=1,
        final_norm=False,
        betas=(0.8, 0.9),
        ignore_index=0,
        n_triggers=3,
        epochs=1,
    )
    config = json.loads((tmp_path / "r" / "config.json").read_text())
    words = shlex.split(config["command"])
    assert words[:2] == ["pe-interp", "train"]
    m, k, t = build_run_configs(**train_kwargs(build_parser().parse_args(words[1:])))
    assert m == ModelConfig.from_dict(config["model"]) and t == TrainConfig.from_dict(
        config["train"]
    )
    assert k.to_dict() == config["task"]


def test_show_prints_config_accuracy_verdict_and_files(tmp_path, capsys):
    import pe_interp

    out = tmp_path / "r"
    pe_interp.train(preset="smoke", out=out, progress=False)
    assert main(["show", str(out)]) == 0
    text = capsys.readouterr().out
    for piece in (
        "encoding   rope (multiplicative)",
        "re-create  pe-interp train --task distance --encoding rope",
        "accuracy     held-out",
        "length-only ceiling 44.4%",
        "single-head deposit  not measured",
        "model.safetensors",
        "config.json",
    ):
        assert piece in text, piece
    assert main(["ablate", str(out), "--no-progress", "--n-bootstrap", "50", "--no-figures"]) == 0
    capsys.readouterr()
    assert main(["show", str(out)]) == 0
    text = capsys.readouterr().out
    assert "single-head deposit  no: top L" in text and "→ no single-head deposit" in text
    assert (
        "layer concentration  " in text and "layer 0    top H" in text and "deposits.json" in text
    )


def test_report_writes_a_run_report(tmp_path, capsys):
    import pe_interp

    out = tmp_path / "r"
    pe_interp.train(preset="smoke", out=out, progress=False)
    assert main(["report", str(out)]) == 0
    page = (out / "report.html").read_text()
    assert "Not measured yet" in page and "pe-interp ablate" in page
    assert main(["ablate", str(out), "--no-progress", "--n-bootstrap", "50"]) == 0
    assert main(["report", str(out)]) == 0
    page = (out / "report.html").read_text()
    assert "Is there a single-head deposit, and where?" in page
    assert page.index("id='verdict'") < page.index("<h2>Run</h2>")
    assert "figures/ablation_heatmap.png" in page and "re-create with" in page
