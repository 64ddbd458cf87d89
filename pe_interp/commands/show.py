"""``pe-interp show RUN_DIR``: a run's config, accuracy, single-head deposit verdict, layer
concentration, files, and the snapshots it kept with the results each step has, as text.
``pe-interp show RUN_DIR@S`` shows the results of the snapshot of step S (``steps/S/``).
A survey's findings directory, a saved Hugging Face model directory or a GGUF file is shown as
what it is (:mod:`pe_interp.commands.show_dirs`)."""

from __future__ import annotations

import argparse
import math
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "show",
        help="print a run's config, accuracy, deposit verdict and files",
        description="Print what a run directory holds: its configuration (and the command that "
        "re-creates it), its accuracy, the deposit verdict of its ablation sweep, and its files.",
    )
    p.add_argument(
        "run_dir",
        metavar="RUN_DIR",
        help="a run directory (RUN@S: a snapshot), a survey's findings directory, a saved "
        "Hugging Face model directory or a GGUF file",
    )
    p.set_defaults(run=run)


def _pct(x) -> str:
    return "—" if not isinstance(x, int | float) or math.isnan(x) else f"{100 * x:.1f}%"


def _status(run_dir: Path, path: Path, step: int | None = None) -> tuple[str, str]:
    """A result file's :func:`~pe_interp.runs.checkpoint.weights_status`; ("unreadable", why) for a
    file that is not JSON (show lists it, it does not stop)."""
    from pe_interp.runs.checkpoint import weights_status

    try:
        return weights_status(run_dir, path, step)
    except ValueError as err:
        return "unreadable", str(err)


def run(args: argparse.Namespace) -> int:
    from pe_interp.commands.show_dirs import is_survey_dir, show_model, show_survey
    from pe_interp.runs.checkpoint import load_run, split_step
    from pe_interp.runs.gguf_file import is_gguf_file
    from pe_interp.runs.model_dirs import is_model_dir

    path, at = split_step(args.run_dir)
    if at is None and is_survey_dir(path):  # a survey's findings (pe-interp survey --out)
        return show_survey(path)
    if at is None and (is_model_dir(path) or (is_gguf_file(path) and path.is_file())):
        return show_model(path)  # a model directory that commands wrote results into
    loaded = load_run(
        args.run_dir
    )  # validates config and weights (RUN@S: that snapshot's); one line otherwise
    run_dir, results, step = loaded.run_dir, loaded.result_dir, loaded.at_step
    _print_config(loaded)
    _print_accuracy(loaded)
    status = {
        p.name: _status(run_dir, p, step)
        for p in sorted(results.glob("*.json"))
        if p.name not in ("config.json", "dynamics.json")
    }
    _print_deposit(loaded, status)
    _print_concentration(results, status)
    _print_files(results, status)
    _snapshots(run_dir)
    return 0


def _print_config(loaded) -> None:
    """The run's name, preset, encoding, model, task, training and the command that re-creates it."""
    run_dir, results, step = loaded.run_dir, loaded.result_dir, loaded.at_step
    cfg, task, train = loaded.model.cfg, loaded.task, loaded.train_cfg
    config = loaded.config
    print(
        f"run {loaded.name}"
        + ("" if step is None else f"  (the snapshot of step {step}; its results: {results})")
    )
    quirks = " with the authors' quirks" if config.get("authors_quirks") else ""
    print(f"  preset     {config.get('preset')}{quirks}; pe-interp {config.get('version')}")
    print(f"  encoding   {cfg.encoding_name} ({cfg.encoding_kind})")
    if getattr(
        cfg, "model_type", None
    ):  # a Hugging Face architecture (train --arch), read through a bridge
        print(
            f"  model      {cfg.model_type} (Hugging Face, its own norms and causal attention), {cfg.n_layers} layers, "
            f"d_model {cfg.d_model}, {cfg.n_heads} heads (d_head {cfg.d_head}), d_mlp {cfg.d_mlp}; class c is "
            f"answer token {task.d_vocab} + c at the last real token; {run_dir}/hf/ is its save_pretrained"
        )
    else:
        print(
            f"  model      {cfg.n_layers} layers, d_model {cfg.d_model}, {cfg.n_heads} heads (d_head {cfg.d_head}), "
            f"d_mlp {cfg.d_mlp}, act {cfg.act_fn}, norm {cfg.normalization_type}, final norm {cfg.final_norm}, "
            f"dropout {cfg.dropout}, init {cfg.init_mode}, pads {'masked' if cfg.mask_padding else 'attended'}, "
            f"K/V from {cfg.kv_source}"
        )
    print(
        f"  task       {task.name}: "
        + ", ".join(f"{k} {v}" for k, v in task.to_dict().items() if k != "name")
    )
    print(
        f"  training   {train.epochs} epochs of {train.n_train} ({train.n_test} held out), batch {train.batch_size}, "
        f"lr {train.lr} ({train.lr_schedule}), betas {train.betas}, seed {train.seed}"
    )
    if config.get("command"):
        print(f"  re-create  {config['command']}")
    numerics = config.get("numerics")
    if isinstance(numerics, dict):  # what the weights depend on besides the configs (issue 54)
        route = f", attention {numerics['attn_route']}" if numerics.get("attn_route") else ""
        resumed = f"; resumed with {numerics['resumed']}" if numerics.get("resumed") else ""
        print(
            f"  numerics   {numerics.get('dtype')} on {numerics.get('threads')} thread(s), "
            f"torch {numerics.get('torch')}, {numerics.get('gpu') or numerics.get('cpu')} "
            f"({numerics.get('cpu_capability')}){route}{resumed}"
        )


