"""The report of a pretrained model's survey (``pe-interp survey``), rebuilt from its findings alone:
``OUT/SURVEY.md``, its figures, and the block ``<!-- study:NAME begin/end -->`` in
``findings/README.md``.

It reads the steps' JSON files (:data:`STEPS`, run by :mod:`pe_interp.commands.survey`) and writes what they
hold; a step not yet run is named as missing, never filled in.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from pe_interp.report.findings import update_readme
from pe_interp.report.survey_circuit import circuit_section
from pe_interp.report.survey_figures import ablation_figure, patching_figure
from pe_interp.report.survey_heads import heads_across
from pe_interp.util.io import atomic_write_text

STEPS = (
    "accuracy",
    "ablation",
    "patching",
    "routes",
    "head_types",
    "frequency",
    "circuit",
)  # in run order
DEPOSIT_DROP = 0.5  # the single-head deposit's bar: one head costs >= 50 points
SMALL_DROP = 0.05  # ... and every other head moves accuracy by <= 5 points


def load_steps(out: Path) -> dict[str, dict[str, Any]]:
    """Every step's saved payload in ``out``, by step name."""
    steps = {}
    for path in sorted(out.glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and "survey" in data:
            steps[path.stem] = data
    return steps


def _origin(step: dict[str, Any]) -> str:
    weights = step.get("weights", {})
    source = weights.get("source") or {}
    gguf = source.get("gguf")
    if gguf:
        types = ", ".join(f"{k} {v}" for k, v in sorted(gguf.get("tensor_types", {}).items()))
        return (
            f"`{gguf.get('file')}` (sha256 `{str(gguf.get('sha256'))[:16]}…`, "
            f"{gguf.get('file_type')}: {types}; dequantised to fp32)"
        )
    return f"weights sha256 `{str(weights.get('sha256'))[:16]}…`"


def n_used(name: str, step: dict[str, Any]) -> int | None:
    """How many prompts (a pair step: pairs) the step used, as it recorded them (``n_used``, or
    its result's ``n_examples`` in files from before; accuracy: its first family's count)."""
    if "n_used" in step:
        return int(step["n_used"])
    if name == "accuracy":
        families = step.get("families") or [{}]
        return families[0].get("n")
    return (step.get("result") or {}).get("n_examples")


def _prompts_line(steps: dict[str, dict[str, Any]]) -> str:
    first = next(iter(steps.values()))
    p = first["survey"]["prompts"]
    bos = p["bos"]
    bos_text = (
        f"BOS {bos['token']!r} (id {bos['token_id']}) prepended"
        if bos["prepended"]
        else f"no BOS ({bos['reason']})"
    )
    first_token = "; answers scored on their first token" if p.get("scored_on_first_token") else ""
    used = {name: n_used(name, step) for name, step in steps.items()}
    counts = set(used.values())
    if len(counts) == 1:
        count = f"{counts.pop()} used"
    else:  # a prompts file with fewer pairs than prompts, or steps run with other --n
        count = "used: " + ", ".join(
            f"{name} {n}{' pairs' if name in ('patching', 'routes') else ''}"
            for name, n in used.items()
        )
    return f"{p['name']} prompts (seed {p['seed']}, {count}), {bos_text}{first_token}"


def pairs_kind(step: dict[str, Any]) -> str:
    """The kind of a pair step's counterfactuals: "position" (the same tokens moved) or "content"
    (tokens changed); files from before recorded none, and were of position-only pairs."""
    return (step.get("counterfactual") or {}).get("kind", "position")


PAIR_WORDS = {
    "position": (
        "position-only",
        "the answer's token swapped with another of the prompt's items, the same tokens moved",
    ),
    "content": ("content", "the prompt's tokens changed so that the answer changes"),
}


def _ablation_section(step: dict[str, Any], fig: Path | None) -> list[str]:
    r = step["result"]
    drops = np.array(r["drops"], dtype=float)
    lo, hi = np.array(r["ci_low"], dtype=float), np.array(r["ci_high"], dtype=float)
    n_heads = drops.size
    order = np.argsort(-drops, axis=None)[:5]
    lines = [
        f"Every one of the {n_heads} heads zero-ablated alone, exactly, on {r['n_examples']} "
        f"prompts (baseline accuracy {100 * r['baseline']:.1f}%). Largest drops, in points, with "
        f"{100 * r.get('ci_level', 0.95):.0f}% bootstrap intervals:",
        "",
        "| head | drop | interval |",
        "|---|---|---|",
    ]
    for flat in order:
        layer, head = np.unravel_index(flat, drops.shape)
        lines.append(
            f"| L{layer}H{head} | {100 * drops[layer, head]:+.1f} | "
            f"[{100 * lo[layer, head]:+.1f}, {100 * hi[layer, head]:+.1f}] |"
        )
    large = int((drops >= DEPOSIT_DROP).sum())
    lines += [
        "",
        f"- Single-head deposit: {step['single']['text']}.",
        f"- Layer-0 concentration: {step['layer0']['text']}.",
        f"- Heads whose ablation costs >= {100 * DEPOSIT_DROP:.0f} points: {large} of {n_heads}; "
        f"heads that move accuracy by more than {100 * SMALL_DROP:.0f} points either way: "
        f"{int((np.abs(drops) > SMALL_DROP).sum())} of {n_heads}.",
        f"- What a {100 * DEPOSIT_DROP:.0f}-point single-head deposit would mean here: one head of "
        f"{n_heads} whose removal alone costs at least {100 * DEPOSIT_DROP:.0f} of the "
        f"{100 * r['baseline']:.0f} points the model scores, while each of the other "
        f"{n_heads - 1} moves it by at most {100 * SMALL_DROP:.0f}: position for this task routed "
        "through one head with no backup.",
    ]
    if r["baseline"] < DEPOSIT_DROP:
        lines.append(
            f"  With a baseline of {100 * r['baseline']:.1f}%, no head can cost "
            f"{100 * DEPOSIT_DROP:.0f} points: the bar cannot be met on these prompts."
        )
    if fig is not None:
        lines += ["", f"![every head's drop]({fig.name})"]
    return lines


def _patching_section(step: dict[str, Any], fig: Path | None) -> list[str]:
    r = step["result"]
    values = np.array(r["values"], dtype=float)
    order = np.argsort(-values, axis=None)[:5]
    kind, how = PAIR_WORDS[pairs_kind(step)]
    lines = [
        f"Each head's output (`hook_z`, all positions) patched from the clean prompt into its "
        f"{kind} counterfactual ({r['n_examples']} pairs: {how}). 1.0 restores the clean logit "
        "difference; top heads:",
        "",
        "| head | restored | interval |",
        "|---|---|---|",
    ]
    lo, hi = np.array(r["ci_low"], dtype=float), np.array(r["ci_high"], dtype=float)
    for flat in order:
        layer, head = np.unravel_index(flat, values.shape)
        lines.append(
            f"| L{layer}H{head} | {values[layer, head]:+.3f} | "
            f"[{lo[layer, head]:+.3f}, {hi[layer, head]:+.3f}] |"
        )
    if fig is not None:
        lines += ["", f"![every head patched]({fig.name})"]
    return lines


def _routes_section(step: dict[str, Any]) -> list[str]:
    from probes.routes.shares import RouteShares

    r = RouteShares.from_dict(step["result"])
    lines = [
        f"Route shares on {r.n_examples} position-only pairs: the positional effect is "
        f"{r.effect:.3f} logits [{r.effect_ci[0]:.3f}, {r.effect_ci[1]:.3f}]; each route's share "
        "of it (the positional criterion, per query head):",
        "",
        "| route | share | interval |",
        "|---|---|---|",
    ]
    for name, share, lo, hi in r.units()[:6]:
        lines.append(f"| {name} | {100 * share:.1f}% | [{100 * lo:.1f}, {100 * hi:.1f}] |")
    lines += [
        "",
        f"- Moving every route's positions at once moves the logit difference by {r.effect:.2f}; "
        f"the counterfactual prompt itself moves it by {r.counterfactual_effect:.2f} (mean gap "
        f"between the two per pair: {r.identity_gap:.2f}). In a causal model the order of the "
        "tokens also enters through the causal mask, which no route carries; the shares are "
        "shares of what the positional encoding carries.",
    ]
    if r.screened:
        lines.append(
            f"- Screened: {int(r.measured.sum())} of {int(r.routes.sum())} routes measured "
            f"exactly; the others' estimated shares lie within ±{100 * r.unmeasured_max():.1f}%."
        )
    lines += [f"- {_sentence(step['verdict'])}."]
    return lines


def _head_types_section(step: dict[str, Any], fig: Path | None) -> list[str]:
    from probes.heads.types import HEAD_TYPES, HeadTypeScores

    r = HeadTypeScores.from_dict(step["result"])
    n_layers, n_heads = r.shape
    lines = [
        f"Every head scored on {r.n_examples} prompts ({r.n_forwards} forwards). A head is of a "
        "type when its focus (the mean attention on the type's targets over the queries that have "
        "one) reaches the type's threshold; the score is TransformerLens' `detect_head` (`mul`).",
        "",
        "| type | threshold | heads of the type | top heads: score [focus] |",
        "|---|---|---|---|",
    ]
    for kind in HEAD_TYPES:
        typed = r.types()[kind]
        top = ", ".join(
            f"L{lh[0]}H{lh[1]} {v:.2f} [{float(r.focus[kind][lh]):.2f}]" for lh, v in r.top(kind, 3)
        )
        lines.append(
            f"| {kind.replace('_', '-')} | {r.thresholds[kind]:g} | "
            f"{len(typed)} of {n_layers * n_heads} | {top} |"
        )
    if fig is not None:
        lines += ["", f"![head types]({fig.name})"]
    return lines


MEASURE_WORDS = {
    "pattern": "logit terms centred along each query's row (what can shape the pattern)",
    "logit": "raw squared logit terms",
    "norm": "q/k chunk norms",
}


def _frequency_section(step: dict[str, Any], fig: Path | None) -> list[str]:
    f = step["findings"]
    low = f["low_frequency_norm"]
    band = step["result"].get("band", 0.25)
    lines = [
        f"Each head's rotated queries and keys split into RoPE's 2-D frequency chunks; the high "
        f"band is the fastest {100 * band:.0f}% of the frequencies, the low band the slowest. "
        "Barbero et al. (2024) found on Gemma 7B that (1) most of the q/k norm sits in the lowest "
        "frequencies and (2) positional heads use the highest. Here, with k of n heads and 95% "
        "Wilson intervals:",
        "",
        f"1. Low band holds more q/k norm than the high band: **{low['k']} of {low['n']}** heads "
        f"[{100 * low['interval'][0]:.0f}%, {100 * low['interval'][1]:.0f}%].",
        f"2. Positional heads ({step['positional_heads_are']}: "
        f"{', '.join(f'L{a}H{b}' for a, b in step['positional_heads']) or 'none'}) whose high band "
        "holds more than their low band, by each measure (every head of the model alongside):",
        "",
        "| measure | positional heads | every head |",
        "|---|---|---|",
    ]
    for measure, words in MEASURE_WORDS.items():
        cells = []
        for who in ("positional", "every"):
            r = f.get(f"high_{measure}_{who}")
            cells.append(
                "none"
                if r is None
                else f"{r['k']} of {r['n']} [{100 * r['interval'][0]:.0f}%, {100 * r['interval'][1]:.0f}%]"
            )
        lines.append(f"| {words} | {cells[0]} | {cells[1]} |")
    if fig is not None:
        lines += ["", f"![frequency usage]({fig.name})"]
    return lines


def survey_markdown(out: Path, steps: dict[str, dict[str, Any]], figures: dict[str, Path]) -> str:
    """``SURVEY.md`` of the findings in ``out``."""
    first = next(iter(steps.values()))
    lines = [f"# Where does position live? `{out.name}`", ""]
    lines += [f"Model: {_origin(first)}. Probes read {_prompts_line(steps)}.", ""]
    if "accuracy" in steps:
        lines += [
            "## Accuracy per prompt family",
            "",
            "| family | correct | accuracy |",
            "|---|---|---|",
        ]
        for row in steps["accuracy"]["families"]:
            lines.append(
                f"| {row['family']} | {row['correct']} of {row['n']} | {row['accuracy']:.3f} |"
            )
        lines += ["", steps["accuracy"]["families"][0]["summary"].split("; ", 1)[1] + ".", ""]
    sections = {
        "ablation": ("## Exact ablation of every head", lambda s: _ablation_section(s, figures.get("ablation"))),
        "patching": (f"## Head patching, {PAIR_WORDS[pairs_kind(steps.get('patching', {}))][0]} counterfactuals", lambda s: _patching_section(s, figures.get("patching"))),
        "routes": ("## Route shares", _routes_section),
        "head_types": ("## Head types", lambda s: _head_types_section(s, figures.get("head_types"))),
        "frequency": ("## RoPE frequency usage", lambda s: _frequency_section(s, figures.get("frequency"))),
        "circuit": ("## A σ-aligned, position-aware circuit", circuit_section),
    }  # fmt: skip
    for name, (title, section) in sections.items():
        if name in steps:
            lines += [title, "", *section(steps[name]), ""]
    if across := heads_across(steps):
        lines += ["## The heads the probes single out", "", *across, ""]
    missing = [s for s in STEPS if s not in steps]
    if missing:
        lines += [f"Not yet run: {', '.join(missing)} (`pe-interp survey MODEL --out {out}`)."]
    return "\n".join(lines).rstrip() + "\n"


def _n_heads(steps: dict[str, dict[str, Any]]) -> int:
    scores = steps["head_types"]["result"]["scores"]["previous_token"]
    return len(scores) * len(scores[0])


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:]


