"""Named sizes: ``smoke`` (tests), ``quick`` (a 2-core CPU, minutes), ``mid`` (the paper's 6 x 16
topology on one CPU core, about 20 minutes), ``paper`` (a GPU).

A preset fixes the model shape, the task's size and the optimisation; the encoding, the task and
the seed are chosen per run, and any field can be overridden.

``quick`` was sized by experiment on the 2-core CI machine (see README, "Findings"): the smallest
model and data at which RoPE still learns task 1 well in a few minutes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pe_interp.config import ModelConfig, TrainConfig
from pe_interp.encodings import EncodingSpec, make_spec, parse_encoding


@dataclass(frozen=True)
class Preset:
    model: dict[str, Any]
    task: dict[str, dict[str, Any]]  # per task name
    train: dict[str, Any]


PRESETS: dict[str, Preset] = {
    "smoke": Preset(
        model=dict(n_layers=2, d_model=32, n_heads=4, d_mlp=64, dropout=0.0),
        task={
            "distance": dict(d_vocab=32, max_between=6, max_side=3, max_len=16),
            "count": dict(d_vocab=48, n_triggers=4, max_count=6, length=12),
        },
        train=dict(n_train=512, n_test=256, epochs=2, batch_size=64, lr=3e-3, eval_batch_size=256),
    ),
    "quick": Preset(
        model=dict(n_layers=2, d_model=64, n_heads=8, d_mlp=128, dropout=0.0),
        task={
            "distance": dict(d_vocab=128, max_between=30, max_side=8, max_len=48),
            "count": dict(d_vocab=128, n_triggers=10, max_count=30, length=48),
        },
        train=dict(n_train=12_288, n_test=2_000, epochs=6, batch_size=128, lr=3e-3, eval_batch_size=1000),
    ),
    # The paper's topology (6 layers x 16 heads, 96 heads) cut in width to train on one CPU core
    # in about 15-20 minutes, on quick's task (distances 2-31). d_head 8 keeps RoPE 4 frequency
    # pairs; d_mlp = 2 d_model as in the paper. Sized by experiment (README, "Findings").
    "mid": Preset(
        model=dict(n_layers=6, d_model=128, n_heads=16, d_mlp=256, dropout=0.0),
        task={
            "distance": dict(d_vocab=128, max_between=30, max_side=8, max_len=48),
            "count": dict(d_vocab=128, n_triggers=10, max_count=30, length=48),
        },
        train=dict(n_train=12_288, n_test=2_000, epochs=10, batch_size=128, lr=3e-3, eval_batch_size=1000),
    ),
    "paper": Preset(
        model=dict(n_layers=6, d_model=256, n_heads=16, d_mlp=512, dropout=0.1),
        task={
            "distance": dict(d_vocab=512, max_between=70, max_side=25, max_len=120),
            "count": dict(d_vocab=512, n_triggers=30, max_count=100, length=120),
        },
        train=dict(n_train=70_000, n_test=30_000, epochs=100, batch_size=512, lr=1e-4, warmup_frac=0.06),
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
    if isinstance(encoding, str) and encoding in AUTHORS_ENCODINGS and encoding not in ("nope", "rope"):
        encoding = AUTHORS_ENCODINGS[encoding]
    specs = parse_encoding(encoding)
    explicit = _explicit_params(encoding)
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


def _explicit_params(encoding: Any) -> list[set[str]]:
    """The parameter names the user wrote for each part of ``encoding`` (in parse order)."""
    if isinstance(encoding, list | tuple):
        return [keys for part in encoding for keys in _explicit_params(part)]
    if isinstance(encoding, dict):
        return [set(encoding) - {"name"}]
    if isinstance(encoding, EncodingSpec):
        return [set(encoding.kwargs)]
    return [set() for _ in parse_encoding(encoding)]


def _split_overrides(overrides: dict[str, Any]) -> tuple[dict, dict, dict]:
    model_fields = set(ModelConfig.__dataclass_fields__)
    train_fields = set(TrainConfig.__dataclass_fields__)
    m, t, k = {}, {}, {}
    for key, value in overrides.items():
        if value is None:
            continue
        if key in ("n_ctx", "n_classes"):
            raise ValueError(f"{key} is derived from the task; change the task's size instead")
        if key == "device":
            t[key] = value
        elif key == "d_vocab":
            k[key] = value
        elif key in model_fields:
            m[key] = value
        elif key in train_fields:
            t[key] = value
        else:
            k[key] = value  # validated by the task's own constructor
    return m, t, k


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
    m_over, t_over, k_over = _split_overrides(overrides)
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
