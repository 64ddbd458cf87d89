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
from pe_interp.report.survey_sections import (
    MEASURE_WORDS,
    PAIR_WORDS,
    ablation_section,
    frequency_section,
    head_types_section,
    pairs_kind,
    patching_section,
    routes_section,
)
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
        "ablation": ("## Exact ablation of every head", lambda s: ablation_section(s, figures.get("ablation"))),
        "patching": (f"## Head patching, {PAIR_WORDS[pairs_kind(steps.get('patching', {}))][0]} counterfactuals", lambda s: patching_section(s, figures.get("patching"))),
        "routes": ("## Route shares", routes_section),
        "head_types": ("## Head types", lambda s: head_types_section(s, figures.get("head_types"))),
        "frequency": ("## RoPE frequency usage", lambda s: frequency_section(s, figures.get("frequency"))),
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
