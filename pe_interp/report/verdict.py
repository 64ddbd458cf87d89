"""The report's first screen: is there a single-head deposit, and where?

:func:`first_screen` answers from what ``probes.deposit`` stored for each model of one task (its
flags, and each layer's top head, runner-up and share), shows the ablation heatmaps of those
models on one colour scale, and adds one line each of head-patching and logit-decomposition
evidence where the sweep stored them. :func:`decomposition_section` draws the top head's
logit terms. Like the rest of the report it only reads.

The answer is about trained models: a constructed control (a ``planted-*`` checkpoint,
:func:`pe_interp.report.data.is_control`, built to answer yes or no) never counts toward it.
The controls are listed apart, as controls (:func:`control_lines`), and ``pe-interp demo`` prints
the same answer from :func:`deposit_answer`.
"""

from __future__ import annotations

import html
import math
from pathlib import Path

import numpy as np

from pe_interp.report.data import (
    CHECKPOINT_KEY,
    LARGE_DROP,
    SMALL_DROP,
    TASK_TITLES,
    CellInfo,
    Dominance,
    dominance,
    is_control,
    label_order,
    task_order,
)
from pe_interp.report.figures import common_vmax, logit_terms_figure, model_heatmap
from pe_interp.report.markup import img, inline_md

CSS = """
.verdict { border: 2px solid #444; border-radius: 6px; padding: 10px 16px; margin: 12px 0 8px 0;
           background: #fbfbf7; }
.verdict .answer { font-size: 20px; margin: 2px 0 8px 0; }
.verdict ul { margin: 4px 0; padding-left: 22px; } .verdict li { margin: 3px 0; }
.firstfigs { display: flex; flex-wrap: wrap; gap: 8px; align-items: flex-start; }
.firstfigs img { max-width: calc((100% - 16px) / 3); min-width: 300px; }
"""


def _pts(x: float) -> str:
    return "—" if x is None or math.isnan(x) else f"{100 * x:.1f} pts"


def _models(cells: list[CellInfo], task: str) -> list[tuple[str, list[CellInfo]]]:
    out = []
    for label in label_order(cells):
        models = sorted(
            (
                c
                for c in cells
                if c.label == label
                and c.task == task
                and c.ablation is not None
                and c.deposits is not None
            ),
            key=lambda c: c.seed,
        )
        if models:
            out.append((label, models))
    return out


def _acc(models: list[CellInfo]) -> str:
    vals = [c.test_acc for c in models if not math.isnan(c.test_acc)]
    if not vals:
        return "accuracy not recorded"
    mean = 100 * sum(vals) / len(vals)
    return f"held-out acc {mean:.1f}%" + (f" (mean of {len(vals)} seeds)" if len(vals) > 1 else "")


def _why_not(d: Dominance) -> str:
    why = []
    if not d.top_large:
        why.append(f"below the {100 * LARGE_DROP:.0f}-point bar")
    if d.n_large > 1:
        why.append(f"{d.n_large} heads cost ≥ {100 * LARGE_DROP:.0f} points")
    if not d.others_small:
        why.append(
            f"another head moves accuracy by {_pts(d.others_max_abs)} (> {100 * SMALL_DROP:.0f})"
        )
    return "; ".join(why) or "no criterion met"


def _concentration(models: list[CellInfo]) -> str:
    """The looser per-layer flag of probes.deposit, in its own words."""
    flagged = [c for c in models if c.found]
    if not flagged:
        return " Layer concentration: none."
    where = ", ".join(
        f"seed {c.seed}: L{c.deposits.first[0]}H{c.deposits.first[1]} "
        f"({100 * c.deposits.layer(c.deposits.first[0]).share:.0f}% of its layer)"
        for c in flagged
    )
    return f" Layer concentration in {len(flagged)} of {len(models)} seed(s) ({where})."


