"""The paper's checkable claims C1–C17 (paper digest §10), each judged against this run.

Every criterion is fixed here, up front, from the claim's text and the digest's suggested
tolerance, and stated in the report next to the verdict. Nothing is adjusted to the numbers a run
happens to produce: a claim that does not hold at a small preset is reported as not reproduced,
with the size the paper used.

Conventions used by all criteria:

- accuracy is held-out accuracy (``final.test_acc``), averaged over the seeds present;
- an ablation "drop" is the single-head zero-ablation drop in accuracy points measured by
  ``probes.ablation`` on held-out examples;
- a "large" drop is >= 50 points (the digest's C7 tolerance for the reported "about 60 points");
- claims about *where* the RoPE model's positional processing sits (C7, C8, C14, C16) are judged
  only on seeds whose `rope` task-1 model learned the task, i.e. does not "fail" by C2's
  criterion (ablation baseline > length-only ceiling + 5 points); with no such seed the claim is
  not measured;
- "no deposit" claims (C9–C11) are judged only on models whose baseline accuracy is >= 50%: a
  model below that cannot show a 50-point drop, so it is listed but proves nothing;
- a claim about one model holds when it holds in a strict majority of its (qualifying) seeds; a
  "no deposit" claim must hold in every qualifying seed of every model it names;
- a conjunctive claim is **not reproduced** as soon as a measured part fails, and **not
  measured** when the measured parts pass but a part it needs was not run.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pe_interp.report.data import LARGE_DROP, AccStat, CellInfo, read_dynamics

REPRODUCED, NOT_REPRODUCED, NOT_MEASURED = "reproduced", "not reproduced", "not measured"
STATUSES = (REPRODUCED, NOT_REPRODUCED, NOT_MEASURED)

# The paper's six PEs of Table 1 as trained by the authors' trans.py (digest §4.1), by our labels.
PAPER_SIX = ("nope", "sinusoidal", "learned", "t5", "alibi", "rope")
ADDITIVE = ("sinusoidal", "learned", "t5", "alibi")
ABSOLUTE = ("sinusoidal", "learned")

PAPER_SETTING = (
    "the paper's setting is 6 layers, d_model 256, 16 heads, distances up to 71, 100 epochs "
    "(`pe-interp reproduce --preset paper`, on a GPU)"
)


@dataclass
class Claim:
    id: str
    text: str
    source: str
    criterion: str
    status: str = NOT_MEASURED
    evidence: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "claim": self.text, "source": self.source, "criterion": self.criterion,
                "status": self.status, "evidence": self.evidence}


@dataclass
class Context:
    cells: list[CellInfo]
    acc: dict[tuple[str, str], AccStat]
    baselines: dict[str, dict[str, float]]
    preset: str
    gradients: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)

    def mean(self, label: str, task: str) -> float | None:
        s = self.acc.get((label, task))
        return None if s is None else s.mean

    def models(self, label: str, task: str) -> list[CellInfo]:
        return sorted((c for c in self.cells if c.label == label and c.task == task), key=lambda c: c.seed)


def pct(x: float | None) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f}%"


def pts(x: float | None) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f} pts"


def _acc_str(ctx: Context, label: str, task: str) -> str:
    s = ctx.acc.get((label, task))
    if s is None:
        return f"{label}: not run"
    return f"{label} {100 * s.mean:.1f} ± {100 * s.std:.1f}% (n={s.n})"


def _majority(flags: list[bool]) -> bool:
    return sum(flags) * 2 > len(flags)


def _missing(ctx: Context, labels: tuple[str, ...] | list[str], task: str) -> list[str]:
    return [lab for lab in labels if (lab, task) not in ctx.acc]


def _verdict(ok: bool | None, missing: list[str]) -> str:
    """Conjunctive rule: a failed measured part beats a missing one."""
    if ok is False:
        return NOT_REPRODUCED
    if missing or ok is None:
        return NOT_MEASURED
    return REPRODUCED


# ------------------------------------------------------------------------------------------------
# accuracy claims
# ------------------------------------------------------------------------------------------------
def c1(ctx: Context) -> Claim:
    cl = Claim("C1", "On Task 1, RoPE reaches 92.64% test accuracy, the best of all PEs.", "[S]",
               "`rope` task-1 mean ≥ 90% (digest: expect about 90–95%) AND above the mean of every "
               "non-RoPE encoding run (nope, sinusoidal, learned, t5, alibi, decoupled_rope). "
               "Other RoPE variants (sinusoidal+rope, partial rope) are RoPE and not compared.")
    rope = ctx.mean("rope", "distance")
    others = [lab for lab in ("nope", "sinusoidal", "learned", "t5", "alibi", "decoupled_rope")
              if (lab, "distance") in ctx.acc]
    if rope is None or not others:
        cl.evidence = "needs `rope` and at least one other encoding on task 1"
        return cl
    best_other = max(others, key=lambda lab: ctx.mean(lab, "distance"))
    level = rope >= 0.90
    best = all(rope > ctx.mean(lab, "distance") for lab in others)
    parts = [f"{_acc_str(ctx, 'rope', 'distance')} (paper 92.64%): level {'≥' if level else '<'} 90%",
             f"best other: {_acc_str(ctx, best_other, 'distance')} → RoPE {'is' if best else 'is not'} best"]
    if ("sinusoidal+rope", "distance") in ctx.acc:
        parts.append(f"(authors' 'rope' = APE+RoPE: {_acc_str(ctx, 'sinusoidal+rope', 'distance')})")
    cl.status = _verdict(level and best, _missing(ctx, ("nope", "sinusoidal", "learned", "t5", "alibi"), "distance"))
    cl.evidence = "; ".join(parts)
    return cl


def c2(ctx: Context) -> Claim:
    lo = ctx.baselines.get("distance", {}).get("length_only")
    cl = Claim("C2", "On Task 1, NoPE and ALiBi “fail”.", "[S]",
               "each of `nope` and `alibi` has task-1 mean ≤ the task's length-only Bayes ceiling "
               "+ 5 points (a model that reads no positions cannot beat that ceiling).")
    if lo is None:
        cl.evidence = "no task-1 runs"
        return cl
    parts, oks = [], []
    for lab in ("nope", "alibi"):
        m = ctx.mean(lab, "distance")
        if m is None:
            parts.append(f"{lab}: not run")
            continue
        ok = m <= lo + 0.05
        oks.append(ok)
        parts.append(f"{_acc_str(ctx, lab, 'distance')} {'≤' if ok else '>'} {pct(lo)} + 5 pts")
    alibi = _alibi_slopes(ctx)
    if alibi:
        parts.append(f"alibi slopes: {alibi}")
    cl.status = _verdict(all(oks) if oks else None, _missing(ctx, ("nope", "alibi"), "distance"))
    cl.evidence = "; ".join(parts) + f" (length-only ceiling {pct(lo)}, chance {pct(ctx.baselines['distance']['chance'])})"
    return cl


def _alibi_slopes(ctx: Context) -> str:
    for c in ctx.cells:
        if c.label == "alibi" and c.config:
            for spec in c.config.get("model", {}).get("encoding", []):
                if isinstance(spec, dict) and spec.get("name") == "alibi":
                    return str(spec.get("slopes", "standard (2^(-8h/H))"))
    return ""


def _rank(ctx: Context, task: str, labels: tuple[str, ...]) -> list[str]:
    present = [lab for lab in labels if (lab, task) in ctx.acc]
    return sorted(present, key=lambda lab: -ctx.mean(lab, task))


def c3(ctx: Context) -> Claim:
    cl = Claim("C3", "On Task 1, absolute PE is second best, below RoPE.", "[S]",
               "ranking the paper's six PEs (nope, sinusoidal, learned, t5, alibi, rope) by task-1 "
               "mean: `rope` first and an absolute PE second. The summaries do not say whether "
               "“Absolute” is sinusoidal or learned, so the better of the two counts.")
    order = _rank(ctx, "distance", PAPER_SIX)
    if "rope" not in order or not any(a in order for a in ABSOLUTE):
        cl.evidence = "needs `rope` and `sinusoidal` or `learned` on task 1"
        return cl
    abs_best = max((a for a in ABSOLUTE if a in order), key=lambda a: ctx.mean(a, "distance"))
    others = [lab for lab in order if lab not in ABSOLUTE or lab == abs_best]
    ok = others[:2] == ["rope", abs_best]
    cl.status = _verdict(ok, _missing(ctx, PAPER_SIX, "distance"))
    cl.evidence = "task-1 ranking: " + " > ".join(f"{lab} {pct(ctx.mean(lab, 'distance'))}" for lab in order)
    return cl


def c4(ctx: Context) -> Claim:
    cl = Claim("C4", "On Task 2, RoPE gets 69.43%, below NoPE's 77.69%.", "[S]",
               "task-2 mean of `nope` exceeds `rope` by ≥ 2 points (smaller gaps are within typical "
               "seed-to-seed spread); the paper's gap is 8.3 points.")
    n, r = ctx.mean("nope", "count"), ctx.mean("rope", "count")
    if n is None or r is None:
        cl.evidence = "needs `nope` and `rope` on task 2"
        return cl
    gap = n - r
    cl.status = REPRODUCED if gap >= 0.02 else NOT_REPRODUCED
    cl.evidence = f"{_acc_str(ctx, 'nope', 'count')}, {_acc_str(ctx, 'rope', 'count')}: NoPE − RoPE = {pts(gap)} (paper 8.3 pts)"
    return cl


def c5(ctx: Context) -> Claim:
    cl = Claim("C5", "On Task 2, ALiBi is the worst PE.", "[S]",
               "`alibi` has the lowest task-2 mean of the paper's six PEs.")
    order = _rank(ctx, "count", PAPER_SIX)
    if "alibi" not in order or len(order) < 2:
        cl.evidence = "needs `alibi` and another of the six PEs on task 2"
        return cl
    ok = order[-1] == "alibi"
    cl.status = _verdict(ok, _missing(ctx, PAPER_SIX, "count"))
    cl.evidence = "task-2 ranking: " + " > ".join(f"{lab} {pct(ctx.mean(lab, 'count'))}" for lab in order) + (
        f"; alibi slopes: {_alibi_slopes(ctx)}" if _alibi_slopes(ctx) else "")
    return cl


def c6(ctx: Context) -> Claim:
    cl = Claim("C6", "MLA gets 88.34% (Task 1) and 97.41% (Task 2), near-best on both.", "[S]",
               "`decoupled_rope` (MLA-style decoupled RoPE; not the authors' full MLA, which differs "
               "in many ways, digest §9.4) is within 5 points of the best mean on each task.")
    parts, oks = [], []
    for task, paper in (("distance", "88.34%"), ("count", "97.41%")):
        m = ctx.mean("decoupled_rope", task)
        tasks_present = [k for k in ctx.acc if k[1] == task]
        if m is None or not tasks_present:
            parts.append(f"{task}: decoupled_rope not run")
            continue
        best = max(tasks_present, key=lambda k: ctx.acc[k].mean)
        ok = m >= ctx.acc[best].mean - 0.05
        oks.append(ok)
        parts.append(f"{task}: {_acc_str(ctx, 'decoupled_rope', task)} (paper {paper}) vs best "
                     f"{best[0]} {pct(ctx.acc[best].mean)} → {'within' if ok else 'not within'} 5 pts")
    missing = [t for t in ("distance", "count") if ctx.mean("decoupled_rope", t) is None]
    cl.status = _verdict(all(oks) if oks else None, missing)
    cl.evidence = "; ".join(parts)
    return cl


# ------------------------------------------------------------------------------------------------
# ablation claims
# ------------------------------------------------------------------------------------------------
def _ablated(ctx: Context, label: str, task: str) -> list[CellInfo]:
    return [c for c in ctx.models(label, task) if c.ablation is not None]


def _learned(ctx: Context, c: CellInfo) -> bool:
    """Did this task-1 model learn the task (baseline above the length-only ceiling + 5 pts)?"""
    lo = ctx.baselines.get(c.task, {}).get("length_only", 0.0)
    return c.ablation.baseline > lo + 0.05


def _rope_models(ctx: Context, cl: Claim) -> tuple[list[CellInfo], list[str]]:
    """Qualifying `rope` task-1 models, and evidence lines about the ones left out."""
    models = _ablated(ctx, "rope", "distance")
    if not models:
        cl.evidence = "needs the head-ablation sweep of `rope` on task 1"
        return [], []
    lo = ctx.baselines.get("distance", {}).get("length_only", 0.0)
    keep = [c for c in models if _learned(ctx, c)]
    skipped = [f"seed {c.seed} left out: baseline {pct(c.ablation.baseline)} ≤ length-only ceiling "
               f"{pct(lo)} + 5 pts (did not learn the task)" for c in models if not _learned(ctx, c)]
    if not keep:
        cl.evidence = ("no `rope` task-1 seed learned the task, so where its positional processing sits "
                       "cannot be measured; " + "; ".join(skipped))
    return keep, skipped


def _judge(cl: Claim, flags: list[bool], parts: list[str], skipped: list[str]) -> Claim:
    cl.status = REPRODUCED if _majority(flags) else NOT_REPRODUCED
    cl.evidence = f"{sum(flags)}/{len(flags)} qualifying seeds pass; " + "; ".join(parts + skipped)
    return cl


def c7(ctx: Context) -> Claim:
    cl = Claim("C7", "Ablating one first-layer head of the Task-1 RoPE model drops accuracy by about 60 points.",
               "[S][3P]",
               "in a majority of qualifying `rope` task-1 seeds, exactly one head of the whole model "
               "has a zero-ablation drop ≥ 50 points, and it is in layer 0.")
    models, skipped = _rope_models(ctx, cl)
    if not models:
        return cl
    flags, parts = [], []
    for c in models:
        a = c.ablation
        big = a.large_heads()
        layer, head, drop = a.top()
        flags.append(len(big) == 1 and big[0][0] == 0)
        room = "" if a.baseline >= LARGE_DROP else ", baseline leaves no room for a 50-pt drop"
        flag = c.flag
        detector = "" if flag.found is None else (
            "; probes.deposit flags " + (", ".join(f"L{x}H{y}" for x, y in flag.heads) if flag.heads else "none"))
        parts.append(f"seed {c.seed}: baseline {pct(a.baseline)}, top head L{layer}H{head} drop {pts(drop)} "
                     f"({100 * drop / a.baseline:.0f}% of baseline), heads ≥ 50 pts: {len(big)}{room}{detector}")
    return _judge(cl, flags, parts, skipped)


def c8(ctx: Context) -> Claim:
    cl = Claim("C8", "Ablating any other single head of the Task-1 RoPE model changes accuracy negligibly.", "[S]",
               "in a majority of qualifying `rope` task-1 seeds, every head except the one with the "
               "largest drop has a drop ≤ 5 points.")
    models, skipped = _rope_models(ctx, cl)
    if not models:
        return cl
    flags, parts = [], []
    for c in models:
        layer, head, drop = c.ablation.top()
        other = c.ablation.max_other(layer, head)
        flags.append(other <= 0.05)
        parts.append(f"seed {c.seed}: top L{layer}H{head} {pts(drop)}, largest other drop {pts(other)}")
    return _judge(cl, flags, parts, skipped)


def _no_deposit_claim(cl: Claim, ctx: Context, pairs: list[tuple[str, str]],
                      extra: tuple[tuple[str, str], ...] = ()) -> Claim:
    """"No head has a drop ≥ 50 points", in every seed with baseline ≥ 50% of every model named."""
    ok: bool | None = None
    parts, missing = [], []
    for label, task in list(pairs) + list(extra):
        models = _ablated(ctx, label, task)
        if not models:
            if (label, task) in pairs:
                missing.append(f"{label}/{task}")
            continue
        judged = (label, task) in pairs
        texts = []
        for c in models:
            layer, head, drop = c.ablation.top()
            room = c.ablation.baseline >= LARGE_DROP
            if judged and room:
                clean = not c.ablation.large_heads()
                ok = clean if ok is None else (ok and clean)
            texts.append(f"s{c.seed} {pts(drop)} at L{layer}H{head} of {pct(c.ablation.baseline)}"
                         + ("" if room else " (no room)"))
        parts.append(("" if judged else "for information: ") + f"{label}/{task} max drop: " + ", ".join(texts))
    if ok is None and not missing:
        cl.evidence = ("no model named has a baseline ≥ 50%, so none could show a 50-point drop: not "
                       "informative. " + "; ".join(parts))
        return cl
    if ok is None:
        cl.evidence = "needs head-ablation sweeps of " + ", ".join(missing) + (
            ("; " + "; ".join(parts)) if parts else "")
        return cl
    cl.status = _verdict(ok, missing)
    cl.evidence = "; ".join(parts) + (f"; not run: {', '.join(missing)}" if missing else "")
    return cl


def c9(ctx: Context) -> Claim:
    cl = Claim("C9", "No deposit for NoPE on Task 1, or for RoPE on Task 2.", "[S]",
               "no head of `nope`/task 1 or of `rope`/task 2 has a drop ≥ 50 points, in any seed "
               "whose baseline is ≥ 50% (below that a 50-point drop is impossible).")
    return _no_deposit_claim(cl, ctx, [("nope", "distance"), ("rope", "count")])


def c10(ctx: Context) -> Claim:
    cl = Claim("C10", "Additive PEs (absolute / T5 / ALiBi) show no single-head concentration.", "[3P]",
               "no head of `sinusoidal`, `learned`, `t5` or `alibi` on task 1 has a drop ≥ 50 "
               "points, in any seed whose baseline is ≥ 50% (task 2 listed for information).")
    return _no_deposit_claim(cl, ctx, [(lab, "distance") for lab in ADDITIVE],
                             tuple((lab, "count") for lab in ADDITIVE))


def c11(ctx: Context) -> Claim:
    cl = Claim("C11", "MLA shows no deposit pattern.", "[S]",
               "no head of `decoupled_rope` on task 1 has a drop ≥ 50 points, in any seed whose "
               "baseline is ≥ 50% (our ablation zeroes each head's own output, the correct per-head "
               "ablation that the authors' MLA script lacked; task 2 for information).")
    return _no_deposit_claim(cl, ctx, [("decoupled_rope", "distance")], (("decoupled_rope", "count"),))


def c12(ctx: Context) -> Claim:
    cl = Claim("C12", "RoPE on only 1 head keeps about 90% on Task 1; 2 heads about 90%+.", "[S]",
               "task-1 mean ≥ 85% (about 90%, ±5) for both `rope (1 head)` and `rope (2 heads)`.")
    parts, oks = [], []
    full = ctx.mean("rope", "distance")
    for lab in ("rope (1 head)", "rope (2 heads)"):
        m = ctx.mean(lab, "distance")
        if m is None:
            parts.append(f"{lab}: not run")
            continue
        oks.append(m >= 0.85)
        rel = f", {100 * m / full:.0f}% of full RoPE's {pct(full)}" if full else ""
        parts.append(f"{_acc_str(ctx, lab, 'distance')}{rel}")
    cl.status = _verdict(all(oks) if oks else None, _missing(ctx, ("rope (1 head)", "rope (2 heads)"), "distance"))
    cl.evidence = "; ".join(parts)
    return cl


def c13(ctx: Context) -> Claim:
    cl = Claim("C13", "In an Absolute + RoPE model, additive positional directions are gone after layer 2.", "[S]",
               "would need a per-layer probe of the residual stream for the absolute-PE directions; "
               "the paper's method is not known (digest: NOT FOUND) and no such probe is run here.")
    cl.evidence = "no residual-stream probe for APE directions in this reproduction"
    return cl


def c14(ctx: Context) -> Claim:
    cl = Claim("C14", "The deposit is located in the shallowest layer (layer 0).", "[P][S]",
               "in a majority of qualifying `rope` task-1 seeds, the single head whose ablation hurts "
               "most (over all layers) is in layer 0 — whether or not its drop reaches C7's 50 points.")
    models, skipped = _rope_models(ctx, cl)
    if not models:
        return cl
    flags, parts = [], []
    for c in models:
        layer, head, drop = c.ablation.top()
        flags.append(layer == 0)
        parts.append(f"seed {c.seed}: L{layer}H{head} ({pts(drop)})")
    for c in _ablated(ctx, "sinusoidal+rope", "distance"):
        layer, head, drop = c.ablation.top()
        parts.append(f"also sinusoidal+rope seed {c.seed}: L{layer}H{head} ({pts(drop)})")
    return _judge(cl, flags, parts, skipped)


def c15(ctx: Context) -> Claim:
    cl = Claim("C15", "(Theory) Under RoPE the positional gradient has a deterministic non-zero seed at init; "
                      "under ALiBi the batch-aggregated gradient cancels.", "[S]",
               "at initialisation, over the seeds present: RoPE's batch-mean positional gradient is "
               "non-zero with a consistent sign (|mean| ≥ 2 × its standard error over examples) and "
               "ALiBi's is not (|mean| < 2 × standard error).")
    g = ctx.gradients
    if not g or not g.get("available"):
        cl.evidence = (g or {}).get("reason", "probes.gradients is not available")
        return cl
    cl.status = g.get("status", NOT_MEASURED)
    cl.evidence = g.get("evidence", "")
    if g.get("criterion"):
        cl.criterion = g["criterion"]
    return cl


def c16(ctx: Context) -> Claim:
    cl = Claim("C16", "(Theory) The dominant/runner-up head margin grows geometrically toward shallow layers.", "[S]",
               "partly measurable: head importance taken as the trained model's single-head "
               "ablation drop (not the theorem's gradient quantity). In a majority of qualifying "
               "`rope` task-1 seeds, the per-layer margin (top drop − runner-up drop in the layer) is "
               "non-increasing with depth and larger in layer 0 than in the last layer. The "
               "layer-0 margin over training (deposit dynamics) is listed as supporting evidence, "
               "not judged.")
    models, skipped = _rope_models(ctx, cl)
    if not models:
        return cl
    flags, parts = [], []
    for c in models:
        m = c.ablation.margins()
        ok = all(m[i] >= m[i + 1] for i in range(len(m) - 1)) and m[0] > m[-1]
        flags.append(ok)
        ratios = [f"{m[i] / m[i + 1]:.2f}" if m[i + 1] > 1e-9 else "∞" for i in range(len(m) - 1)]
        text = (f"seed {c.seed}: margins by layer " + ", ".join(f"{100 * x:.1f}" for x in m)
                + f" pts (γ_l = margin_l/margin_l+1: {', '.join(ratios)})")
        dyn = read_dynamics(c.run_dir)
        trend = _margin_trend(dyn)
        if trend:
            text += f"; layer-0 margin during training {trend}"
        parts.append(text)
    return _judge(cl, flags, parts, skipped)


def _margin_trend(dyn: list[dict[str, Any]]) -> str:
    if len(dyn) < 2:
        return ""
    from pe_interp.report.figures import layer_margin

    vals = [(d["step"], layer_margin(d, 0)) for d in dyn]
    vals = [(s, v) for s, v in vals if v is not None and not math.isnan(v)]
    if len(vals) < 2:
        return ""
    (s0, v0), (s1, v1) = vals[0], vals[-1]
    mid = vals[len(vals) // 2]
    return f"step {s0}: {100 * v0:.1f} → step {mid[0]}: {100 * mid[1]:.1f} → step {s1}: {100 * v1:.1f} pts"


def c17(ctx: Context) -> Claim:
    cl = Claim("C17", "Task-1 chance is 1.43%; a length-only Bayes ceiling is 5.37%.", "[R]",
               "the exact baselines of the paper-size distance task (`--preset paper`, computed "
               "analytically from the generator) equal 1.43% and 5.37% to two decimals.")
    try:
        from pe_interp.presets import build_run_configs

        _, task, _ = build_run_configs("distance", "nope", "paper")
        ch, lo = task.chance_accuracy(), task.length_only_accuracy()
    except Exception as err:  # noqa: BLE001 - reported as not measured
        cl.evidence = f"could not build the paper-size task ({type(err).__name__}: {err})"
        return cl
    ok = round(100 * ch, 2) == 1.43 and round(100 * lo, 2) == 5.37
    cl.status = REPRODUCED if ok else NOT_REPRODUCED
    here = ctx.baselines.get("distance")
    extra = f"; at this preset ({ctx.preset}): chance {100 * here['chance']:.2f}%, length-only {100 * here['length_only']:.2f}%" if here else ""
    cl.evidence = f"paper-size task: chance {100 * ch:.2f}%, length-only {100 * lo:.2f}%{extra}"
    return cl


CLAIMS: list[Callable[[Context], Claim]] = [c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11, c12, c13, c14, c15, c16, c17]


def evaluate_claims(ctx: Context) -> list[Claim]:
    out = []
    for fn in CLAIMS:
        try:
            claim = fn(ctx)
        except Exception as err:  # noqa: BLE001 - one broken input must not hide the others
            claim = Claim(fn.__name__.upper(), "(evaluation failed)", "", "", NOT_MEASURED,
                          f"error while evaluating: {type(err).__name__}: {err}")
        if ctx.preset != "paper" and claim.status == NOT_REPRODUCED and claim.id != "C17":
            claim.evidence += f". Not reproduced at preset `{ctx.preset}`; {PAPER_SETTING}."
        out.append(claim)
    return out
