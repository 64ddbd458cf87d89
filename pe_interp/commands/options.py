"""Command-line flags generated from the configs, so that the CLI and the API cannot drift.

:func:`add_setting_flags` gives ``pe-interp train`` one flag per field of
:class:`~pe_interp.config.model.ModelConfig`, :class:`~pe_interp.config.model.TrainConfig` and every task
(``n_layers`` -> ``--n-layers``, a bool ``final_norm`` -> ``--final-norm / --no-final-norm``,
``betas`` -> ``--betas B1 B2``, an optional field takes ``none``). A flag that is not given is not
passed at all, so the preset's value stands; a given value goes to the dataclass unchanged and is
validated there, with the dataclass's own one-line error. :data:`NOT_FLAGS` lists the fields that
have no flag of their own, and why. ``tests/test_cli.py`` checks that every field is one or the
other.

:func:`device_arg` is the one device check of every sub-command that loads a model.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from pe_interp.config.model import (
    ACT_FNS,
    ATTENTION_DIRS,
    BACKENDS,
    INIT_MODES,
    KV_SOURCES,
    LR_SCHEDULES,
    NORMS,
    POOLINGS,
    RUNTIME_FLAGS,
    ModelConfig,
    TrainConfig,
    check_device,
    default_device,
)
from pe_interp.config.presets import flag_name
from pe_interp.tasks import TASKS

# Fields without a flag of their own, and where they come from instead.
NOT_FLAGS: dict[str, str] = {
    "seed": "--seed sets the model, data and training seeds together",
    "encoding": "--encoding (a name, a composition with parameters, or JSON)",
    "device": "--device (the model follows the training device)",
    **{
        name: "a runtime hook switch, never saved with a run: model.set_"
        + name
        + "(True) on a loaded model"
        for name in RUNTIME_FLAGS
    },
}
# Accepted (so that the error says why), but not listed in --help.
DERIVED = ("n_ctx", "n_classes")

CHOICES: dict[str, tuple] = {
    "act_fn": ACT_FNS,
    "normalization_type": NORMS,
    "attention_dir": ATTENTION_DIRS,
    "pooling": POOLINGS,
    "attn_backend": BACKENDS,
    "kv_source": KV_SOURCES,
    "init_mode": INIT_MODES,
    "lr_schedule": LR_SCHEDULES,
}

HELP: dict[str, str] = {
    # ModelConfig
    "n_layers": "transformer blocks",
    "d_model": "residual width",
    "n_heads": "attention heads per layer",
    "d_head": "head width (default d_model / n_heads)",
    "d_mlp": "MLP width (default 4 d_model; 0: attention-only blocks)",
    "d_vocab": "vocabulary size (a task setting; the model follows)",
    "act_fn": "MLP activation (the authors': relu)",
    "normalization_type": "LayerNorm, RMSNorm or none",
    "final_norm": "a norm before the readout (the authors': --no-final-norm)",
    "attention_dir": "bidirectional or causal attention",
    "pooling": "how the readout pools the sequence",
    "dropout": "dropout on the attention and MLP outputs",
    "attn_dropout": "dropout on the attention weights",
    "embed_dropout": "dropout on the embeddings (none: the same as --dropout; the authors': 0)",
    "init_std": "std of the normal initialisation (--init-mode normal)",
    "init_mode": "normal: N(0, init_std); torch: PyTorch's defaults, as the authors' model gets",
    "attn_backend": "attention implementation",
    "mask_padding": "mask pad tokens out of attention and pooling (the authors': --no-mask-padding)",
    "kv_source": "keys/values from the residual stream, or from the input embeddings (the authors')",
    "pad_id": "the pad token id",
    "silent_heads": "heads that write nothing by construction (W_V, b_V, W_O zero: a fixed point of training), as L:H",
    "eps": "norm epsilon",
    # TrainConfig
    "n_train": "training examples",
    "n_test": "held-out examples",
    "epochs": "training epochs",
    "batch_size": "training batch size",
    "lr": "peak learning rate",
    "weight_decay": "AdamW weight decay",
    "betas": "AdamW betas, two numbers (the authors': 0.98 0.9)",
    "warmup_frac": "share of the steps spent warming up",
    "min_lr_frac": "the cosine's floor, as a share of --lr",
    "grad_clip": "gradient-norm clip (0: none)",
    "eval_every": "steps between evaluations (0: once per epoch)",
    "checkpoint_every": "steps between checkpoints (0: once per epoch)",
    "eval_batch_size": "evaluation batch size",
    "amp": "bfloat16 autocast where it pays (CUDA)",
    "ignore_index": "a class left out of the loss and accuracy (none: count every class)",
    "lr_schedule": "warmup_cosine, or the authors' LambdaLR",
    "stop_at_acc": "stop once held-out accuracy reaches this (0: train to the end)",
    "snapshots": "log: keep the weights at steps 0, 1, 2, 4, ..., every --snapshot-every steps and the end",
    "snapshot_every": "steps between snapshots after the powers of two (0: once per epoch)",
    # tasks
    "max_between": "largest number of tokens between the two triggers",
    "max_side": "largest number of tokens on each side of the triggers (task 1), before the marker (task 3)",
    "max_len": "truncation length",
    "fillers_include_triggers": "trigger tokens may appear among the fillers (the authors')",
    "distinct_fillers": "distinct filler tokens within each segment (the authors')",
    "dedup": "drop duplicate sequences before splitting (the authors')",
    "n_triggers": "how many distinct trigger tokens",
    "max_count": "largest count",
    "length": "sequence length",
    "ignore_zero": "leave count 0 out",
    "offset": "the target's distance after the marker",
    "max_after": "largest number of tokens after the marker",
    "extra_left": "more fillers before everything (length generalisation; the decisive tokens move right)",
    "extra_right": "more fillers after everything (length generalisation)",
}


def _none_or(convert):
    def parse(text: str) -> Any:
        return None if text.strip().lower() in ("none", "null") else convert(text)

    parse.__name__ = getattr(
        convert, "__name__", "value"
    )  # argparse names it in "invalid ... value"
    return parse


def _add(group, name: str, annotation: str, default: Any, help_text: str) -> None:
    kind = annotation.replace(" ", "")
    optional = kind.endswith("|None")
    base = kind.removesuffix("|None")
    choices = CHOICES.get(name)
    shown = f" [{' | '.join('none' if c is None else str(c) for c in choices)}]" if choices else ""
    full = f"{help_text}{shown}" + (
        "" if "default" in help_text else f" (default {'none' if default is None else default})"
    )
    flag = flag_name(name)
    if base == "bool":
        group.add_argument(
            flag,
            dest=name,
            action=argparse.BooleanOptionalAction,
            default=argparse.SUPPRESS,
            help=full,
        )
    elif base.startswith("tuple[tuple[int"):
        group.add_argument(
            flag, dest=name, nargs="*", metavar="L:H", default=argparse.SUPPRESS, help=full
        )
    elif base.startswith("tuple[float"):
        group.add_argument(
            flag,
            dest=name,
            type=float,
            nargs=2,
            metavar=("B1", "B2"),
            default=argparse.SUPPRESS,
            help=full,
        )
    else:
        convert = {"int": int, "float": float, "str": str}.get(base)
        if convert is None:
            raise TypeError(f"options: no flag type for {name}: {annotation}")
        group.add_argument(
            flag,
            dest=name,
            type=_none_or(convert) if optional else convert,
            metavar=name.upper(),
            default=argparse.SUPPRESS,
            help=full,
        )


def setting_fields() -> dict[str, tuple[str, Any, str]]:
    """Every run setting that gets a flag: name -> (annotation, default, group)."""
    out: dict[str, tuple[str, Any, str]] = {}
    for cls, group in ((ModelConfig, "model"), (TrainConfig, "training")):
        for f in dataclasses.fields(cls):
            if f.name not in NOT_FLAGS and f.name not in DERIVED and f.name not in out:
                out[f.name] = (str(f.type), f.default, group)
    owners: dict[str, list[str]] = {}
    for task_name, cls in TASKS.items():
        for f in dataclasses.fields(cls):
            if f.name in NOT_FLAGS or (f.name in out and f.name not in owners):
                continue
            owners.setdefault(f.name, []).append(task_name)
            if f.name not in out:
                out[f.name] = (str(f.type), f.default, "")
    for name, tasks in owners.items():
        group = "task: every" if len(tasks) == len(TASKS) else "task: " + ", ".join(tasks)
        out[name] = (*out[name][:2], group)
    return out


def add_setting_flags(parser: argparse.ArgumentParser) -> list[str]:
    """Add a flag for every run setting (see the module docstring); returns their dests."""
    groups: dict[str, Any] = {}
    titles = {
        "model": "model (ModelConfig; a flag not given keeps the preset's value, else the default shown)",
        "training": "training (TrainConfig)",
        "task: every": "task settings (every task)",
    }
    names = []
    for name, (annotation, default, group) in setting_fields().items():
        if group not in groups:
            title = titles.get(
                group,
                f"task settings (--task {group.removeprefix('task: ').replace(', ', ' or ')} only)",
            )
            groups[group] = parser.add_argument_group(title)
        _add(groups[group], name, annotation, default, HELP.get(name, name.replace("_", " ")))
        names.append(name)
    for name in DERIVED:
        parser.add_argument(
            flag_name(name), dest=name, type=int, default=argparse.SUPPRESS, help=argparse.SUPPRESS
        )
        names.append(name)
    return names


def given_settings(args: argparse.Namespace, names: list[str]) -> dict[str, Any]:
    """The settings given on the command line (a flag not given is absent, not None)."""
    out = {}
    for name in names:
        if hasattr(args, name):
            value = getattr(args, name)
            out[name] = tuple(value) if isinstance(value, list) else value
    return out


def add_device_flag(parser: argparse.ArgumentParser, default: str | None = None) -> None:
    parser.add_argument(
        "--device",
        default=default,
        help="cpu | cuda | cuda:N | mps"
        + ("" if default else " (default: cuda when available, else cpu)"),
    )


def add_model_dir_flags(parser: argparse.ArgumentParser) -> None:
    """``--task``/``--preset``: probe a saved Hugging Face model directory on one of our tasks
    (:mod:`pe_interp.runs.model_dirs`); a pe-interp run knows its own."""
    parser.add_argument(
        "--task",
        default=None,
        help="for a saved Hugging Face model directory or a GGUF file: the task to probe it on: "
        "a prompt family in the model's own tokens (induction, recall, successor), a prompts "
        "file (FILE.jsonl), or one of our tasks in language-model form (class c is answer "
        "token d_vocab + c)",
    )
    parser.add_argument(
        "--preset",
        default="quick",
        help="for a model directory or GGUF file: the task's size and splits (default quick; "
        "prompts: smoke 16, quick 64, mid 256, paper 1024)",
    )
    parser.add_argument(
        "--revision",
        default=None,
        help="for a model on the Hugging Face hub (owner/name, where the "
        "hub is reachable): its revision, e.g. Pythia's step1000",
    )


def model_dir_arg(args: argparse.Namespace) -> dict[str, Any]:
    """What :func:`writing_run` needs of ``--task``/``--preset``."""
    return {
        "task": getattr(args, "task", None),
        "preset": getattr(args, "preset", "quick"),
        "revision": getattr(args, "revision", None),
        "model_dir_ok": True,
    }


def device_arg(value: str | None) -> str:
    """The ``--device`` value checked against this machine (None: cuda when available, else
    cpu); a one-line error naming the flag otherwise."""
    return check_device(default_device() if value is None else value, "--device")


def seed_type(text: str) -> int:
    """The argparse type of every ``--seed``: a whole number in 0..2**63 - 1
    (:func:`~pe_interp.util.checks.seed_problem`), refused in one line before any work."""
    from pe_interp.util.checks import seed_problem

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
    why = seed_problem(value)
    if why:
        raise argparse.ArgumentTypeError(why)
    return value


def bootstrap_arg(value: int, flag: str = "--n-bootstrap", zero_ok: bool = True) -> int:
    """``--n-bootstrap``: 0 (no intervals, where ``zero_ok``) or enough replicates for a 95%
    interval (:func:`probes.common.metrics.min_bootstrap`: each tail holds at least one); a
    one-line error otherwise, before any work."""
    from probes.common.metrics import min_bootstrap

    low = min_bootstrap(0.95)
    if 0 < value < low:
        raise ValueError(
            f"{flag} {value} is too few replicates for a 95% interval (each of its tails must "
            f"hold at least one): give {'0 (no intervals) or ' if zero_ok else ''}at least {low}"
        )
    return value


def positive_n(value: int | None, flag: str = "--n") -> int | None:
    if value is not None and value < 1:
        raise ValueError(f"{flag} must be >= 1, got {value}")
    return value


def at_least(value: float | None, low: float, flag: str, high: float | None = None) -> float | None:
    """``value`` (None passes) if ``low <= value`` (and ``<= high``), else a one-line error naming the flag."""
    if value is not None and not (low <= value and (high is None or value <= high)):
        bound = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"{flag} must be {bound}, got {value}")
    return value


__all__ = [
    "DERIVED",
    "NOT_FLAGS",
    "add_device_flag",
    "add_model_dir_flags",
    "model_dir_arg",
    "add_setting_flags",
    "at_least",
    "bootstrap_arg",
    "device_arg",
    "given_settings",
    "positive_n",
    "seed_type",
    "setting_fields",
]
