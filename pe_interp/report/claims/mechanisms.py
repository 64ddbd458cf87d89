"""Claims about where and why: C14–C17 (the deposit's layer, its seed at initialisation, its margin, the generator)."""

from __future__ import annotations

from pe_interp.config.presets import build_run_configs
from pe_interp.report import gradients as grad
from pe_interp.report.claims.base import (
    CONTROLS,
    DOMINANT,
    PAPER_SETTING,
    Claim,
    Context,
    pts,
)
from pe_interp.report.claims.deposits import ablated, judge, rope_models
from pe_interp.report.data import (
    LARGE_DROP,
    NOT_MEASURED,
    NOT_REPRODUCED,
    SANITY_CHECK,
    SMALL_DROP,
    CellInfo,
    Dominance,
    dominance,
    margin_over_training,
    margins,
)


def _deposit_models(ctx: Context, cl: Claim) -> tuple[list[tuple[CellInfo, Dominance]], list[str]]:
    """Qualifying `rope` task-1 seeds that have a deposit (a single-head deposit), and evidence
    lines about the others; with none, ``cl.evidence`` says why the claim is not measured."""
    models, skipped = rope_models(ctx, cl)
    if not models:
        return [], []
    keep, out = [], list(skipped)
    for c in models:
        d = dominance(c.ablation)
        if d.single:
            keep.append((c, d))
        else:
            out.append(f"seed {c.seed} left out, no deposit: {d.text()}")
    if not keep:
        cl.evidence = (
            f"no qualifying `rope` task-1 seed has a deposit ({DOMINANT}; see C7), so there "
            "is no deposit to locate and the claim is not measured; " + "; ".join(out)
        )
    return keep, out


def _depth_note(models: list[CellInfo]) -> str:
    n = max((c.ablation.n_layers for c in models), default=0)
    if n <= 2:
        return (
            f"with {n} layer(s), “layer 0” is one of {n}: a weak test of “the shallowest layer(s)”; "
            f"{PAPER_SETTING}"
        )
    return ""


def c14(ctx: Context) -> Claim:
    cl = Claim(
        "C14",
        "The deposit is located in the shallowest layer (layer 0).",
        "[P][S]",
        f"judged only on the qualifying `rope` task-1 seeds (as C7) that have a deposit, i.e. "
        f"{DOMINANT}: reproduced when that head is in layer 0 in a strict majority of them; "
        "with no deposit there is nothing to locate, and the claim is not measured. The top "
        "head's layer in control encodings (nope, additive, decoupled_rope) and in "
        "sinusoidal+rope is listed for information, not judged; with ≤ 2 layers the "
        "evidence says the test is weak.",
    )
    found, others = _deposit_models(ctx, cl)
    if not found:
        return cl
    flags, parts = [], []
    for c, d in found:
        flags.append(d.layer == 0)
        parts.append(
            f"seed {c.seed}: deposit at L{d.layer}H{d.head} ({pts(d.drop)}, runner-up {pts(d.runner_up)})"
        )
    controls = [
        (lab, c, dominance(c.ablation))
        for lab in CONTROLS + ("sinusoidal+rope",)
        for c in ablated(ctx, lab, "distance")
    ]
    if controls:
        parts.append(
            "for information, top heads elsewhere on task 1: "
            + ", ".join(
                f"{lab} s{c.seed} L{d.layer}H{d.head} {pts(d.drop)}"
                + (" (single-head deposit)" if d.single else "")
                for lab, c, d in controls
            )
        )
        ctl = [d for lab, _, d in controls if lab in CONTROLS]
        if ctl and all(d.layer == 0 for d in ctl):
            parts.append(
                "every control's most harmful head is in layer 0 too, so at this size layer 0 "
                "is where the top head sits regardless of a deposit"
            )
    note = _depth_note([c for c, _ in found])
    return judge(cl, flags, parts + ([note] if note else []), others, "seeds with a deposit")


def c15(ctx: Context) -> Claim:
    # One criterion: the one `report.gradients.judge` applies, stated by `report.gradients.criterion`.
    g = ctx.gradients or {}
    n = int(g.get("n", grad.N_EXAMPLES))
    cl = Claim(
        "C15",
        "(Theory) Under RoPE the positional gradient has a deterministic non-zero seed at init; "
        "under ALiBi the batch-aggregated gradient cancels.",
        "[S]",
        grad.criterion(n),
    )
    if not g.get("available"):
        cl.evidence = g.get("reason", "probes.gradients.coherence is not available")
        return cl
    verdict = grad.judge(g["results"], n) if g.get("results") else g
    cl.status = verdict.get("status", NOT_MEASURED)
    cl.evidence = verdict.get("evidence", "")
    return cl


