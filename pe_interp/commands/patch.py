"""``pe-interp patch RUN_DIR``: activation patching of a trained run on its task's counterfactual pairs.

Clean/corrupt pairs come from ``task.counterfactual_pairs(n, seed)``; the metric is the normalised
logit difference between the clean and corrupt labels (clean run = 1, corrupt run = 0). Writes

- ``RUN_DIR/patching.json`` (the latest result) and ``RUN_DIR/patching_<site>[_by_pos].json``;
- ``RUN_DIR/figures/patching_<site>[_by_pos].png``: heatmap of the values;
- ``RUN_DIR/figures/patching_<site>[_by_pos].html`` (offline): for by-position results the
  tokens of one pair coloured by that pair's patching effect; otherwise circuitsvis attention
  patterns of the most important heads on that pair.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from pe_interp.commands.options import (
    add_device_flag,
    add_model_dir_flags,
    device_arg,
    model_dir_arg,
    seed_type,
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "patch",
        help="activation patching on counterfactual pairs",
        description="Patch clean activations into corrupt runs (or the reverse) for every head / "
        "position of a trained run and measure the recovered logit difference.",
    )
    p.add_argument(
        "run_dir", metavar="RUN_DIR", help="a run directory written by `pe-interp train`"
    )
    p.add_argument(
        "--site",
        default="z",
        choices=["z", "q", "k", "v", "pattern", "resid_pre", "attn_out", "mlp_out"],
    )
    p.add_argument(
        "--by-position",
        dest="by_position",
        action="store_true",
        default=None,
        help="one cell per position (default: per head for head sites, per position otherwise)",
    )
    p.add_argument(
        "--all-positions",
        dest="by_position",
        action="store_false",
        help="patch all positions at once",
    )
    p.add_argument(
        "--direction", default="clean_to_corrupt", choices=["clean_to_corrupt", "corrupt_to_clean"]
    )
    p.add_argument("--n", type=int, default=128, help="counterfactual pairs")
    p.add_argument("--seed", type=seed_type, default=0, help="seeds the pairs and the bootstrap")
    p.add_argument("--layers", type=int, nargs="+", default=None)
    p.add_argument("--batch-size", type=int, default=256, help="rows (cells x pairs) per forward")
    p.add_argument("--n-bootstrap", type=int, default=1000)
    p.add_argument("--example", type=int, default=0, help="pair shown in the HTML view")
    add_device_flag(p)
    add_model_dir_flags(p)
    p.add_argument("--no-figures", action="store_true")
    p.set_defaults(run=run)


def result_key(site: str, by_position: bool) -> str:
    return f"{site}_by_pos" if by_position else site


def patch_run(
    model,
    task,
    out_dir: str | Path,
    *,
    site: str = "z",
    by_position: bool | None = None,
    direction: str = "clean_to_corrupt",
    n: int = 128,
    seed: int = 0,
    layers: list[int] | None = None,
    batch_size: int = 256,
    n_bootstrap: int = 1000,
    example: int = 0,
    figures: bool = True,
    weights: dict[str, Any] | None = None,
) -> tuple[Any, dict[str, Path]]:
    """The work of ``pe-interp patch`` on a model and task; returns the result and written files.
    ``weights``: the run's provenance (``Run.provenance``), recorded in the JSON files."""
    from pe_interp.runs.checkpoint import save_result
    from probes.patching.sweep import RESULT_KIND, patch

    if n < 1:
        raise ValueError(f"--n must be >= 1, got {n}")
    pairs = task.counterfactual_pairs(n, seed=seed)
    clean, corrupt = pairs.clean, pairs.corrupt
    if not 0 <= example < len(clean):
        raise ValueError(f"--example must be in 0..{len(clean) - 1}, got {example}")
    result = patch(
        model,
        clean.tokens,
        corrupt.tokens,
        site=site,
        by_position=by_position,
        direction=direction,
        clean_labels=clean.labels,
        corrupt_labels=corrupt.labels,
        pad_mask=clean.pad_mask,
        layers=layers,
        batch_size=batch_size,
        n_bootstrap=n_bootstrap,
        seed=seed,
        progress=True,
    )
    out_dir = Path(out_dir)
    key = result_key(site, result.by_position)
    payload = result.to_dict()
    payload.update(
        pairs={
            "n": len(clean),
            "seed": seed,
            "task": task.to_dict() if hasattr(task, "to_dict") else str(task),
        },
        encoding=model.cfg.encoding_name,
    )
    written: dict[str, Path] = {}
    for name in ("patching.json", f"patching_{key}.json"):
        save_result(out_dir / name, payload, weights, indent=2, kind=RESULT_KIND)
        written[name] = out_dir / name
    if figures:
        written.update(_figures(model, task, result, pairs, key, example, out_dir / "figures"))
    return result, written