def _print_accuracy(loaded) -> None:
    """The last evaluation, whether training finished, and the task's chance and ceiling."""
    task, train = loaded.task, loaded.train_cfg
    metrics = loaded.metrics()
    if not metrics:
        print("accuracy     no evaluation recorded yet (metrics.jsonl is empty)")
        return
    last = metrics[-1]
    stopped = 0 < train.stop_at_acc <= last.get("test_acc", 0.0)
    state = (
        ""
        if last.get("step") == train.total_steps
        else f"  (stopped: held-out reached {_pct(train.stop_at_acc)})"
        if stopped
        else "  (unfinished: pe-interp train ... --resume)"
    )
    print(
        f"accuracy     held-out {_pct(last.get('test_acc'))} (loss {last.get('test_loss', math.nan):.4f}), "
        f"train {_pct(last.get('train_acc'))}, at step {last.get('step')} of {train.total_steps}"
        + state
    )
    print(
        f"             chance {_pct(task.chance_accuracy())}, length-only ceiling {_pct(task.length_only_accuracy())}"
    )


def _print_deposit(loaded, status: dict[str, tuple[str, str]]) -> None:
    """The single-head deposit verdict of ``ablation.json``, unless it is stale or partial."""
    import numpy as np

    from pe_interp.runs.checkpoint import STALE
    from probes import AblationResult, dominance

    results = loaded.result_dir
    if (
        status.get("ablation.json", (None,))[0] == STALE
    ):  # another model's verdict: not shown as this one's
        print(
            f"single-head deposit  STALE: ablation.json was {status['ablation.json'][1]}; rerun: pe-interp ablate {loaded.name}"
        )
    elif (results / "ablation.json").is_file():
        ablation = AblationResult.load(results / "ablation.json")
        if ablation.is_grid and not np.isnan(ablation.drops).any():
            d = dominance(ablation)
            verdict = "YES" if d.single else "no"
            print(
                f"single-head deposit  {verdict}: {d.text()} ({ablation.method}-ablation, {ablation.metric}, "
                f"{ablation.n_examples} examples)"
            )
            if ablation.metric == "accuracy" and not np.isnan(ablation.ci_low).any():
                from probes.deposit import decide_single

                print(f"  on its intervals   {decide_single(ablation).text()}")
        else:
            print(
                "single-head deposit  not judged: the ablation grid is partial (every head must be measured)"
            )
    else:
        print(f"single-head deposit  not measured (run: pe-interp ablate {loaded.name})")


def _print_concentration(results: Path, status: dict[str, tuple[str, str]]) -> None:
    """The layer concentration of ``deposits.json``, layer by layer, unless it is stale."""
    from pe_interp.runs.checkpoint import STALE, UNRECORDED
    from probes import DepositReport

    if status.get("deposits.json", (None,))[0] == STALE:
        print(f"layer concentration  STALE: deposits.json was {status['deposits.json'][1]}")
        return
    if not (results / "deposits.json").is_file():
        return
    report = DepositReport.load(results / "deposits.json")
    found = ", ".join(f"L{layer}H{h}" for layer, h in report.deposits) or "none"
    print(
        f"layer concentration  {found} (a layer's top head ≥ {100 * report.min_drop:.0f} pts and "
        f"≥ {100 * report.min_share:.0f}% of its layer's drop)"
    )
    for s in report.layers:
        mark = "concentrated" if s.is_deposit else "; ".join(s.failed)
        print(
            f"  layer {s.layer}    top H{s.top_head} drop {s.top_drop:.3f}, runner-up H{s.second_head} "
            f"{s.second_drop:.3f}, share {s.share:.2f}: {mark}"
        )
    if status["deposits.json"][0] == UNRECORDED:
        print(
            f"  (deposits.json {status['deposits.json'][1]}: rerun pe-interp ablate to tie it to these weights)"
        )


def _print_files(results: Path, status: dict[str, tuple[str, str]]) -> None:
    """Every result file but snapshots and steps, its size, and whether its weights are this run's."""
    from pe_interp.runs.checkpoint import STALE, UNRECORDED

    print("files")
    for p in sorted(
        q
        for q in results.rglob("*")
        if q.is_file()
        and not q.name.startswith(".")
        and q.relative_to(results).parts[0] not in ("snapshots", "steps")
    ):
        mark = {
            STALE: "  STALE: of other weights",
            UNRECORDED: "  (weights not recorded)",
            "unreadable": "  (unreadable)",
        }.get(status.get(str(p.relative_to(results)), (None,))[0], "")
        print(f"  {str(p.relative_to(results)):<40} {p.stat().st_size:>12,} bytes{mark}")


def _snapshots(run_dir: Path) -> None:
    """The snapshots a run kept, its dynamics, and the results computed at each step."""
    from pe_interp.runs.checkpoint import STEPS_DIR
    from pe_interp.runs.snapshots import read_manifest

    kept = read_manifest(run_dir)
    if not kept:
        return
    steps = [e["step"] for e in kept]
    shown = ", ".join(map(str, steps[:8])) + (f", ... {steps[-1]}" if len(steps) > 8 else "")
    print(
        f"snapshots    {len(kept)} kept (steps {shown}), {sum(e.get('bytes', 0) for e in kept) / 1e6:.1f} MB; "
        f"any command reads one as {run_dir}@STEP"
    )
    if (run_dir / "dynamics.json").is_file():
        print(f"  dynamics.json: every criterion at every snapshot (pe-interp dynamics {run_dir})")
    for d in sorted(
        (run_dir / STEPS_DIR).glob("*"), key=lambda p: int(p.name) if p.name.isdigit() else -1
    ):
        names = sorted(p.name for p in d.glob("*.json"))
        if names:
            print(f"  step {d.name:<6} {', '.join(names)}")
