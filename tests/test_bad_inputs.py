"""Every bad input gets a clear, one-line error: a table of cases through the command line and
the Python API (the hostile-input pass of the "newcomer's first hour" issue, and its neighbours).

A CLI case runs ``pe-interp`` in-process and requires exit status 2, no traceback, and one line
on stderr that matches; an API case requires a ValueError (CheckpointError is one) whose
one-line message matches. Each case builds its own bad input from a small trained run.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from bad_input_env import expect_value_error
from safetensors.torch import load_file, save_file

import pe_interp
from pe_interp.cli import main
from pe_interp.runs.checkpoint import load_run

SMOKE = dict(preset="smoke", progress=False)
CUDA = torch.cuda.is_available()


@pytest.fixture(scope="module")
def base_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bad-inputs") / "run"
    pe_interp.train(seed=0, out=out, **SMOKE)
    return out


@dataclass
class Env:
    """What a case may build its input from: a private copy of a trained run, and a scratch dir."""

    run: Path
    tmp: Path

    def copy(self) -> Path:
        dst = self.tmp / "copy"
        shutil.copytree(self.run, dst)
        return dst

    def grid(self, text: str, name: str = "grid.yaml") -> str:
        path = self.tmp / name
        path.write_text(text)
        return str(path)

    def edit_config(self, change: Callable[[dict], object]) -> Path:
        d = self.copy()
        config = json.loads((d / "config.json").read_text())
        change(config)
        (d / "config.json").write_text(json.dumps(config))
        return d


GRID_HEAD = "name: g\nbase: {preset: smoke, task: distance}\naxes: {encoding: [rope]}\n"


def _int64_weights(env: Env) -> Path:
    d = env.copy()
    tensors = load_file(str(d / "model.safetensors"))
    save_file(
        {k: (v * 0).long() if v.is_floating_point() else v for k, v in tensors.items()},
        str(d / "model.safetensors"),
    )
    return d


def _huge_grid(env: Env) -> str:
    values = ", ".join(str(i) for i in range(100))
    return env.grid(
        f"name: huge\nbase: {{preset: smoke}}\naxes: {{n_layers: [{values}], d_model: [{values}], "
        f"epochs: [{values}]}}\n"
    )


def _binary_config(env: Env) -> Path:
    d = env.copy()
    (d / "config.json").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe")
    return d


def _file(env: Env) -> str:
    path = env.tmp / "a-file"
    path.write_text("not a directory")
    return str(path)


# (id, argv built from env, stderr pattern). Every case exits with status 2.
CLI_CASES: list[tuple[str, Callable[[Env], list[str]], str]] = [
    ("eval --n 0", lambda e: ["eval", str(e.run), "--n", "0"], r"--n must be >= 1, got 0"),
    ("eval --n -5", lambda e: ["eval", str(e.run), "--n", "-5"], r"--n must be >= 1, got -5"),
    ("ablate --n 0", lambda e: ["ablate", str(e.run), "--n", "0"], r"--n must be >= 1"),
    ("patch --n 0", lambda e: ["patch", str(e.run), "--n", "0"], r"--n must be >= 1"),
    ("decompose --n 0", lambda e: ["decompose", str(e.run), "--n", "0"], r"--n must be >= 1"),
    *[
        (
            f"{cmd} --device tpu",
            lambda e, cmd=cmd: [cmd, str(e.run), "--device", "tpu"],
            r"--device must be 'cpu', 'cuda', 'cuda:N' or 'mps', got 'tpu'",
        )
        for cmd in ("eval", "ablate", "patch", "decompose")
    ],
    *[
        (
            f"{cmd} --device cuda without CUDA",
            lambda e, cmd=cmd: [cmd, str(e.run), "--device", "cuda"],
            r"--device is 'cuda' but CUDA is not available",
        )
        for cmd in ("eval", "ablate", "patch", "decompose")
    ],
    (
        "train --device tpu",
        lambda e: ["train", "--preset", "smoke", "--out", str(e.tmp / "n"), "--device", "tpu"],
        r"--device must be",
    ),
    (
        "train --out an existing file",
        lambda e: ["train", "--preset", "smoke", "--out", _file(e), "--no-progress"],
        r"exists and is not a directory",
    ),
    (
        "train --resume on a missing directory",
        lambda e: [
            "train",
            "--preset",
            "smoke",
            "--out",
            str(e.tmp / "missing"),
            "--resume",
            "--no-progress",
        ],
        r"--resume: .*missing holds no run to resume \(no such directory\); drop --resume",
    ),
    (
        "train into a finished run without --resume",
        lambda e: ["train", "--preset", "smoke", "--out", str(e.copy()), "--no-progress"],
        r"already holds a run",
    ),
    (
        "train --encoding with a misspelt parameter",
        lambda e: [
            "train",
            "--preset",
            "smoke",
            "--encoding",
            "rope(bse=500)",
            "--out",
            str(e.tmp / "n"),
        ],
        r"encoding 'rope': unknown parameter 'bse'; allowed: base, rotary_dim, heads",
    ),
    (
        "train --encoding with unbalanced brackets",
        lambda e: [
            "train",
            "--preset",
            "smoke",
            "--encoding",
            "rope(base=500",
            "--out",
            str(e.tmp / "n"),
        ],
        r"unbalanced brackets",
    ),
    (
        "train --encoding with bad JSON",
        lambda e: [
            "train",
            "--preset",
            "smoke",
            "--encoding",
            '{"name": rope}',
            "--out",
            str(e.tmp / "n"),
        ],
        r"encoding: invalid JSON",
    ),
    (
        "train --act-fn tanh",
        lambda e: ["train", "--preset", "smoke", "--act-fn", "tanh", "--out", str(e.tmp / "n")],
        r"ModelConfig.act_fn must be one of 'relu', 'gelu', 'silu'; got 'tanh'",
    ),
    (
        "train --betas 1.2 0.9",
        lambda e: [
            "train",
            "--preset",
            "smoke",
            "--betas",
            "1.2",
            "0.9",
            "--out",
            str(e.tmp / "n"),
        ],
        r"TrainConfig.betas must be two numbers in \[0, 1\)",
    ),
    (
        "train --n-ctx",
        lambda e: ["train", "--preset", "smoke", "--n-ctx", "10", "--out", str(e.tmp / "n")],
        r"n_ctx is derived from the task",
    ),
    (
        "train --task count --max-between",
        lambda e: [
            "train",
            "--preset",
            "smoke",
            "--task",
            "count",
            "--max-between",
            "5",
            "--out",
            str(e.tmp / "n"),
        ],
        r"max_between is a setting of another task, not of task 'count'",
    ),
    (
        "show on a missing directory",
        lambda e: ["show", str(e.tmp / "missing")],
        r"run directory not found",
    ),
    (
        "report on a directory that is neither",
        lambda e: ["report", str(e.tmp)],
        r"neither a run directory \(config.json\) nor a sweep directory",
    ),
    (
        "eval: a binary config.json",
        lambda e: ["eval", str(_binary_config(e))],
        r"copy/config.json: not a JSON text file",
    ),
    (
        'eval: "model": "rope" in config.json',
        lambda e: ["eval", str(e.edit_config(lambda c: c.update(model="rope")))],
        r"config.json: invalid config \(ModelConfig: expected a mapping of field names to values, got str 'rope'\)",
    ),
    (
        "eval: an unknown top-level config key",
        lambda e: ["eval", str(e.edit_config(lambda c: c.update(modle={})))],
        r"config.json: unknown top-level key\(s\) 'modle'",
    ),
    (
        "eval: a config.json without 'train'",
        lambda e: ["eval", str(e.edit_config(lambda c: c.pop("train")))],
        r"config.json: invalid config \(no 'train' section\)",
    ),
    (
        "eval: weights converted to int64",
        lambda e: ["eval", str(_int64_weights(e))],
        r"model.safetensors: tensor '.*' is int64, the model expects float32",
    ),
    (
        "sweep: a grid of 10^6 cells",
        lambda e: ["sweep", _huge_grid(e), "--dry-run"],
        r"the grid has 1,000,000 cells \(100 n_layers x 100 d_model x 100 epochs.*the limit is 10,000",
    ),
    (
        "sweep: resources: [1, 2]",
        lambda e: ["sweep", e.grid(GRID_HEAD + "resources: [1, 2]\n"), "--dry-run"],
        r"resources must be a mapping such as \{cpus: 4, gpus: 1\}, got \[1, 2\]",
    ),
    (
        "sweep: resources: {cpus: 0}",
        lambda e: ["sweep", e.grid(GRID_HEAD + "resources: {cpus: 0}\n"), "--dry-run"],
        r"resources.cpus must be a number > 0, got 0",
    ),
    (
        "sweep: resources: {tpus: 1}",
        lambda e: ["sweep", e.grid(GRID_HEAD + "resources: {tpus: 1}\n"), "--dry-run"],
        r"resources.tpus is not a resource; allowed: cpus, gpus",
    ),
    (
        "sweep: probes: ablation (a string)",
        lambda e: ["sweep", e.grid(GRID_HEAD + "probes: ablation\n"), "--dry-run"],
        r"probes must be a list of probe names \(e.g. \[ablation\]\), got 'ablation'",
    ),
    (
        "sweep: probes: [ablaton]",
        lambda e: ["sweep", e.grid(GRID_HEAD + "probes: [ablaton]\n"), "--dry-run"],
        r"probes: unknown probe 'ablaton'",
    ),
    (
        "sweep: seeds: true",
        lambda e: ["sweep", e.grid(GRID_HEAD + "seeds: true\n"), "--dry-run"],
        r"seeds must be a count or a non-empty list of integers >= 0, got True",
    ),
    (
        "sweep: variants: {}",
        lambda e: ["sweep", e.grid(GRID_HEAD + "variants: {}\n"), "--dry-run"],
        r"'variants' must be a non-empty list of mappings",
    ),
    (
        "sweep: variants: []",
        lambda e: ["sweep", e.grid(GRID_HEAD + "variants: []\n"), "--dry-run"],
        r"'variants' must be a non-empty list of mappings",
    ),
    (
        "sweep: base: [preset]",
        lambda e: ["sweep", e.grid("base: [preset]\n"), "--dry-run"],
        r"'base' must be a mapping of settings",
    ),
    (
        "sweep: an unknown setting",
        lambda e: ["sweep", e.grid(GRID_HEAD + "variants: [{n_layer: 3}]\n"), "--dry-run"],
        r"variants\[0\].n_layer is not a setting; did you mean n_layers",
    ),
    (
        "sweep: an unknown top-level key",
        lambda e: ["sweep", e.grid(GRID_HEAD + "seed: [0]\n"), "--dry-run"],
        r"unknown key\(s\) \['seed'\]",
    ),
    (
        "sweep: a binary grid file",
        lambda e: ["sweep", str(_binary_config(e) / "config.json"), "--dry-run"],
        r"not a text file \(a grid is YAML or TOML\)",
    ),
    (
        "sweep: --max-cells 0",
        lambda e: ["sweep", e.grid(GRID_HEAD), "--max-cells", "0"],
        r"--max-cells must be >= 1",
    ),
    # The second fresh-clone pass: each of these ran work it then threw away, or gave a traceback.
    (
        "reproduce --device cuda without CUDA",  # trained and failed every cell (a minute at smoke size)
        lambda e: [
            "reproduce",
            "--preset",
            "smoke",
            "--tasks",
            "distance",
            "--encodings",
            "nope",
            "--out",
            str(e.tmp / "r"),
            "--device",
            "cuda",
            "--no-progress",
        ],
        r"--device is 'cuda' but CUDA is not available",
    ),
    (
        "sweep: a grid with device: cuda, without CUDA",  # likewise, with --backend local
        lambda e: [
            "sweep",
            e.grid(
                "name: g\nbase: {preset: smoke, task: distance, device: cuda}\naxes: {encoding: [nope]}\n"
            ),
            "--out",
            str(e.tmp / "s"),
            "--no-progress",
        ],
        r"grid.yaml: device is 'cuda' but CUDA is not available .*--dry-run validates it anyway",
    ),
    (
        "sweep --workers 0",
        lambda e: ["sweep", e.grid(GRID_HEAD), "--workers", "0", "--out", str(e.tmp / "s")],
        r"--workers must be >= 1, got 0",
    ),
    (
        "reproduce --workers 0",
        lambda e: [
            "reproduce",
            "--preset",
            "smoke",
            "--tasks",
            "distance",
            "--encodings",
            "nope",
            "--workers",
            "0",
            "--out",
            str(e.tmp / "r"),
            "--no-progress",
        ],
        r"--workers must be >= 1, got 0",
    ),
    (
        "demo --workers -1",
        lambda e: [
            "demo",
            "--preset",
            "smoke",
            "--encodings",
            "nope",
            "--workers",
            "-1",
            "--out",
            str(e.tmp / "d"),
            "--no-progress",
        ],
        r"--workers must be >= 1, got -1",
    ),
    (
        "reproduce --seeds 0",
        lambda e: ["reproduce", "--preset", "smoke", "--seeds", "0", "--out", str(e.tmp / "r")],
        r"--seeds must be >= 1, got 0",
    ),
    *[
        (
            f"{cmd} --out an existing file",
            lambda e, cmd=cmd, pre=pre: [cmd, *pre(e), "--out", _file(e)],
            r"--out .*a-file: exists and is not a directory",
        )
        for cmd, pre in (
            ("sweep", lambda e: [e.grid(GRID_HEAD)]),
            ("reproduce", lambda e: ["--preset", "smoke"]),
            ("demo", lambda e: ["--preset", "smoke"]),
            ("circuit", lambda e: [str(e.run)]),
        )
    ],
    (
        "train --out under a file",
        lambda e: ["train", "--preset", "smoke", "--out", _file(e) + "/run"],
        r"a-file is a file, not a directory",
    ),
    (
        "train --out ''",
        lambda e: [
            "train",
            "--preset",
            "smoke",
            "--out",
            "",
            "--no-progress",
        ],  # trained into the cwd
        r"--out is empty",
    ),
    (
        "train --ignore-index 999",
        lambda e: [
            "train",
            "--preset",
            "smoke",
            "--ignore-index",
            "999",
            "--out",
            str(e.tmp / "n"),
        ],
        r"TrainConfig.ignore_index must be a class of the task, in 0\.\.\d+, got 999",
    ),
    (
        "train --epochs abc (a usage error)",
        lambda e: ["train", "--epochs", "abc", "--out", str(e.tmp / "n")],
        r"^pe-interp train: error: argument --epochs: invalid int value: 'abc' \(see pe-interp train --help\)$",
    ),
    (
        "train without --out",
        lambda e: ["train", "--preset", "smoke"],
        r"the following arguments are required: --out",
    ),
    (
        "circuit --device tpu",
        lambda e: ["circuit", str(e.run), "--device", "tpu"],
        r"--device must be",
    ),
    (
        "ablate --n-bootstrap -1",
        lambda e: ["ablate", str(e.run), "--n-bootstrap", "-1"],
        r"--n-bootstrap must be >= 0",
    ),
    (
        "ablate --min-share 2",
        lambda e: ["ablate", str(e.run), "--min-share", "2"],
        r"--min-share must be a number in \(0, 1\], got 2\.0$",
    ),
    (
        "ablate --min-drop -1",
        lambda e: ["ablate", str(e.run), "--min-drop", "-1"],
        r"--min-drop must be a finite number >= 0, got -1\.0$",
    ),
    (
        "patch --n-bootstrap -1",
        lambda e: ["patch", str(e.run), "--n-bootstrap", "-1"],
        r"--n-bootstrap must be >= 0",
    ),
    (
        "sweep: probe_options: {ablation: {n: 0}}",  # every cell trained, then its probe failed
        lambda e: [
            "sweep",
            e.grid(GRID_HEAD + "probes: [ablation]\nprobe_options: {ablation: {n: 0}}\n"),
            "--dry-run",
        ],
        r"probe_options.ablation.n must be an integer >= 1, got 0",
    ),
    (
        "sweep: probe_options: {ablation: {on: train}}",
        lambda e: [
            "sweep",
            e.grid(GRID_HEAD + "probes: [ablation]\nprobe_options: {ablation: {on: train}}\n"),
            "--dry-run",
        ],
        r"probe_options.ablation.on must be 'test' or 'all', got 'train'",
    ),
    (
        "sweep: a name with a path in it",
        lambda e: ["sweep", e.grid(GRID_HEAD.replace("name: g", "name: ../../etc")), "--dry-run"],
        r"'name' must be letters, digits",
    ),
    (
        "sweep --max-retries -1",
        lambda e: ["sweep", e.grid(GRID_HEAD), "--max-retries", "-1"],
        r"--max-retries must be >= 0",
    ),
    (
        "sweep-report on a missing directory",
        lambda e: ["sweep-report", str(e.tmp / "missing")],
        r"missing: no such directory",
    ),
    (
        "generalize --n 0",
        lambda e: ["generalize", str(e.run), "--n", "0"],
        r"--n must be >= 1, got 0",
    ),
    (
        "generalize --extras 0",
        lambda e: ["generalize", str(e.run), "--extras", "4", "0"],
        r"--extras must be positive integers, got 4 0",
    ),
    (
        "generalize --families length on task 1",
        lambda e: ["generalize", str(e.run), "--families", "length"],
        r"--families: DistanceTask.extended: family must be one of 'shift', 'sides', 'right'; got 'length'",
    ),
    (
        "generalize --device tpu",
        lambda e: ["generalize", str(e.run), "--device", "tpu"],
        r"--device must be",
    ),
    (
        "generalize --out a directory",
        lambda e: ["generalize", str(e.run), "--out", str(e.tmp)],
        r"is a directory",
    ),
    (
        "report --link-with without NAME=",
        lambda e: ["report", str(e.run), "--link-with", str(e.tmp)],
        r"--link-with: expected NAME=SWEEP_DIR",
    ),
    (
        "report --link-with a run directory",
        lambda e: ["report", str(e.run), "--link-with", f"mid={e.run}"],
        r"is not a sweep directory \(no grid.json\)",
    ),
    (
        "train --task retrieve --max-between 3",
        lambda e: [
            "train",
            "--preset",
            "smoke",
            "--task",
            "retrieve",
            "--max-between",
            "3",
            "--out",
            str(e.tmp / "n"),
        ],
        r"max_between is a setting of another task, not of task 'retrieve'",
    ),
    (
        "show on a directory without config.json",
        lambda e: ["show", str(e.tmp)],
        r"not a run directory \(no config.json",
    ),
    (
        "demo --checkpoints a missing directory",
        lambda e: ["demo", "--checkpoints", str(e.tmp / "missing"), "--out", str(e.tmp / "d")],
        r"--checkpoints .*missing: no such directory",
    ),
]


@pytest.mark.parametrize("case", CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_cli_bad_input(case, base_run, tmp_path, capsys):
    name, argv, pattern = case
    if "without CUDA" in name and CUDA:
        pytest.skip("this machine has CUDA")
    env = Env(base_run, tmp_path)
    try:
        code = main(argv(env))
    except SystemExit as exit_:  # argparse's usage errors
        code = exit_.code
    err = capsys.readouterr().err.strip()
    assert code == 2, f"exit status {code}; stderr: {err}"
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, f"more than one line: {err}"
    assert re.search(pattern, lines[0]), lines[0]


def _grid(**over):
    from pe_interp.sweep import parse_grid

    data = {
        "name": "g",
        "base": {"preset": "smoke", "task": "distance"},
        "axes": {"encoding": ["rope"]},
        **over,
    }
    return parse_grid(data, source="g.yaml")


def _generalize(env: Env, **kwargs):
    from probes import length_generalization

    run = load_run(env.run)
    return length_generalization(run.model, run.task, **kwargs)


def _empty_eval(env: Env):
    run = load_run(env.run)
    return pe_interp.evaluate(run.model, run.test_set()[:0])


def _hook_name(env: Env):
    model, _ = load_run(env.run)
    tokens = torch.ones(1, 4, dtype=torch.long)
    return model.run_with_hooks(
        tokens, fwd_hooks=[("blocks.0.attn.hook_patern", lambda x, hook: x)]
    )


# (id, call(env), message pattern). Every case raises a ValueError with a one-line message.
API_CASES: list[tuple[str, Callable[[Env], object], str]] = [
    (
        "train(n_layer=3)",
        lambda e: pe_interp.train(n_layer=3, **SMOKE),
        r"unknown setting 'n_layer'; did you mean n_layers",
    ),
    (
        "train(task='count', max_between=5)",
        lambda e: pe_interp.train(task="count", max_between=5, **SMOKE),
        r"max_between is a setting of another task, not of task 'count' \(its settings: d_vocab, dedup",
    ),
    (
        "train(n_classes=3)",
        lambda e: pe_interp.train(n_classes=3, **SMOKE),
        r"n_classes is derived from the task",
    ),
    (
        "train(out=a file)",
        lambda e: pe_interp.train(out=_file(e), **SMOKE),
        r"exists and is not a directory",
    ),
    (
        "train(resume=True) on a missing directory",
        lambda e: pe_interp.train(out=e.tmp / "missing", resume=True, **SMOKE),
        r"missing: nothing to resume, the directory does not exist",
    ),
    (
        "train(encoding='rope(500)')",
        lambda e: pe_interp.train(encoding="rope(500)", **SMOKE),
        r"parameter '500' of 'rope' is not key=value",
    ),
    (
        "train(device='cuda') without CUDA",
        lambda e: pe_interp.train(device="cuda", **SMOKE),
        r"TrainConfig.device is 'cuda' but CUDA is not available",
    ),
    (
        "load_run(device='tpu')",
        lambda e: load_run(e.run, device="tpu"),
        r"device must be 'cpu', 'cuda', 'cuda:N' or 'mps'",
    ),
    (
        "load_run(a binary config.json)",
        lambda e: load_run(_binary_config(e)),
        r"config.json: not a JSON text file",
    ),
    (
        "load_run(int64 weights)",
        lambda e: load_run(_int64_weights(e)),
        r"is int64, the model expects float32",
    ),
    (
        "test_set(0)",
        lambda e: load_run(e.run).test_set(0),
        r"n must be a positive integer or None, got 0",
    ),
    (
        "test_set(-5)",
        lambda e: load_run(e.run).test_set(-5),
        r"n must be a positive integer or None, got -5",
    ),
    ("evaluate(an empty batch)", _empty_eval, r"evaluate: the batch is empty"),
    (
        "ModelConfig.from_dict('rope')",
        lambda e: pe_interp.ModelConfig.from_dict("rope"),
        r"ModelConfig: expected a mapping of field names to values, got str 'rope'",
    ),
    (
        "TrainConfig.from_dict([1])",
        lambda e: pe_interp.TrainConfig.from_dict([1]),
        r"TrainConfig: expected a mapping",
    ),
    (
        "parse_grid(resources=[1, 2])",
        lambda e: _grid(resources=[1, 2]),
        r"resources must be a mapping",
    ),
    (
        "parse_grid(probes='ablation')",
        lambda e: _grid(probes="ablation"),
        r"probes must be a list of probe names",
    ),
    (
        "parse_grid(seeds=True)",
        lambda e: _grid(seeds=True),
        r"seeds must be a count or a non-empty list",
    ),
    (
        "parse_grid(variants={})",
        lambda e: _grid(variants={}),
        r"'variants' must be a non-empty list of mappings",
    ),
    (
        "parse_grid(10^6 cells)",
        lambda e: _grid(
            axes={
                "n_layers": list(range(1, 101)),
                "d_model": list(range(100)),
                "epochs": list(range(1, 101)),
            }
        ),
        r"the grid has 1,000,000 cells",
    ),
    (
        "a bad hook name",
        _hook_name,
        r"no hook or module named 'blocks\.0\.attn\.hook_patern'.*did you mean blocks\.0\.attn\.hook_pattern",
    ),
    (
        "parse_grid(probe_options n: 0)",
        lambda e: _grid(probes=["ablation"], probe_options={"ablation": {"n": 0}}),
        r"probe_options.ablation.n must be an integer >= 1",
    ),
    (
        "length_generalization(n=0)",
        lambda e: _generalize(e, n=0),
        r"n must be a positive integer, got 0",
    ),
    (
        "length_generalization(extras=[-2])",
        lambda e: _generalize(e, extras=[-2]),
        r"extras must be positive integers",
    ),
    (
        "task.extended('length') on task 1",
        lambda e: load_run(e.run).task.extended("length", 4),
        r"DistanceTask.extended: family must be one of 'shift', 'sides', 'right'; got 'length'",
    ),
    (
        "RetrieveTask(d_vocab too small for distinct values)",
        lambda e: pe_interp.tasks.RetrieveTask(d_vocab=50),
        r"RetrieveTask.d_vocab must be an integer >= 122 \(PAD, the marker and max_len = 120 distinct values\)",
    ),
    (
        "train(ignore_index=999) through the API",
        lambda e: pe_interp.train(ignore_index=999, **SMOKE),
        r"TrainConfig.ignore_index must be a class of the task, in 0\.\.\d+, got 999",
    ),
    (
        "check_run_configs(ignore_index beyond the classes)",
        lambda e: pe_interp.config.model.check_run_configs(
            load_run(e.run).model.cfg, pe_interp.TrainConfig(ignore_index=999)
        ),
        r"ignore_index must be a class of the task",
    ),
]
# Known gaps, each with its owner: a strict xfail turns into a failure once it is fixed.
XFAIL: dict[str, str] = {}


@pytest.mark.parametrize("case", API_CASES, ids=[c[0] for c in API_CASES])
def test_api_bad_input(case, base_run, tmp_path, request):
    name, call, pattern = case
    if "without CUDA" in name and CUDA:
        pytest.skip("this machine has CUDA")
    if name in XFAIL:
        request.applymarker(
            pytest.mark.xfail(reason=XFAIL[name], strict=True, raises=AssertionError)
        )
    env = Env(base_run, tmp_path)
    expect_value_error(lambda: call(env), pattern)


def test_the_tables_cover_the_issue():
    """Every bad input the hostile pass listed is a case above."""
    ids = {c[0] for c in CLI_CASES} | {c[0] for c in API_CASES}
    for required in (
        "eval --n 0",
        "eval --n -5",
        "eval --device tpu",
        "ablate --device tpu",
        "patch --device tpu",
        "decompose --device tpu",
        "eval --device cuda without CUDA",
        "patch --device cuda without CUDA",
        "sweep: a grid of 10^6 cells",
        "eval: weights converted to int64",
        "sweep: resources: [1, 2]",
        "sweep: probes: ablation (a string)",
        "sweep: seeds: true",
        "sweep: variants: {}",
        "train --out an existing file",
        "train --resume on a missing directory",
        "eval: a binary config.json",
        'eval: "model": "rope" in config.json',
        "train(n_layer=3)",
        "a bad hook name",
        "eval: an unknown top-level config key",
    ):
        assert required in ids, required