def _figures(model, task, result, pairs, key: str, example: int, fig_dir: Path) -> dict[str, Path]:
    """The heatmap, and the page of one pair: its tokens coloured by their effect (by position),
    else the attention of the top patched heads."""
    from probes.common.html import save_html
    from probes.heads.patterns import token_labels
    from probes.heads.view import attention_html
    from probes.patching.view import patching_tokens_html, plot_patching

    clean, corrupt = pairs.clean, pairs.corrupt
    written = {"png": plot_patching(result, fig_dir / f"patching_{key}.png")[0]}
    labels = token_labels(clean.tokens[example], clean.pad_mask[example], task, model.cfg.pad_id)
    if result.by_position and result.per_example is not None:
        html = patching_tokens_html(result, labels, example=example)
        title = f"patching {key}, pair {example}: clean label {int(clean.labels[example])}, corrupt label {int(corrupt.labels[example])}"
    else:
        heads = _top_heads(result, 4)
        if heads:
            html = attention_html(
                model,
                clean.tokens,
                heads,
                example=example,
                pad_mask=clean.pad_mask,
                labels=labels,
            )
            title = f"attention of the top patched heads ({', '.join(f'L{a}H{b}' for a, b in heads)}), clean pair {example}"
        else:
            html, title = "<p>no head-level cells</p>", f"patching {key}"
    written["html"] = save_html(html, fig_dir / f"patching_{key}.html", title=title)
    return written


def _top_heads(result, k: int) -> list[tuple[int, int]]:
    heads = []
    for cell, _ in result.top(k * 4):
        if "head" in cell and (cell["layer"], cell["head"]) not in heads:
            heads.append((cell["layer"], cell["head"]))
    return heads[:k]


def run(args: argparse.Namespace) -> int:
    from pe_interp.commands.destinations import writing_run
    from pe_interp.commands.options import at_least, bootstrap_arg

    at_least(args.n_bootstrap, 0, "--n-bootstrap")
    bootstrap_arg(args.n_bootstrap)
    with writing_run(args.run_dir, device=device_arg(args.device), **model_dir_arg(args)) as loaded:
        return _patch(args, loaded)


def _patch(args: argparse.Namespace, loaded) -> int:
    t0 = time.perf_counter()
    result, written = patch_run(
        loaded.model,
        loaded.task,
        loaded.result_dir,
        site=args.site,
        by_position=args.by_position,
        direction=args.direction,
        n=args.n,
        seed=args.seed,
        layers=args.layers,
        batch_size=args.batch_size,
        n_bootstrap=args.n_bootstrap,
        example=args.example,
        figures=not args.no_figures,
        weights=loaded.provenance,
    )
    elapsed = time.perf_counter() - t0
    print(
        f"{loaded.name}: patched {result.site} ({'by position' if result.by_position else 'all positions'}, "
        f"{result.direction}) on {result.n_examples} pairs, grid {list(result.shape)}, {elapsed:.1f} s"
    )
    z = result.extra.get("denominator_z")
    if z is not None and abs(z) < 3:  # None: no spread (one pair, or identical differences)
        print(
            f"  warning: the clean and corrupt logit differences barely differ (normaliser = {z:.1f} "
            "standard errors), so normalised values are noisy; is the model trained?"
        )
    for cell, value in result.top(5):
        where = " ".join(f"{k}={v}" for k, v in cell.items())
        print(f"  {where}: {value:+.3f}")
    print("wrote " + ", ".join(str(p) for p in written.values()))
    print(json.dumps({"max": float(result.values.max()), "min": float(result.values.min())}))
    return 0
