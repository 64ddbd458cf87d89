"""Hostile inputs to what issues 36 and 37 added: snapshots, ``RUN@S``, ``dynamics``, ``validate``,
restricted encodings, silent heads and the positional routes. A CLI case must exit with status 2
and one line on stderr, without a traceback, and leave no half-written result; an API case must
raise a one-line ValueError."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from bad_input_env import expect_cli_refusal

import pe_interp
from pe_interp.runs.checkpoint import load_run
from pe_interp.runs.snapshots import MANIFEST, SNAPSHOT_DIR, snapshot_path


@pytest.fixture(scope="module")
def snap(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bad-steps") / "run"
    pe_interp.train(
        task="distance",
        encoding="rope",
        preset="smoke",
        seed=0,
        out=out,
        snapshots="log",
        snapshot_every=8,
        progress=False,
    )
    return out


def _copy(src: Path, tmp: Path) -> Path:
    dst = tmp / "copy"
    shutil.copytree(src, dst)
    return dst


def _manifest(run: Path, text: str) -> Path:
    (run / SNAPSHOT_DIR / MANIFEST).write_text(text)
    return run


def _gone(run: Path, step: int) -> Path:
    snapshot_path(run, step).unlink()
    return run


def _flip(run: Path, step: int) -> Path:
    path = snapshot_path(run, step)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    return run


CASES = [
    (
        "ablate RUN@ with no step",
        lambda r, t: ["ablate", f"{r}@"],
        r"a step after '@' must be a whole number",
    ),
    (
        "ablate RUN@-1",
        lambda r, t: ["ablate", f"{r}@-1"],
        r"a step after '@' must be a whole number",
    ),
    (
        "ablate RUN@1.5",
        lambda r, t: ["ablate", f"{r}@1.5"],
        r"a step after '@' must be a whole number",
    ),
    (
        "ablate RUN@3 (not kept)",
        lambda r, t: ["ablate", f"{r}@3"],
        r"no snapshot at step 3; the run kept steps 0, 1, 2",
    ),
    ("patch RUN@999", lambda r, t: ["patch", f"{r}@999"], r"no snapshot at step 999"),
    (
        "decompose MISSING@4",
        lambda r, t: ["decompose", f"{t}/missing@4"],
        r"run directory not found",
    ),
    ("show RUN@7", lambda r, t: ["show", f"{r}@7"], r"no snapshot at step 7"),
    ("report RUN@5", lambda r, t: ["report", f"{r}@5"], r"no snapshot at step 5"),
    ("report FILE@4", lambda r, t: ["report", f"{t}@4"], r"RUN@STEP needs a run directory"),
    (
        "circuit RUN@2 on a damaged snapshot",
        lambda r, t: ["circuit", f"{_flip(_copy(r, t), 2)}@2"],
        r"differs from the manifest's",
    ),
    (
        "ablate RUN@4 whose snapshot file is gone",
        lambda r, t: ["ablate", f"{_gone(_copy(r, t), 4)}@4"],
        r"the snapshot of step 4 is listed in the manifest but missing",
    ),
    (
        "ablate RUN@4 with a manifest that is not JSON",
        lambda r, t: ["ablate", f"{_manifest(_copy(r, t), '{x')}@4"],
        r"manifest\.json",
    ),
    (
        "ablate RUN@4 with a manifest of the wrong shape",
        lambda r, t: [
            "ablate",
            f"{_manifest(_copy(r, t), json.dumps({'snapshots': [{'step': 'a'}]}))}@4",
        ],
        r"not a snapshot manifest",
    ),
    ("dynamics RUN@4", lambda r, t: ["dynamics", f"{r}@4"], r"give RUN_DIR without @STEP"),
    ("dynamics --n 0", lambda r, t: ["dynamics", str(r), "--n", "0"], r"--n must be >= 1"),
    (
        "dynamics --n-confirm -5",
        lambda r, t: ["dynamics", str(r), "--n-confirm", "-5"],
        r"--n-confirm must be >= 1",
    ),
    (
        "dynamics --n-pairs 0",
        lambda r, t: ["dynamics", str(r), "--n-pairs", "0"],
        r"--n-pairs must be >= 1",
    ),
    (
        "dynamics --steps 3 (not kept)",
        lambda r, t: ["dynamics", str(_copy(r, t)), "--steps", "3"],
        r"no snapshot at step\(s\) 3",
    ),
    (
        "dynamics on a run without snapshots",
        lambda r, t: ["dynamics", str(_manifest(_copy(r, t), json.dumps({"snapshots": []})))],
        r"kept no snapshots",
    ),
    (
        "dynamics on a directory that is no run",
        lambda r, t: ["dynamics", str(t)],
        r"not a run directory",
    ),
    (
        "dynamics --device cuda:9",
        lambda r, t: ["dynamics", str(r), "--device", "cuda:9"],
        r"--device",
    ),
    (
        "train --snapshots linear",
        lambda r, t: ["train", "--preset", "smoke", "--snapshots", "linear", "--out", f"{t}/n"],
        r"TrainConfig.snapshots must be one of 'none', 'log'",
    ),
    (
        "train --snapshot-every -2",
        lambda r, t: ["train", "--preset", "smoke", "--snapshot-every", "-2", "--out", f"{t}/n"],
        r"TrainConfig.snapshot_every must be an integer >= 0",
    ),
    (
        "train --encoding sinusoidal(heads=(0,))",
        lambda r, t: [
            "train",
            "--preset",
            "smoke",
            "--encoding",
            "sinusoidal(heads=(0,))",
            "--out",
            f"{t}/n",
        ],
        r"heads= has no meaning",
    ),
    (
        "train --encoding rope(layers=(9,))",
        lambda r, t: [
            "train",
            "--preset",
            "smoke",
            "--encoding",
            "rope(layers=(9,))",
            "--out",
            f"{t}/n",
        ],
        r"layers must be distinct layer indices in 0\.\.1",
    ),
    (
        "train --encoding alibi(heads=x)",
        lambda r, t: [
            "train",
            "--preset",
            "smoke",
            "--encoding",
            "alibi(heads=x)",
            "--out",
            f"{t}/n",
        ],
        r"heads must be a list of head indices",
    ),
    (
        "train --encoding rope+alibi+rope",
        lambda r, t: [
            "train",
            "--preset",
            "smoke",
            "--encoding",
            "rope+alibi+rope",
            "--out",
            f"{t}/n",
        ],
        r"applies 'rope' twice",
    ),
    (
        "train --silent-heads 9:9",
        lambda r, t: ["train", "--preset", "smoke", "--silent-heads", "9:9", "--out", f"{t}/n"],
        r"silent_heads: \(9, 9\) is not a head",
    ),
    (
        "train --silent-heads a:b",
        lambda r, t: ["train", "--preset", "smoke", "--silent-heads", "a:b", "--out", f"{t}/n"],
        r"silent_heads must be \(layer, head\) pairs",
    ),
    (
        "train --silent-heads 0:1 0:1",
        lambda r, t: [
            "train",
            "--preset",
            "smoke",
            "--silent-heads",
            "0:1",
            "0:1",
            "--out",
            f"{t}/n",
        ],
        r"a head is repeated",
    ),
    (
        "validate --grid a missing file",
        lambda r, t: ["validate", "--grid", f"{t}/missing.yaml", "--no-train"],
        r"missing\.yaml",
    ),
    (
        "validate --no-train with nothing trained",
        lambda r, t: [
            "validate",
            "--no-train",
            "--out",
            f"{t}/empty",
            "--grid",
            str(_grid_without_findings(t, False)),
        ],
        r"no planted model is trained or recorded yet",
    ),
    (
        "validate a grid without findings",
        lambda r, t: ["validate", "--no-train", "--grid", str(_grid_without_findings(t))],
        r"needs 'findings'",
    ),
    ("routes RUN@3 (not kept)", lambda r, t: ["routes", f"{r}@3"], r"no snapshot at step 3"),
    ("routes --n 0", lambda r, t: ["routes", str(r), "--n", "0"], r"--n must be >= 1"),
    (
        "routes --n-bootstrap 0",
        lambda r, t: ["routes", str(r), "--n-bootstrap", "0"],
        r"--n-bootstrap must be >= 1",
    ),
    ("routes --n abc", lambda r, t: ["routes", str(r), "--n", "abc"], r"invalid int value"),
    (
        "routes on a directory that is no run",
        lambda r, t: ["routes", str(t)],
        r"not a run directory",
    ),
    (
        "routes on a missing directory",
        lambda r, t: ["routes", f"{t}/missing"],
        r"run directory not found",
    ),
    ("routes --device cuda:9", lambda r, t: ["routes", str(r), "--device", "cuda:9"], r"--device"),
    (
        "routes on a damaged snapshot",
        lambda r, t: ["routes", f"{_flip(_copy(r, t), 2)}@2"],
        r"differs from the manifest's",
    ),
    (
        "ablate --verdict maybe",
        lambda r, t: ["ablate", str(r), "--verdict", "maybe"],
        r"invalid choice: 'maybe'",
    ),
    (
        "ablate --verdict single --n-bootstrap 0",
        lambda r, t: ["ablate", str(r), "--verdict", "single", "--n-bootstrap", "0"],
        r"--verdict is decided on bootstrap intervals",
    ),
    (
        "ablate --verdict layer0 --layers 1",
        lambda r, t: ["ablate", str(r), "--verdict", "layer0", "--layers", "1"],
        r"--verdict needs the accuracy grid of every layer",
    ),
    (
        "ablate --verdict single --metric logit",
        lambda r, t: ["ablate", str(r), "--verdict", "single", "--metric", "logit"],
        r"--verdict needs the accuracy grid of every layer",
    ),
    (
        "validate --readme without markers",
        lambda r, t: ["validate", "--no-train", "--readme", str(_readme(t))],
        r"no <!-- study:planted-quick begin -->",
    ),
]


def _grid_without_findings(tmp: Path, drop: bool = True) -> Path:
    text = (Path(__file__).resolve().parents[1] / "grids" / "planted_quick.yaml").read_text()
    if drop:
        text = text.replace("findings: ../findings/planted-quick\n", "")
    else:
        text = text.replace(
            "findings: ../findings/planted-quick\n", f"findings: {tmp}/no-findings\n"
        )
    path = tmp / "planted.yaml"
    path.write_text(text)
    return path


def _readme(tmp: Path) -> Path:
    path = tmp / "findings" / "README.md"
    path.parent.mkdir(exist_ok=True)
    path.write_text("# no markers here\n")
    return path


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_cli_bad_input(case, snap, tmp_path, capsys):
    _, argv, pattern = case
    before = sorted(p.name for p in snap.iterdir())
    expect_cli_refusal(argv(snap, tmp_path), pattern, capsys)
    assert sorted(p.name for p in snap.iterdir()) == before  # nothing written into the run


def _pairs(run):
    return run.task.counterfactuals(16, kind="position", seed=1)


def _ablate(r, **kwargs):
    from probes import ablate_heads

    run = load_run(r)
    test = run.examples("test", 16)
    return ablate_heads(
        run.model, test.tokens, test.labels, pad_mask=test.pad_mask, n_bootstrap=10, **kwargs
    )


API_CASES = [
    ("load_run(step=True)", lambda r: load_run(r, step=True), r"step must be a whole number >= 0"),
    ("load_run(step=-3)", lambda r: load_run(r, step=-3), r"step must be a whole number >= 0"),
    (
        "route_shares with batch_size 0",
        lambda r: (
            lambda run, p: __import__("probes").route_shares(
                run.model,
                p.clean.tokens,
                p.corrupt.tokens,
                p.clean.labels,
                p.corrupt.labels,
                pad_mask=p.clean.pad_mask,
                batch_size=0,
            )
        )(load_run(r), _pairs(load_run(r))),
        r"batch_size must be a positive whole number",
    ),
    (
        "route_shares with labels out of range",
        lambda r: (
            lambda run, p: __import__("probes").route_shares(
                run.model,
                p.clean.tokens,
                p.corrupt.tokens,
                p.clean.labels + 100,
                p.corrupt.labels,
                pad_mask=p.clean.pad_mask,
            )
        )(load_run(r), _pairs(load_run(r))),
        r"clean_labels must be integers",
    ),
    (
        "route_shares with shapes that differ",
        lambda r: (
            lambda run, p: __import__("probes").route_shares(
                run.model,
                p.clean.tokens,
                p.corrupt.tokens[:, :-1],
                p.clean.labels,
                p.corrupt.labels,
            )
        )(load_run(r), _pairs(load_run(r))),
        r"(shape|pad_mask|fit)",
    ),
    (
        "route_shares on NaN weights",
        lambda r: (
            lambda run, p: (
                torch.nn.init.constant_(run.model.W_E, float("nan")),
                __import__("probes").route_shares(
                    run.model,
                    p.clean.tokens,
                    p.corrupt.tokens,
                    p.clean.labels,
                    p.corrupt.labels,
                    pad_mask=p.clean.pad_mask,
                ),
            )
        )(load_run(r), _pairs(load_run(r))),
        r"non-finite weights",
    ),
    ("ablate_heads(engine='fast')", lambda r: _ablate(r, engine="fast"), r"unknown engine 'fast'"),
    (
        "ablate_heads(engine='sampled', verify_top=0)",
        lambda r: _ablate(r, engine=__import__("probes").ablation.Sampled(verify_top=0)),
        r"verify_top must be a positive integer",
    ),
    (
        "ablate_heads(engine=Sampled(share=1.5))",
        lambda r: _ablate(r, engine=__import__("probes").ablation.Sampled(share=1.5)),
        r"share must be a share of the examples in \(0, 1\]",
    ),
    (
        "ablate_heads(engine='attribution', steps=0)",
        lambda r: _ablate(r, engine=__import__("probes").ablation.Attribution(steps=0)),
        r"steps must be a positive integer",
    ),
    (
        "ablate_heads(engine='attribution', path='diagonal')",
        lambda r: _ablate(r, engine=__import__("probes").ablation.Attribution(path="diagonal")),
        r"path must be one of joint, layer",
    ),
    (
        "ablate_heads(engine='sampled', head_sets=...)",
        lambda r: _ablate(r, engine="sampled", head_sets=[[(0, 0)]]),
        r"ranks single heads",
    ),
    (
        "ablate_heads(method='resample', reference of another width)",
        lambda r: _ablate(r, method="resample", reference=_pairs(load_run(r)).clean.tokens[:, :-1]),
        r"the reference must have the padded length",
    ),
    (
        "ablate_heads(batch_size=True)",
        lambda r: _ablate(r, batch_size=True),
        r"batch_size must be a positive integer",
    ),
    ("ablate_heads(ci=1.0)", lambda r: _ablate(r, ci=1.0), r"ci must be in \(0, 1\)"),
    ("ablate_heads(layers=[5])", lambda r: _ablate(r, layers=[5]), r"layer 5 is out of range"),
    (
        "ablate_heads on a model of another kind",
        lambda r: __import__("probes").ablate_heads(
            torch.nn.Linear(2, 2),
            torch.zeros(2, 3, dtype=torch.long),
            torch.zeros(2, dtype=torch.long),
        ),
        r"ablate_heads: model must be a pe_interp HookedPETransformer, a TransformerBridge or a "
        r"BridgedModel, got Linear",
    ),
    (
        "snapshot_dynamics n=0",
        lambda r: __import__("probes").snapshot_dynamics(r, n=0),
        r"n must be a positive whole number",
    ),
    (
        "snapshot_dynamics steps not kept",
        lambda r: __import__("probes").snapshot_dynamics(r, steps=[5], progress=False),
        r"no snapshot at step\(s\) 5",
    ),
    (
        "TrainConfig(snapshots) without a run directory",
        lambda r: pe_interp.Trainer(
            *__import__("pe_interp.config.presets", fromlist=["x"]).build_run_configs(
                preset="smoke", snapshots="log"
            ),
            run_dir=None,
            progress=False,
        ),
        r"needs a run directory",
    ),
]


@pytest.mark.parametrize("case", API_CASES, ids=[c[0] for c in API_CASES])
def test_api_bad_input(case, snap):
    _, call, pattern = case
    with pytest.raises(ValueError) as info:
        call(snap)
    message = str(info.value)
    assert "\n" not in message and re.search(pattern, message), message