def model_line(label: str, models: list[CellInfo]) -> tuple[bool, str]:
    """(a single-head deposit in some seed, one Markdown line: where it is, or what is nearest to
    one, and the looser layer concentration). A single-head deposit is
    :func:`probes.deposit.dominance`'s: one head ≥ 50 points, every other within 5."""
    n = len(models)
    doms = [(c, dominance(c.ablation)) for c in models]
    singles = [(c, d) for c, d in doms if d.single]
    if singles:
        c, d = singles[0]
        where = ", ".join(f"seed {m.seed}: L{e.layer}H{e.head}" for m, e in singles)
        return True, (
            f"**{label}** ({_acc(models)}): **single-head deposit at L{d.layer}H{d.head}** in {len(singles)} of "
            f"{n} seed(s) ({where}). Ablating it costs {_pts(d.drop)}; every other head moves accuracy by "
            f"at most {_pts(d.others_max_abs)}." + _concentration(models)
        )
    c, d = doms[0]
    seeds = f"{n} seeds" if n > 1 else f"seed {c.seed}"
    others = ""
    if n > 1:
        others = (
            " Other seeds' top heads: "
            + ", ".join(
                f"L{e.layer}H{e.head} ({_pts(e.drop)}, runner-up {_pts(e.runner_up)})"
                for _, e in doms[1:]
            )
            + "."
        )
    return False, (
        f"**{label}** ({_acc(models)}): no single-head deposit ({seeds}). Top head L{d.layer}H{d.head}"
        f"{f' (seed {c.seed})' if n > 1 else ''}: {_pts(d.drop)} ({_why_not(d)}); runner-up "
        f"{_pts(d.runner_up)}.{others}" + _concentration(models)
    )


def criterion(cells: list[CellInfo]) -> str:
    report = next((c.deposits for c in cells if c.deposits is not None), None)
    text = (
        f"A single-head deposit: exactly one head of the model costs ≥ {100 * LARGE_DROP:.0f} accuracy points "
        f"when zero-ablated alone, and every other head moves accuracy by ≤ {100 * SMALL_DROP:.0f} points either "
        "way (claims C7/C8)."
    )
    if report is None:
        return text
    sep = (
        ", and the lower end of its bootstrap CI lies above the runner-up's drop"
        if report.require_separation
        else ""
    )
    return text + (
        f" Layer concentration (looser, per layer): ablating a layer's top head ({report.method}-ablation, "
        f"{report.metric}) costs ≥ {100 * report.min_drop:.0f} points and ≥ {100 * report.min_share:.0f}% of "
        f"the layer's summed drop{sep}."
    )


def evidence_lines(cells: list[CellInfo], task: str) -> list[str]:
    """One line of head patching and one of the logit decomposition per model (lowest seed)."""
    lines = []
    for label, _ in _models(cells, task) or [(lab, []) for lab in label_order(cells)]:
        mine = sorted(
            (c for c in cells if c.label == label and c.task == task), key=lambda c: c.seed
        )
        pc = next(
            (
                c
                for c in mine
                if c.patching is not None and tuple(c.patching.axis_names) == ("layer", "head")
            ),
            None,
        )
        if pc is not None:
            top = pc.patching.top(2, by_abs=False)
            parts = [f"L{cell['layer']}H{cell['head']} {value:+.2f}" for cell, value in top]
            lines.append(
                f"Head patching, **{label}** (seed {pc.seed}, {pc.patching.n_examples} distance "
                f"counterfactual pairs; 1 = the clean answer fully restored): {', '.join(parts)}."
            )
        dc = next((c for c in mine if c.decomposition), None)
        if dc is not None:
            d = dc.decomposition
            shares = {
                k: v
                for k, v in d.get("grouped_variance_shares", {}).items()
                if isinstance(v, float) and math.isfinite(v)
            }
            best = sorted(shares.items(), key=lambda kv: -kv[1])[:2]
            text = ", ".join(f"{k} {100 * v:.0f}%" for k, v in best)
            rope = d.get("summary", {}).get("rope")
            if rope and rope.get("frequency_share"):
                share = np.asarray(rope["frequency_share"], dtype=float)
                k = int(np.nanargmax(share))
                text += f"; RoPE pair {k} (θ = {rope['theta'][k]:.3g} rad/token) carries {100 * share[k]:.0f}% of the rotary part"
            tz = d.get("summary", {}).get("toeplitz", {}).get("total")
            if isinstance(tz, float) and math.isfinite(tz):
                text += f"; the logits are {100 * tz:.0f}% a function of the offset j − i (Toeplitz score)"
            lines.append(
                f"Logit terms of **{label}**'s top head L{d['layer']}H{d['head']} (seed {dc.seed}, held-out "
                f"example {d['example']}): share of the logit variance {text}."
            )
    return lines


