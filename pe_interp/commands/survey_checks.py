"""What the survey checks before its steps run, and how it tells a step done: every step asked for
is checked before the model loads (what no model is needed to tell), once the prompts are read, and
once the model is built, each before the first forward; a step's file is kept only where it records
these weights, prompts and options."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

# What a step's numbers depend on besides the weights, the prompts and --n (the stamp): read
# back from its saved result, so that a step run with other options is run again.
STEP_OPTIONS: dict[str, tuple[str, ...]] = {
    "ablation": ("n_bootstrap", "seed"),
    "patching": ("n_bootstrap",),
    "routes": ("n_bootstrap", "seed"),
    "circuit": ("seed",),
}


def prompt_preset(family: str, n: int) -> str:
    """The preset whose prompts a family draws for ``--n n``: the smallest of quick, mid and paper
    that holds n (quick for n <= 64, so that the first 64 prompts stay those of earlier surveys);
    a one-line ValueError past the largest. A prompts file holds what it holds (its steps record
    the number they used)."""
    from pe_interp.prompts.task import PROMPT_COUNTS

    if str(family).endswith(".jsonl"):
        return "quick"
    for preset in ("quick", "mid", "paper"):
        if n <= PROMPT_COUNTS[preset]:
            return preset
    raise ValueError(
        f"--n must be <= {PROMPT_COUNTS['paper']} for a prompt family (the most prompts it draws), "
        f"got {n}"
    )


PAIR_STEPS = ("patching", "routes")  # the steps that read a prompts file's counterfactual pairs


def check_steps(args: argparse.Namespace, todo: list[str], out: Path) -> None:
    """One line, before the model loads and before anything is written, for a step that cannot
    run: frequency without the head_types step's heads, a pair step on a prompts file without
    counterfactuals, --redo of a step not asked for, --n past what a family draws."""
    from pe_interp.prompts.jsonl import count_counterfactuals

    stray = [s for s in args.redo if s not in todo]
    if stray:
        raise ValueError(
            f"--redo {' '.join(stray)}: not among --steps ({' '.join(todo)}); add it to --steps"
        )
    prompt_preset(args.family, args.n)
    if "frequency" in todo and "head_types" not in todo and not (out / "head_types.json").is_file():
        raise ValueError(
            f"--steps frequency reads the heads the head_types step typed, and {out} has no "
            "head_types.json: add head_types to --steps"
        )
    pair_steps = [s for s in PAIR_STEPS if s in todo]
    jsonl = str(args.family).endswith(".jsonl")
    if "circuit" in todo and jsonl:
        raise ValueError(
            f"--family {args.family}: a prompts file names no spans of its prompts' positions, "
            "which the circuit step keeps its edges at: leave circuit out of --steps"
        )
    if pair_steps and jsonl and count_counterfactuals(args.family) == 0:
        named, rest = " and ".join(pair_steps), " ".join(s for s in todo if s not in PAIR_STEPS)
        raise ValueError(
            f"--family {args.family}: no line gives a counterfactual_prompt, which {named} "
            f"{'need' if len(pair_steps) > 1 else 'needs'} (clean/counterfactual pairs): add "
            "counterfactual_prompt and counterfactual_answer to its lines, or leave "
            f"{named} out" + (f" (--steps {rest})" if rest else "")
        )


def stamp_of(weights: dict[str, Any], task, args: argparse.Namespace) -> dict[str, Any]:
    """What a step's file records of its inputs: the weights, the prompts and --n."""
    return {"weights": weights, "prompts": task.to_dict(), "n": args.n}


