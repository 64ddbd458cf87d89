"""``pe-interp decompose RUN_DIR --layer L --head H``: one head's attention logits, term by term.

On one held-out example, splits the head's pre-softmax logits into content / position / offset
Gram terms and the relative bias (layer 0), or ``qk`` + relative bias (deeper layers), plus the
per-frequency RoPE terms (see :mod:`probes.decomposition`); also scores every head of the model
for position-only structure. Writes

- ``RUN_DIR/decompose_L<l>H<h>.json`` (terms summary, errors, positional scores);
- ``RUN_DIR/figures/logit_terms_L<l>H<h>.png`` (one heatmap per term, the sum and the actual
  logits), ``..._grouped.png``, ``rope_terms_L<l>H<h>.png`` for rotary heads;
- ``RUN_DIR/figures/attention_L<l>H<h>.html`` (offline circuitsvis attention pattern).

Without ``--head`` the layer's most positional head (highest positional score) is used.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from pe_interp.commands.options import (
    add_device_flag,
    add_model_dir_flags,
    device_arg,
    model_dir_arg,
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "decompose",
        help="split one head's attention logits into content/position terms",
        description="Decompose one head's pre-softmax attention logits into content, position and "
        "bias terms (and RoPE frequency terms), and score every head for positional structure.",
    )
    p.add_argument(
        "run_dir", metavar="RUN_DIR", help="a run directory written by `pe-interp train`"
    )
    p.add_argument("--layer", type=int, default=0)
    p.add_argument(
        "--head", type=int, default=None, help="default: the layer's most positional head"
    )
    p.add_argument("--example", type=int, default=0, help="held-out example to decompose")
    p.add_argument("--n", type=int, default=64, help="held-out examples for the positional scores")
    add_device_flag(p)
    add_model_dir_flags(p)
    p.add_argument("--no-figures", action="store_true")
    p.set_defaults(run=run)


def decompose_run(
    model,
    batch,
    out_dir: str | Path,
    *,
    layer: int = 0,
    head: int | None = None,
    example: int = 0,
    task: Any = None,
    figures: bool = True,
    weights: dict[str, Any] | None = None,
) -> tuple[Any, Any, dict[str, Path]]:
    """The work of ``pe-interp decompose`` on a model and a batch (``tokens``, ``pad_mask``);
    ``weights``: the run's provenance (``Run.provenance``), recorded in the JSON file."""
    from pe_interp.runs.checkpoint import save_result
    from probes.decomposition import logit_terms, positional_scores

    cfg = model.cfg
    if not 0 <= layer < cfg.n_layers:
        raise ValueError(f"--layer must be in 0..{cfg.n_layers - 1}, got {layer}")
    if head is not None and not 0 <= head < cfg.n_heads:
        raise ValueError(f"--head must be in 0..{cfg.n_heads - 1}, got {head}")
    if not 0 <= example < batch.tokens.shape[0]:
        raise ValueError(f"--example must be in 0..{batch.tokens.shape[0] - 1}, got {example}")
    scores = (
        positional_scores(model, batch.tokens, pad_mask=batch.pad_mask)
        if batch.tokens.shape[0] >= 2
        else None
    )
    if head is None:
        if scores is None:
            raise ValueError("--head is required with fewer than 2 examples")
        head = scores.argmax(layer)[1]
    terms = logit_terms(model, batch.tokens, layer, head, pad_mask=batch.pad_mask, example=example)
    out_dir = Path(out_dir)
    tag = f"L{layer}H{head}"
    payload = terms.to_dict()
    payload["positional_scores"] = None if scores is None else scores.to_dict()
    payload["model_encoding"] = str(getattr(cfg, "encoding_name", None) or cfg.encoding)
    written = {"json": out_dir / f"decompose_{tag}.json"}
    save_result(written["json"], payload, weights, indent=2)
    if figures:
        from probes.common.html import save_html
        from probes.decomposition.view import plot_logit_terms, plot_rope_terms
        from probes.heads.view import attention_html

        fig_dir = out_dir / "figures"
        written["terms"] = plot_logit_terms(terms, fig_dir / f"logit_terms_{tag}.png")
        written["grouped"] = plot_logit_terms(
            terms, fig_dir / f"logit_terms_{tag}_grouped.png", grouped=True
        )
        if terms.rope is not None:
            written["rope"] = plot_rope_terms(terms, fig_dir / f"rope_terms_{tag}.png")
        html = attention_html(
            model,
            batch.tokens,
            [(layer, head)],
            example=example,
            pad_mask=batch.pad_mask,
            task=task,
        )
        written["html"] = save_html(
            html, fig_dir / f"attention_{tag}.html", title=f"{tag}, example {example}"
        )
    return terms, scores, written


def run(args: argparse.Namespace) -> int:
    from pe_interp.commands.destinations import writing_run

    if args.n < 1:
        raise ValueError(f"--n must be >= 1, got {args.n}")
    with writing_run(args.run_dir, device=device_arg(args.device), **model_dir_arg(args)) as loaded:
        return _decompose(args, loaded)


def _decompose(args: argparse.Namespace, loaded) -> int:
    data = loaded.test_set(max(args.n, args.example + 1))
    t0 = time.perf_counter()
    terms, scores, written = decompose_run(
        loaded.model,
        data,
        loaded.result_dir,
        layer=args.layer,
        head=args.head,
        example=args.example,
        task=loaded.task,
        figures=not args.no_figures,
        weights=loaded.provenance,
    )
    print(
        f"{loaded.name}: L{terms.layer}H{terms.head} on example {terms.example}, {time.perf_counter() - t0:.1f} s"
    )
    print(f"  terms sum to the logits within {terms.check():.2e}")
    for name, share in terms.variance_shares().items():
        print(f"  {name:<20} variance share {share:6.3f}")
    if terms.rope is not None:
        top = terms.rope.frequency_share().argmax()
        print(
            f"  RoPE: pair {int(top)} (theta={float(terms.rope.theta[top]):.3g}) carries the most"
        )
    if scores is not None:
        lay, hd = scores.argmax()
        print(
            f"  most positional head: L{lay}H{hd} (score {float(scores.scores[lay, hd]):.3f}: position-only "
            "structure of its logits, also where it is read from an earlier head)"
        )
        entry = scores.entry()
        if entry is not None:
            print(
                f"  where position enters: L{entry[0]}H{entry[1]} (the encoding's own term is "
                f"{float(scores.direct[entry]):.3f} of its logit variance; 0 in a head the encoding does not touch)"
            )
    print("wrote " + ", ".join(str(p) for p in written.values()))
    return 0