def readme_block(out: Path, steps: dict[str, dict[str, Any]]) -> str:
    """The findings/README.md block, the survey's short form: accuracy, the verdicts, where to
    read more."""
    lines = []
    if "accuracy" in steps:
        acc = ", ".join(
            f"{r['family']} {r['correct']}/{r['n']}" for r in steps["accuracy"]["families"]
        )
        lines.append(f"- Accuracy on natural prompts: {acc}.")
    if "ablation" in steps:
        a = steps["ablation"]
        drops = np.array(a["result"]["drops"], dtype=float)
        layer, head = np.unravel_index(np.nanargmax(drops), drops.shape)
        lines.append(
            f"- Exact ablation of all heads: single-head deposit {a['single']['text']}; the "
            f"largest drop L{layer}H{head} {100 * drops[layer, head]:.1f} of "
            f"{100 * a['result']['baseline']:.1f} points."
        )
    if "patching" in steps:
        top = steps["patching"]["result"]["top"][:3]
        heads = ", ".join(
            f"L{t['cell']['layer']}H{t['cell']['head']} {t['value']:+.2f}" for t in top
        )
        kind = PAIR_WORDS[pairs_kind(steps["patching"])][0]
        lines.append(f"- Head patching on {kind} pairs, most restoring: {heads}.")
    if "routes" in steps:
        lines.append(f"- Route shares: {steps['routes']['verdict']}.")
    if "head_types" in steps:
        types = steps["head_types"]["result"]["types"]
        counts = ", ".join(f"{k.replace('_', '-')} {len(v)}" for k, v in types.items())
        lines.append(f"- Heads of each type (of {_n_heads(steps)}): {counts}.")
    if "frequency" in steps:
        f = steps["frequency"]["findings"]
        low = f["low_frequency_norm"]
        lines.append(
            f"- RoPE frequencies (Barbero et al. 2024): q/k norm mostly in the low band in "
            f"{low['k']} of {low['n']} heads; previous-token heads with more in the high band: "
            + ", ".join(
                f"{f[key]['k']} of {f[key]['n']} by {m}"
                for m in MEASURE_WORDS
                if (key := f"high_{m}_positional") in f
            )
            + "."
        )
    if "circuit" in steps:
        lines.append(f"- Circuit (σ-aligned, per span of the prompts): {steps['circuit']['line']}.")
    missing = [s for s in STEPS if s not in steps]
    if missing:
        lines.append(f"- Not yet run: {', '.join(missing)} (the survey resumes where it stopped).")
    lines.append(
        f"\nFrom `{out}` (`pe-interp survey --report {out} --readme findings/README.md` regenerates this "
        f"block; the whole survey is `{out}/SURVEY.md`)."
    )
    return "\n".join(lines)