def check_prompts(
    task, stamp: dict[str, Any], args: argparse.Namespace, todo: list[str], out: Path
) -> None:
    """One line, once the prompts are read and before the model's first forward, for a step these
    prompts cannot serve: a pair step on a file without counterfactuals, routes on content
    counterfactuals, frequency reading a head_types.json of other weights, prompts or --n."""
    user = getattr(task, "user", None)
    pairs = None if user is None else user.counterfactuals
    if user is not None and pairs is None and any(s in todo for s in PAIR_STEPS):
        raise ValueError(f"--family {args.family}: no line gives a counterfactual_prompt")
    if "routes" in todo and pairs is not None and pairs.kind != "position":
        raise ValueError(
            f"--family {args.family}: its counterfactuals change the tokens (content "
            "counterfactuals), and route shares measure position on position-only pairs (the "
            "same tokens moved): leave routes out of --steps, or give pairs that move the "
            "prompt's tokens"
        )
    if "frequency" in todo and "head_types" not in todo:
        why = changed_since(out / "head_types.json", stamp, "head_types", args)
        if why != "":
            raise ValueError(
                f"{out / 'head_types.json'} is not of this survey ({why or 'missing'}), and "
                "the frequency step reads its heads: add head_types to --steps"
            )


def check_model(loaded, args: argparse.Namespace, todo: list[str]) -> None:
    """One line, once the model is built and before its first forward on the prompts, for a step
    this model cannot serve: routes where its positions cannot be moved, frequency where it does
    not rotate queries and keys, circuit where its edges cannot be carried."""
    model = loaded.model
    if "routes" in todo:
        from probes.routes.moving import can_move_positions

        if not can_move_positions(model):
            raise ValueError(
                f"{args.model}: route shares cannot move this model's positions "
                f"({model.cfg.encoding_name}): leave routes out of --steps"
            )
    if "frequency" in todo:
        from probes.decomposition.frequency import not_rotary

        why = not_rotary(model)
        if why:
            raise ValueError(f"{args.model}: {why}: leave frequency out of --steps")
    if "circuit" in todo:  # its edges need each head's own residual term and q/k/v forks (a
        model.check_forks()  # check that runs a few random tokens: after the checks that do not)


def changed_since(
    path: Path, stamp: dict[str, Any], step: str, args: argparse.Namespace
) -> str | None:
    """Why the step's file cannot stand for this run of the step ("" where it can: it records
    these weights, these prompts, this n and these options; None where there is no file), said
    as what changed."""
    try:
        saved = json.loads(path.read_text())
        recorded = saved["survey"]
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError):
        return "its file is unreadable"
    if not done_stamp(recorded, stamp):
        if isinstance(recorded, dict) and recorded.get("n") != stamp["n"]:
            return f"--n {recorded.get('n')} before, {stamp['n']} now"
        return "other weights or prompts"
    result = saved.get("result") if isinstance(saved.get("result"), dict) else {}
    for option in STEP_OPTIONS.get(step, ()):
        before, now = result.get(option), getattr(args, option)
        if before != now:
            return f"--{option.replace('_', '-')} {before} before, {now} now"
    if step == "frequency":  # it reads the head_types step's heads: those of head_types.json now
        try:
            types = json.loads((path.parent / "head_types.json").read_text())["result"]["types"]
            heads = [list(h) for h in types["previous_token"]]
        except (OSError, ValueError, KeyError, TypeError):
            heads = None
        if saved.get("positional_heads") != heads:
            return "the head_types step's heads changed"
    return ""


def done(path: Path, stamp: dict[str, Any]) -> bool:
    """The step's file records these weights, these prompts and this n (the weights by their
    hash and origin, not by the path the model was named by: a survey resumes under another)."""
    try:
        saved = json.loads(path.read_text())["survey"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return done_stamp(saved, stamp)


def done_stamp(saved: Any, stamp: dict[str, Any]) -> bool:
    return identity(json.loads(json.dumps(stamp, default=str))) == identity(saved)


def identity(stamp: Any) -> Any:
    """A stamp without the path the weights were named by (``weights.source.file``)."""
    if not isinstance(stamp, dict):
        return stamp
    source = (stamp.get("weights") or {}).get("source")
    if isinstance(source, dict) and "file" in source:
        source = {k: v for k, v in source.items() if k != "file"}
        return {**stamp, "weights": {**stamp["weights"], "source": source}}
    return stamp


__all__ = [
    "PAIR_STEPS",
    "changed_since",
    "check_model",
    "check_prompts",
    "check_steps",
    "done",
    "done_stamp",
    "identity",
    "stamp_of",
    "prompt_preset",
]