def first_task(cells: list[CellInfo]) -> str | None:
    """The task the first screen answers for: task 1 (distance) when there is one."""
    tasks = task_order(cells)
    return "distance" if "distance" in tasks else (tasks[0] if tasks else None)


def deposit_answer(cells: list[CellInfo], task: str) -> tuple[str, list[tuple[bool, str]]]:
    """The answer in one Markdown sentence, and each model's (single-head deposit found, line):
    about the trained models alone, a constructed control (:func:`~pe_interp.report.data.is_control`)
    left out (:func:`control_lines` lists them)."""
    title = TASK_TITLES.get(task, task)
    trained = [c for c in cells if not is_control(c)]
    models = _models(trained, task)
    verdicts = [model_line(label, ms) for label, ms in models]
    with_deposit = [label for (label, _), (found, _) in zip(models, verdicts) if found]
    n_runs = sum(len(ms) for _, ms in models)
    if not models:
        controls = " (only constructed controls, listed apart)" if _models(cells, task) else ""
        return (
            f"**Not measured**: no trained {title} model has a head-ablation sweep{controls}.",
            [],
        )
    if with_deposit:
        answer = (
            f"**Yes**: a single-head deposit in {len(with_deposit)} of {len(models)} model(s) on {title}: "
            + ", ".join(with_deposit)
            + "."
        )
    else:
        runs = f", {n_runs} runs" if n_runs > len(models) else ""
        which = "this model" if len(models) == 1 else f"any of the {len(models)} models"
        answer = (
            f"**No**: no single-head deposit in {which} on {title}{runs}: no one head costs ≥ "
            f"{100 * LARGE_DROP:.0f} points while every other stays within {100 * SMALL_DROP:.0f}."
        )
    return answer, verdicts


def control_lines(cells: list[CellInfo], task: str) -> list[str]:
    """Each constructed control's verdicts, as a control: what the detectors say where the answer
    is known (position planted in the heads its checkpoint names); never part of the answer."""
    controls = [c for c in cells if is_control(c)]
    lines = [line for _, ms in _models(controls, task) for line in [model_line(ms[0].label, ms)[1]]]
    return lines + positional_lines(controls, task)


def positional_lines(cells: list[CellInfo], task: str) -> list[str]:
    """Each model's single-head verdict decided on its intervals (yes / no / undecided) and its
    positional deposit (where position enters, ``routes.json``), beside the paper's verdict."""
    from probes import RouteShares, positional_dominance
    from probes.deposit import decide_single

    out = []
    for c in cells:
        a = c.ablation
        if (
            c.task == task
            and a is not None
            and a.metric == "accuracy"
            and not np.isnan(a.ci_low).any()
        ):
            out.append(
                f"**{c.label}** (seed {c.seed}), single-head deposit on its bootstrap intervals: "
                + decide_single(a).text()
            )
        path = Path(c.run_dir) / "routes.json"
        if c.task == task and path.is_file():
            p = positional_dominance(RouteShares.load(path))
            out.append(
                f"**{c.label}** (seed {c.seed}), positional deposit (where position enters): "
                + p.text().removeprefix("positional deposit: ")
            )
    return out