def write_survey_report(out: str | Path, readme: str | Path | None = None) -> list[Path]:
    """Write ``OUT/SURVEY.md`` and its figures from the findings in ``out`` (and the block in
    ``readme``, findings/README.md for the committed surveys, where it is given); a one-line
    ValueError where ``out`` holds no survey step."""
    out = Path(out)
    steps = load_steps(out)
    if not steps:
        raise ValueError(f"{out}: no survey findings (run pe-interp survey MODEL --out {out})")
    figures: dict[str, Path] = {}
    if "ablation" in steps:
        figures["ablation"] = ablation_figure(steps["ablation"]["result"], out / "ablation.png")
    if "patching" in steps:
        figures["patching"] = patching_figure(steps["patching"]["result"], out / "patching.png")
    if "head_types" in steps:
        from probes.heads.types import HeadTypeScores
        from probes.heads.view import plot_head_types

        result = HeadTypeScores.from_dict(steps["head_types"]["result"])
        plot_head_types(result, out / "head_types.png", by="focus")
        figures["head_types"] = out / "head_types.png"
    if "frequency" in steps:
        from probes.decomposition import FrequencyUsage
        from probes.decomposition.view import plot_frequency_usage

        usage = FrequencyUsage.from_dict(steps["frequency"]["result"])
        heads = [tuple(h) for h in steps["frequency"]["positional_heads"]]
        plot_frequency_usage(usage, out / "frequency.png", positional=heads, centred=True)
        figures["frequency"] = out / "frequency.png"
    md = out / "SURVEY.md"
    atomic_write_text(md, survey_markdown(out, steps, figures))
    written = [md, *figures.values()]
    if readme is not None:
        if not update_readme(readme, out.name, readme_block(out, steps)):
            raise ValueError(
                f"{readme}: no <!-- study:{out.name} begin --> / <!-- study:{out.name} end --> markers"
            )
        written.append(Path(readme))
    return written


__all__ = ["STEPS", "load_steps", "readme_block", "survey_markdown", "write_survey_report"]