def c16(ctx: Context) -> Claim:
    cl = Claim(
        "C16",
        "(Theory) The dominant/runner-up head margin grows geometrically toward shallow layers.",
        "[S]",
        "partly measurable: head importance taken as the trained model's single-head "
        "ablation drop (not the theorem's gradient quantity). Judged only on the qualifying "
        f"`rope` task-1 seeds (as C7) that have a deposit ({DOMINANT}); with none, not "
        "measured. A seed passes when the per-layer margin (top drop − runner-up drop in the "
        "layer) is non-increasing with depth and larger in layer 0 than in the last layer; "
        "reproduced in a strict majority. A layer-0 deposit alone makes margin_0 ≥ 45 points "
        "and leaves every deeper head's drop ≤ 5 points, so “larger in layer 0” follows from "
        "C14; only the order of the deeper layers' margins is an extra test, and with 2 layers "
        "there is none (the evidence says so). The layer-0 margin over training (deposit "
        "dynamics) is listed as supporting evidence, not judged.",
    )
    found, others = _deposit_models(ctx, cl)
    if not found:
        return cl
    flags, parts = [], []
    for c, _ in found:
        m = margins(c.ablation)
        ok = all(m[i] >= m[i + 1] for i in range(len(m) - 1)) and m[0] > m[-1]
        flags.append(ok)
        ratios = [f"{m[i] / m[i + 1]:.2f}" if m[i + 1] > 1e-9 else "∞" for i in range(len(m) - 1)]
        text = (
            f"seed {c.seed}: margins by layer "
            + ", ".join(f"{100 * x:.1f}" for x in m)
            + f" pts (γ_l = margin_l/margin_l+1: {', '.join(ratios)})"
        )
        trend = _margin_trend(margin_over_training(c, 0))
        if trend:
            text += f"; layer-0 margin during training {trend}"
        parts.append(text)
    n_layers = max(c.ablation.n_layers for c, _ in found)
    if n_layers <= 2:
        parts.append(
            f"with {n_layers} layers the test is weak: a layer-0 deposit already gives margin_0 ≥ "
            f"{100 * (LARGE_DROP - SMALL_DROP):.0f} pts while every layer-1 drop is ≤ "
            f"{100 * SMALL_DROP:.0f} pts, so it adds nothing beyond C14; {PAPER_SETTING}"
        )
    return judge(cl, flags, parts, others, "seeds with a deposit")


def _margin_trend(vals: list[tuple[int, float]]) -> str:
    """``(step, margin)`` pairs as "step a: x → step b: y → step c: z pts" (first, middle, last)."""
    if len(vals) < 2:
        return ""
    (s0, v0), (s1, v1) = vals[0], vals[-1]
    mid = vals[len(vals) // 2]
    return f"step {s0}: {100 * v0:.1f} → step {mid[0]}: {100 * mid[1]:.1f} → step {s1}: {100 * v1:.1f} pts"


def c17(ctx: Context) -> Claim:
    cl = Claim(
        "C17",
        "Task-1 chance is 1.43%; a length-only Bayes ceiling is 5.37%.",
        "[R]",
        "sanity check, not a finding: the paper preset's distance task was sized from the "
        "authors' generator (70 distance classes, so chance is 1/70), so this holds by "
        "construction and checks this code, not the paper. Status “sanity check” when the "
        "exact baselines of the paper-size task (`--preset paper`, computed analytically from "
        "the generator) equal 1.43% and 5.37% to two decimals, “not reproduced” (the code is "
        "wrong) when they do not.",
    )
    try:
        _, task, _ = build_run_configs("distance", "nope", "paper")
        ch, lo = task.chance_accuracy(), task.length_only_accuracy()
    except Exception as err:  # noqa: BLE001 - reported as not measured
        cl.evidence = f"could not build the paper-size task ({type(err).__name__}: {err})"
        return cl
    ok = round(100 * ch, 2) == 1.43 and round(100 * lo, 2) == 5.37
    cl.status = SANITY_CHECK if ok else NOT_REPRODUCED
    here = ctx.baselines.get("distance")
    extra = (
        f"; at this preset ({ctx.preset}): chance {100 * here['chance']:.2f}%, length-only {100 * here['length_only']:.2f}%"
        if here
        else ""
    )
    verdict = (
        "the check passes (it holds by construction; it confirms the baselines code, not the paper)"
        if ok
        else "the sanity check FAILS: the generator or the baselines code differs from the authors'"
    )
    cl.evidence = (
        f"paper-size task: chance {100 * ch:.2f}%, length-only {100 * lo:.2f}%{extra}; {verdict}"
    )
    return cl