def first_screen(cells: list[CellInfo]) -> str:
    """The verdict box, the ablation heatmaps of the first task's models, and the evidence."""
    task = first_task(cells)
    if task is None:
        return "<div class='verdict'><p class='answer'>No finished runs yet.</p></div>"
    trained = [c for c in cells if not is_control(c)]
    models = _models(trained, task)
    title = TASK_TITLES.get(task, task)
    controls = control_lines(cells, task)
    apart = (
        "<p class='note'>Constructed controls, not counted in the answer above (position planted "
        "in the heads their checkpoint names: what the detectors say where the answer is known):"
        f"</p><ul>{''.join(f'<li>{inline_md(line)}</li>' for line in controls)}</ul>"
        if controls
        else ""
    )
    if not models:
        return (
            f"<div class='verdict'><p class='answer'><b>Not measured.</b> No trained {html.escape(title)} model has a "
            "head-ablation sweep (run the <code>ablation</code> probe, or <code>pe-interp ablate RUN_DIR</code>).</p>"
            f"{apart}</div>"
        )
    answer, verdicts = deposit_answer(cells, task)
    body = "".join(f"<li>{inline_md(line)}</li>" for _, line in verdicts)
    body += "".join(f"<li>{inline_md(line)}</li>" for line in positional_lines(trained, task))
    vmax = common_vmax(cells, task)
    figs = []
    shown = [(label, ms, "") for label, ms in models]
    shown += [
        (label, ms, "constructed control: ")
        for label, ms in _models([c for c in cells if is_control(c)], task)
    ]  # after the trained models, named as what they are
    for label, ms, control in shown:
        base = sum(c.ablation.baseline for c in ms) / len(ms)
        what = f"mean of {len(ms)} seeds" if len(ms) > 1 else f"seed {ms[0].seed}"
        figs.append(
            img(
                model_heatmap(
                    ms,
                    f"{control}{label}: accuracy drop per ablated head ({what}; baseline "
                    f"{100 * base:.1f}%)",
                    vmax=vmax,
                ),
                f"ablation heatmap {control}{label}",
            )
        )
    lines = evidence_lines(trained, task)
    for c in cells:
        if CHECKPOINT_KEY in c.params and is_control(c):
            lines.append(
                f"**{c.label}** is the constructed control `checkpoints/{c.params[CHECKPOINT_KEY]}`: "
                "position planted in the heads it names, so the detectors' answer is known."
            )
        elif CHECKPOINT_KEY in c.params:
            command = (c.config or {}).get("command")
            lines.append(
                f"**{c.label}** is the committed run `checkpoints/{c.params[CHECKPOINT_KEY]}`, trained by this "
                "package from its recorded config and seed"
                + (f"; re-create it with `{command}`." if command else ".")
            )
    evidence = "".join(f"<li>{inline_md(line)}</li>" for line in lines)
    return (
        "<div class='verdict' id='verdict'>"
        "<p class='note' style='margin:0'>Is there a single-head deposit, and where?</p>"
        f"<p class='answer'>{inline_md(answer)}</p><ul>{body}</ul>{apart}"
        f"<p class='note'>{inline_md(criterion(cells))} Heatmaps: the drop in held-out accuracy when each head "
        f"is zero-ablated alone (rows: layers, columns: heads; one colour scale, ±{100 * vmax:.0f} points; "
        "heads of a concentrated layer outlined).</p></div>"
        f"<div class='firstfigs'>{''.join(figs)}</div>"
        + (f"<ul class='note'>{evidence}</ul>" if evidence else "")
    )


def decomposition_section(cells: list[CellInfo]) -> str:
    """The top head's attention-logit terms (lowest seed of each task-1 model)."""
    parts = []
    for label in label_order(cells):
        mine = sorted(
            (c for c in cells if c.label == label and c.decomposition),
            key=lambda c: (c.task, c.seed),
        )
        if not mine:
            continue
        c = mine[0]
        d = c.decomposition
        title = (
            f"{label} · {c.task} · seed {c.seed}: logit terms of L{d['layer']}H{d['head']} ({d['why']}), "
            f"held-out example {d['example']} (label {d['label']})"
        )
        parts.append(img(logit_terms_figure(d, title), f"logit terms {label}"))
        err = d.get("summary", {}).get("max_error")
        if isinstance(err, float):
            parts.append(
                f"<p class='caption'>The terms sum to the model's logits within {err:.1e}.</p>"
            )
    if not parts:
        return ""
    return (
        "<h3>Logit decomposition of the top head</h3><p class='note'>The top head's pre-softmax logits on one "
        "held-out example split into terms (<code>probes.decomposition.logit_terms</code>, grouped as in the paper): "
        "content–content, content–position, position–content and position–position Gram terms and the offset at "
        "layer 0 (<code>qk</code> deeper), the relative bias, their sum and the model's actual logits. Titles give "
        "each term's share of the logit variance.</p>" + "".join(parts)
    )


__all__ = [
    "CSS",
    "control_lines",
    "criterion",
    "decomposition_section",
    "deposit_answer",
    "evidence_lines",
    "first_screen",
    "first_task",
    "model_line",
]
