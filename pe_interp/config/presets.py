"""Named sizes: ``smoke`` (tests), ``quick`` (a 2-core CPU, minutes), ``mid`` (the paper's 6 x 16
topology on one CPU core, about 20 minutes), ``paper`` (a GPU).

A preset fixes the model shape, the task's size and the optimisation; the encoding, the task and
the seed are chosen per run, and any field can be overridden.

``quick`` was sized by experiment on the 2-core CI machine (see findings/README.md, "The `quick`
preset"): the smallest model and data at which RoPE still learns task 1 well in a few minutes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from pe_interp.config.model import ModelConfig, TrainConfig
from pe_interp.encodings import EncodingSpec, given_parameters, make_spec, parse_encoding


@dataclass(frozen=True)
class Preset:
    model: dict[str, Any]
    task: dict[str, dict[str, Any]]  # per task name
    train: dict[str, Any]


# Task 3 (retrieve, issue 23): the target sits this many tokens after the marker at every size
# but smoke.
RETRIEVE_OFFSET = 4

PRESETS: dict[str, Preset] = {
    "smoke": Preset(
        model=dict(n_layers=2, d_model=32, n_heads=4, d_mlp=64, dropout=0.0),
        task={
            "distance": dict(d_vocab=32, max_between=6, max_side=3, max_len=16),
            "count": dict(d_vocab=48, n_triggers=4, max_count=6, length=12),
            "retrieve": dict(d_vocab=32, offset=2, max_side=3, max_after=8, max_len=12),
        },
        train=dict(n_train=512, n_test=256, epochs=2, batch_size=64, lr=3e-3, eval_batch_size=256),
    ),
    "quick": Preset(
        model=dict(n_layers=2, d_model=64, n_heads=8, d_mlp=128, dropout=0.0),
        task={
            "distance": dict(d_vocab=128, max_between=30, max_side=8, max_len=48),
            "count": dict(d_vocab=128, n_triggers=10, max_count=30, length=48),
            "retrieve": dict(
                d_vocab=128, offset=RETRIEVE_OFFSET, max_side=16, max_after=31, max_len=48
            ),
        },
        train=dict(
            n_train=12_288, n_test=2_000, epochs=6, batch_size=128, lr=3e-3, eval_batch_size=1000
        ),
    ),
    # The paper's topology (6 layers x 16 heads, 96 heads) cut in width to train on one CPU core
    # in about 15-20 minutes, on quick's task (distances 2-31). d_head 8 keeps RoPE 4 frequency
    # pairs; d_mlp = 2 d_model as in the paper. Sized by experiment (findings/README.md, "The
    # deposit study at `mid`").
    "mid": Preset(
        model=dict(n_layers=6, d_model=128, n_heads=16, d_mlp=256, dropout=0.0),
        task={
            "distance": dict(d_vocab=128, max_between=30, max_side=8, max_len=48),
            "count": dict(d_vocab=128, n_triggers=10, max_count=30, length=48),
            "retrieve": dict(
                d_vocab=128, offset=RETRIEVE_OFFSET, max_side=16, max_after=31, max_len=48
            ),
        },
        train=dict(
            n_train=12_288, n_test=2_000, epochs=10, batch_size=128, lr=3e-3, eval_batch_size=1000
        ),
    ),
    "paper": Preset(
        model=dict(n_layers=6, d_model=256, n_heads=16, d_mlp=512, dropout=0.1),
        task={
            "distance": dict(d_vocab=512, max_between=70, max_side=25, max_len=120),
            "count": dict(d_vocab=512, n_triggers=30, max_count=100, length=120),
            "retrieve": dict(
                d_vocab=512, offset=RETRIEVE_OFFSET, max_side=25, max_after=94, max_len=120
            ),
        },
        train=dict(
            n_train=70_000, n_test=30_000, epochs=100, batch_size=512, lr=1e-4, warmup_frac=0.06
        ),
    ),
}

# The authors' released code (``dis_gen/trans.py``, ``partialrope.py``, ``data-gen.py``; paper
# digest §3, §4, §9) differs from a textbook transformer in each of these ways. Every entry is an
# ordinary field, so any one can be switched back on its own (``authors_quirks=True,
# init_mode="normal"``) and a finding tied to it.
AUTHORS_QUIRKS: dict[str, dict[str, Any]] = {
    "model": dict(
        mask_padding=False,  # pads are attended to and mean-pooled
        kv_source="embed",  # every layer's K/V read the input embedding (+ PE), un-normalised
        final_norm=False,
        act_fn="relu",
        dropout=0.1,  # attention output and MLP output
        attn_dropout=0.1,  # attention weights
        embed_dropout=0.0,  # none on the embeddings
        init_mode="torch",  # PyTorch defaults: N(0, 1) embeddings, U(±1/√fan_in) projections
    ),
    "train": dict(
        lr=1e-4,
        betas=(0.98, 0.9),  # as written in their code (probably a swap of (0.9, 0.98))
        weight_decay=1e-5,
        grad_clip=0.0,
        warmup_frac=0.06,
        min_lr_frac=0.0,
        lr_schedule="authors",  # their LambdaLR, stepped per batch
        amp=False,  # float32 throughout, also on a GPU
    ),
    "distance": dict(fillers_include_triggers=True, distinct_fillers=True, dedup=True),
    "count": dict(),
    "retrieve": dict(),  # task 3 is not the authors'; their model and training apply, no data quirks
    # Task 2: count 0 stays in the data and is ignored by the loss and accuracy.
    "count_train": dict(ignore_index=0),
}
# Their 70/30 random split of one generated set: the held-out set is 3/7 of the training set.
AUTHORS_TEST_FRACTION = 3 / 7

# The authors' six PE names (``trans.py``) as encodings of this package. Their "rope" model adds a
# concat-layout sinusoid to the input; pure RoPE on k heads is their ``partialrope.py``.
AUTHORS_ENCODINGS: dict[str, Any] = {
    "nope": "nope",
    "absolute": "sinusoidal",
    "random": "learned",
    "relative": "t5",
    "alibi": {"name": "alibi", "slopes": "authors"},
    "rope": [{"name": "sinusoidal", "layout": "concat"}, "rope"],
}


def authors_encoding(encoding: Any) -> tuple[EncodingSpec, ...]:
    """An encoding as the authors' code builds it.

    Their PE names (``absolute``, ``random``, ``relative``...) map through
    :data:`AUTHORS_ENCODINGS`. Parameters they fixed and the user left at our default take their
    value: ALiBi's slopes are ``exp(-h/H)``, and a sinusoid composed with RoPE (their "rope"
    model) uses the concat layout ``[sin(all), cos(all)]``. Parameters given explicitly are kept.
    """
    if (
        isinstance(encoding, str)
        and encoding in AUTHORS_ENCODINGS
        and encoding not in ("nope", "rope")
    ):
        encoding = AUTHORS_ENCODINGS[encoding]
    specs = parse_encoding(encoding)
    explicit = given_parameters(encoding)
    names = {s.name for s in specs}
    out = []
    for spec, given in zip(specs, explicit):
        params = spec.kwargs
        if spec.name == "alibi" and "slopes" not in given:
            params["slopes"] = "authors"
        if spec.name == "sinusoidal" and "rope" in names and "layout" not in given:
            params["layout"] = "concat"
        out.append(make_spec(spec.name, params))
    return tuple(out)


def close_matches(name: str, candidates: set[str] | list[str], n: int = 3) -> list[str]:
    """The ``n`` candidates most like ``name``, for "did you mean" hints."""
    import difflib

    return sorted(candidates, key=lambda c: (-difflib.SequenceMatcher(None, name, c).ratio(), c))[
        :n
    ]


def run_settings(task: str | None = None) -> dict[str, str]:
    """Every setting a run takes by name (what ``build_run_configs``' overrides, a grid's keys
    and ``pe-interp train``'s flags may set), mapped to where it goes: ``model``, ``train`` or
    ``task``. With ``task``, only that task's own fields count as task settings."""
    from pe_interp.tasks import TASKS

    out: dict[str, str] = {}
    for name, cls in TASKS.items():
        if task is None or name == task:
            out.update({f.name: "task" for f in dataclasses.fields(cls) if f.name != "seed"})
    out.update({f.name: "train" for f in dataclasses.fields(TrainConfig) if f.name != "seed"})
    out.update(
        {
            f.name: "model"
            for f in dataclasses.fields(ModelConfig)
            if f.name not in ("seed", "d_vocab", "n_ctx", "n_classes", "encoding")
        }
    )
    out["device"] = "train"  # the model follows the training device
    return out


def _split_overrides(task: str, overrides: dict[str, Any]) -> tuple[dict, dict, dict]:
    """Route overrides by field name; an unknown name or another task's field is a one-line
    ValueError that says what was meant."""
    where = run_settings(task)
    m, t, k = {}, {}, {}
    for key, value in overrides.items():
        if key in ("n_ctx", "n_classes"):
            raise ValueError(f"{key} is derived from the task; change the task's size instead")
        if key not in where:
            others = {name for name, place in run_settings().items() if place == "task"} - set(
                where
            )
            if key in others:
                own = sorted(n for n, place in where.items() if place == "task")
                raise ValueError(
                    f"{key} is a setting of another task, not of task {task!r} (its settings: {', '.join(own)})"
                )
            hint = ", ".join(
                close_matches(key, set(run_settings()) | {"encoding", "seed", "preset", "task"})
            )
            raise ValueError(f"unknown setting {key!r}; did you mean {hint}?")
        {"model": m, "train": t, "task": k}[where[key]][key] = value
    return m, t, k


def flag_name(field_name: str) -> str:
    """The command-line flag of a setting: ``n_layers`` -> ``--n-layers``."""
    return "--" + field_name.replace("_", "-")


def _flag_words(name: str, value: Any) -> list[str]:
    if isinstance(value, bool):
        return [flag_name(name) if value else "--no-" + name.replace("_", "-")]
    if value is None:
        return [flag_name(name), "none"]
    if isinstance(value, list | tuple):
        return [flag_name(name), *map(str, value)]
    return [flag_name(name), str(value)]


def encoding_text(encoding: Any) -> str:
    """``encoding`` as ``--encoding`` takes it: the string as given, else the ``+``-joined
    ``name(key=value)`` form when it reads back the same, else JSON."""
    import json

    if isinstance(encoding, str):
        return encoding
    specs = parse_encoding(encoding)
    text = "+".join(str(s) for s in specs)
    try:
        if parse_encoding(text) == specs:
            return text
    except ValueError:
        pass
    return json.dumps([s.to_json() for s in specs])


def train_command(
    task: str,
    encoding: Any,
    preset: str,
    seed: int,
    authors_quirks: bool = False,
    out: str | None = None,
    **overrides: Any,
) -> str:
    """The ``pe-interp train`` command line that builds the same configs as these arguments
    (recorded in a run's config.json as ``command``, and printed by ``pe-interp show``)."""
    import shlex

    words = [
        "pe-interp",
        "train",
        "--task",
        task,
        "--encoding",
        encoding_text(encoding),
        "--preset",
        preset,
        "--seed",
        str(seed),
    ]
    if authors_quirks:
        words.append("--authors-quirks")
    for name, value in overrides.items():
        words += _flag_words(name, value)
    words += ["--out", str(out) if out is not None else "RUN_DIR"]
    return shlex.join(words)


def build_run_configs(
    task: str = "distance",
    encoding: Any = "rope",
    preset: str = "quick",
    seed: int = 0,
    authors_quirks: bool = False,
    **overrides: Any,
) -> tuple[ModelConfig, Any, TrainConfig]:
    """The model config, task and train config of one run.

    The seed sets the model initialisation, the data and the trigger choice together; overrides
    are routed by field name to the model, train or task config.
    """
    from pe_interp.tasks import make_task

    if preset not in PRESETS:
        raise ValueError(f"preset must be one of {', '.join(PRESETS)}; got {preset!r}")
    p = PRESETS[preset]
    if task not in p.task:
        raise ValueError(f"task must be one of {', '.join(p.task)}; got {task!r}")
    m_over, t_over, k_over = _split_overrides(task, overrides)
    task_kwargs = {**p.task[task], "seed": seed}
    model_kwargs = dict(p.model)
    train_kwargs = {**p.train, "seed": seed}
    if authors_quirks:
        model_kwargs.update(AUTHORS_QUIRKS["model"])
        train_kwargs.update(AUTHORS_QUIRKS["train"])
        train_kwargs.update(AUTHORS_QUIRKS.get(f"{task}_train", {}))
        train_kwargs["n_test"] = round(train_kwargs["n_train"] * AUTHORS_TEST_FRACTION)
        task_kwargs.update(AUTHORS_QUIRKS[task])
        encoding = authors_encoding(encoding)
    task_kwargs.update(k_over)
    model_kwargs.update(m_over)
    train_kwargs.update(t_over)
    task_obj = make_task(task, **task_kwargs)
    model_cfg = ModelConfig(
        encoding=encoding,
        d_vocab=task_obj.d_vocab,
        n_ctx=task_obj.max_len,
        n_classes=task_obj.n_classes,
        seed=seed,
        device=train_kwargs.get("device", "cpu"),
        **{k: v for k, v in model_kwargs.items() if k not in ("seed", "device")},
    )
    return model_cfg, task_obj, TrainConfig(**train_kwargs)
