"""``pe-interp survey MODEL --out findings/NAME``: where position lives in a pretrained model.

``MODEL`` is a saved Hugging Face directory or a GGUF file (converted once,
:func:`pe_interp.runs.gguf.convert_gguf`). The survey runs, on natural prompts in the model's own tokens
(:mod:`pe_interp.prompts`), one step after another, each written to ``OUT/<step>.json`` with the
weights it read (sha256 and origin) and the prompts (family, seed, BOS policy):

- ``accuracy``: the model's accuracy on each prompt family;
- ``ablation``: every head zero-ablated, one at a time, exact, on the probe family's prompts, with
  the single-head and layer-0 verdicts on their intervals;
- ``patching``: every head's output patched from clean into position-only corrupt prompts;
- ``routes``: route shares (the positional criterion) on position-only pairs, with its verdict;
- ``head_types``: previous-token, duplicate-token, induction and first-token (sink) scores;
- ``frequency``: RoPE frequency usage per head, and Barbero et al.'s two findings as k of n heads;
- ``circuit``: the σ-aligned, position-aware circuit reaching 0.9 faithfulness on held-out
  position-only pairs, and the route into the head of the largest route share
  (:mod:`pe_interp.commands.survey_circuit`).

Before the model's first forward every step asked for is checked against these prompts and this
model (a prompts file without counterfactuals cannot serve patching or routes, content
counterfactuals cannot serve routes, a model that does not rotate cannot serve frequency, which
also needs the head_types step's heads), and refused in one line where it cannot run.

A step whose file records these weights, these prompts, this ``--n`` and these options
(``--n-bootstrap``, ``--seed``, read back from its result) is not run again: a stopped survey
resumes where it stopped; a step run with other options is run again, and says why (``--redo
STEP`` runs one again regardless). Each step records the number of prompts or pairs it used and
the kind of its counterfactuals. ``pe-interp survey --report OUT
--readme findings/README.md`` rebuilds ``OUT/SURVEY.md``, its figures and the block between
``<!-- study:NAME begin/end -->`` in ``findings/README.md`` from the findings alone
(:mod:`pe_interp.report.survey`).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pe_interp.commands.destinations import out_dir_arg
from pe_interp.commands.options import (
    add_device_flag,
    bootstrap_arg,
    device_arg,
    positive_n,
    seed_type,
)
from pe_interp.commands.survey_checks import (
    changed_since,
    check_model,
    check_prompts,
    check_steps,
    prompt_preset,
    stamp_of,
)
from pe_interp.commands.survey_circuit import circuit_step
from pe_interp.report.survey import STEPS

FAMILIES_SURVEYED = ("induction", "recall", "successor")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "survey",
        help="where position lives in a pretrained model: accuracy, ablation, patching, routes, "
        "head types, RoPE frequency usage (resumable)",
        description="Run every probe on a pretrained model (a saved Hugging Face directory or a GGUF "
        "file) on natural prompts, one step at a time, each saved under --out; a stopped survey "
        "resumes. --report rebuilds the summary, figures and (--readme) the findings/README.md "
        "block from the findings.",
    )
    p.add_argument("model", metavar="MODEL", nargs="?", help="a model directory or a GGUF file")
    p.add_argument("--out", default=None, help="the findings directory (e.g. findings/smollm2)")
    p.add_argument("--family", default="induction", help="the prompts the probes read")
    p.add_argument("--n", type=int, default=64, help="prompts (and pairs) per probe (default 64)")
    p.add_argument("--seed", type=seed_type, default=0, help="seeds the prompts and the bootstraps")
    p.add_argument("--n-bootstrap", type=int, default=1000)
    p.add_argument(
        "--steps",
        nargs="+",
        choices=STEPS,
        default=None,
        help="the steps to run (default: all; for a prompts file all but circuit, which needs the "
        "named spans of a family's prompts)",
    )
    p.add_argument("--redo", nargs="+", choices=STEPS, default=[], help="run these steps again")
    p.add_argument("--report", metavar="OUT", default=None, help="only rebuild the report of OUT")
    p.add_argument(
        "--readme",
        default=None,
        help="with --report: update the block between <!-- study:NAME begin/end --> "
        "markers in this file (NAME: OUT's name), findings/README.md for the committed surveys",
    )
    add_device_flag(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.report is not None:
        return _report(Path(args.report), args.readme)
    if args.model is None or args.out is None:
        raise ValueError("give a MODEL and --out (or --report OUT to rebuild a report)")
    out_dir_arg(args.out)  # a directory that can be written, before the work
    positive_n(args.n, "--n")
    if args.n_bootstrap < 1:
        raise ValueError(
            f"--n-bootstrap must be >= 1 (the verdicts need intervals), got {args.n_bootstrap}"
        )
    bootstrap_arg(args.n_bootstrap, zero_ok=False)
    from pe_interp.prompts.task import is_prompt_task
    from pe_interp.runs.checkpoint import CheckpointError
    from pe_interp.runs.model_dirs import load_model_dir, with_accuracy

    if not is_prompt_task(args.family):
        raise ValueError(f"--family must be a prompt family or a .jsonl file, got {args.family!r}")
    out = Path(args.out)
    jsonl = str(args.family).endswith(".jsonl")
    asked = args.steps or [s for s in STEPS if not (jsonl and s == "circuit")]
    todo = [s for s in STEPS if s in asked]
    check_steps(args, todo, out)  # what no model is needed to tell, before it loads
    try:
        loaded = load_model_dir(
            args.model,
            args.family,
            preset=prompt_preset(args.family, args.n),
            seed=args.seed,
            device=device_arg(args.device),
            accuracy=False,  # every step checked first
            check_prompts=lambda task, weights: check_prompts(
                task, stamp_of(weights, task, args), args, todo, out
            ),
        )
    except CheckpointError as err:
        raise ValueError(str(err)) from None
    stamp = stamp_of(loaded.provenance, loaded.task, args)
    check_model(loaded, args, todo)
    loaded = with_accuracy(loaded)  # the first forward on the prompts
    out.mkdir(parents=True, exist_ok=True)
    print(f"{args.model}: {loaded.config['accuracy']['summary']}")
    for i, step in enumerate(todo, 1):
        path = out / f"{step}.json"
        kept = None if step in args.redo else changed_since(path, stamp, step, args)
        if kept == "":
            print(f"[{i}/{len(todo)}] {step}: done before ({path})")
            continue
        again = f" again: {kept}" if kept else ""
        print(f"[{i}/{len(todo)}] {step}{again} ...", flush=True)
        t0 = time.perf_counter()
        payload = STEP_FUNCTIONS[step](loaded, args)
        payload.update(survey=stamp, seconds=time.perf_counter() - t0)
        from pe_interp.runs.checkpoint import save_result

        save_result(path, payload, loaded.provenance, indent=1, kind=f"survey-{step}")
        print(f"[{i}/{len(todo)}] {step}: {payload.get('line', '')} ({payload['seconds']:.0f} s)")
    return _report(out, None)


def _prompts(loaded, n: int):
    return loaded.task.prompts[: min(n, len(loaded.task.prompts))]


def _accuracy(loaded, args) -> dict[str, Any]:
    from pe_interp.prompts import family_accuracy
    from pe_interp.prompts.task import load_prompt_task

    bridge = loaded.model.bridge
    rows = []
    for name in FAMILIES_SURVEYED:
        task = load_prompt_task(name, bridge, prompt_preset(name, args.n), seed=args.seed)
        prompts = task.prompts[: args.n]
        acc = family_accuracy(loaded.model, prompts)
        rows.append({**acc.to_dict(), "summary": acc.summary(), "prompts": task.to_dict()})
    line = "; ".join(f"{r['family']} {r['correct']}/{r['n']}" for r in rows)
    return {"families": rows, "line": line}


def _ablation(loaded, args) -> dict[str, Any]:
    from probes.ablation import ablate_heads
    from probes.deposit import decide_concentration, decide_single, dominance, too_few

    ps = _prompts(loaded, args.n)
    result = ablate_heads(
        loaded.model,
        ps.tokens,
        ps.labels,
        pad_mask=ps.pad_mask,
        method="zero",
        metric="accuracy",
        n_bootstrap=args.n_bootstrap,
        seed=args.seed,
        progress=True,
    )
    few = too_few(result)
    single, layer0 = decide_single(result), decide_concentration(result, 0)
    return {
        "result": result.to_dict(per_example=False),
        "n_used": len(ps),
        "dominance": (few or dominance(result)).text(),
        "single": single.to_dict() | {"text": single.text()},
        "layer0": layer0.to_dict() | {"text": layer0.text()},
        "line": f"single-head deposit {single.text()}",
    }


def _patching(loaded, args) -> dict[str, Any]:
    from probes.patching.sweep import patch

    pairs = loaded.task.prompt_pairs(args.n, "position", seed=args.seed)
    result = patch(
        loaded.model,
        pairs.clean.tokens,
        pairs.corrupt.tokens,
        site="z",
        clean_labels=pairs.clean.labels,
        corrupt_labels=pairs.corrupt.labels,
        pad_mask=pairs.pad_mask,
        n_bootstrap=args.n_bootstrap,
        seed=args.seed,
        progress=True,
    )
    top = result.to_dict()["top"][:3]
    return {
        "result": result.to_dict(),
        "n_used": len(pairs),
        "counterfactual": _pairs_record(loaded, pairs),
        "line": f"top heads {top}",
    }


def _pairs_record(loaded, pairs) -> dict[str, Any]:
    """What a pair step records of its pairs: their kind (position-only: the same tokens moved;
    content: tokens changed) and where they came from."""
    user = getattr(loaded.task, "user", None)
    return {
        "kind": pairs.kind,
        "n": len(pairs),
        "source": "the prompts file's counterfactual lines"
        if user is not None
        else "the family's position-only counterfactuals",
    }


def _routes(loaded, args) -> dict[str, Any]:
    from probes.deposit.positional import positional_dominance
    from probes.routes.shares import route_shares

    pairs = loaded.task.prompt_pairs(args.n, "position", seed=args.seed)
    r = route_shares(
        loaded.model,
        pairs.clean.tokens,
        pairs.corrupt.tokens,
        pairs.clean.labels,
        pairs.corrupt.labels,
        pad_mask=pairs.pad_mask,
        n_bootstrap=args.n_bootstrap,
        seed=args.seed,
        progress=True,
    )
    verdict = positional_dominance(r)
    return {
        "result": r.to_dict(),
        "n_used": len(pairs),
        "counterfactual": _pairs_record(loaded, pairs),
        "verdict": verdict.text(),
        "line": verdict.text(),
    }


def _head_types(loaded, args) -> dict[str, Any]:
    from probes.heads.types import head_type_scores

    ps = _prompts(loaded, args.n)
    result = head_type_scores(loaded.model, ps.tokens, pad_mask=ps.pad_mask, progress=True)
    counts = {kind: len(heads) for kind, heads in result.types().items()}
    return {"result": result.to_dict(), "n_used": len(ps), "line": f"heads of each type {counts}"}


def _frequency(loaded, args) -> dict[str, Any]:
    """RoPE frequency usage and Barbero et al.'s two findings. The positional heads are the heads
    the ``head_types`` step typed previous-token (read from its file: that step runs first)."""
    from probes.decomposition import frequency_usage, high_frequency_positional, low_frequency_norm
    from probes.decomposition.frequency_findings import MEASURES

    path = Path(args.out) / "head_types.json"
    if not path.is_file():
        raise ValueError(
            f"{path}: the frequency step reads the head_types step's heads; run it first"
        )
    types = json.loads(path.read_text())["result"]["types"]
    positional = [tuple(h) for h in types["previous_token"]]
    ps = _prompts(loaded, args.n)
    usage = frequency_usage(loaded.model, ps.tokens, pad_mask=ps.pad_mask, progress=True)
    every = [(layer, h) for layer in usage.layers for h in range(usage.logit_share.shape[1])]
    low = low_frequency_norm(usage)
    findings = {"low_frequency_norm": low.to_dict() | {"text": low.text()}}
    for measure in MEASURES:
        for name, heads in (("positional", positional), ("every", every)):
            if heads:
                f = high_frequency_positional(usage, heads, measure=measure)
                findings[f"high_{measure}_{name}"] = f.to_dict() | {"text": f.text()}
    return {
        "result": usage.to_dict(),
        "n_used": len(ps),
        "positional_heads": [list(h) for h in positional],
        "positional_heads_are": "the heads typed previous-token (head_types.json)",
        "findings": findings,
        "line": low.text(),
    }


STEP_FUNCTIONS: dict[str, Callable[[Any, argparse.Namespace], dict[str, Any]]] = {
    "accuracy": _accuracy,
    "ablation": _ablation,
    "patching": _patching,
    "routes": _routes,
    "head_types": _head_types,
    "frequency": _frequency,
    "circuit": circuit_step,
}


def _report(out: Path, readme: str | None) -> int:
    from pe_interp.report.survey import write_survey_report

    written = write_survey_report(out, readme)
    print("wrote " + ", ".join(str(p) for p in written))
    return 0
