"""The probes' bad-input table (issue 21, item 4): each case an id, a call on an
:class:`~bad_input_env.Env` and the pattern its one-line ValueError must match. Run by
``tests/test_bad_inputs_probes.py``; ``tests/test_bad_inputs_files.py`` checks that these ids, with
its own tables', cover the issue."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from bad_input_env import (
    FLOAT_LABELS,
    NAN_WQ,
    NO_BOOT,
    NUMPY,
    OOR,
    OTHER_MASK,
    OVERFLOW,
    Env,
    with_labels,
)

import pe_interp
from pe_interp.tasks import Batch
from probes import (
    AblationResult,
    Circuit,
    ablate_heads,
    ablate_heads_naive,
    attention_patterns,
    attribute,
    faithfulness_curve,
    find_deposits,
    gradient_coherence,
    keep_only,
    logit_terms,
    patch,
    path_patch,
    positional_scores,
)
from probes.ablation import head_means
from probes.common.metrics import bootstrap_ci, paired_bootstrap


def _ablate(e: Env, model=None, tokens=None, labels=None, pad_mask=None, **kw):
    b = e.b
    return ablate_heads(
        e.m if model is None else model,
        b.tokens if tokens is None else tokens,
        b.labels if labels is None else labels,
        pad_mask=b.pad_mask if pad_mask is None else pad_mask,
        **{**NO_BOOT, **kw},
    )


def _patch(e: Env, model=None, **kw):
    p = e.w.pairs
    args = dict(
        clean_labels=p.clean.labels,
        corrupt_labels=p.corrupt.labels,
        pad_mask=p.clean.pad_mask,
        **NO_BOOT,
    )
    tokens = (kw.pop("clean_tokens", p.clean.tokens), kw.pop("corrupt_tokens", p.corrupt.tokens))
    return patch(e.m if model is None else model, *tokens, **{**args, **kw})


def _ablation(e: Env) -> AblationResult:
    return AblationResult.load(e.file("ablation"))


# (id, call(env), message pattern): a ValueError with one matching line.
CASES: list[tuple[str, Callable[[Env], object], str]] = [
    # -- labels ------------------------------------------------------------------------------
    (
        "ablate_heads: labels out of range (accuracy)",
        lambda e: _ablate(e, labels=e.labels()),
        "^ablate_heads: " + OOR,
    ),
    (
        "ablate_heads: labels out of range (loss)",
        lambda e: _ablate(e, labels=e.labels(), metric="loss"),
        OOR,
    ),
    (
        "ablate_heads: labels out of range (logit)",
        lambda e: _ablate(e, labels=e.labels(), metric="logit"),
        OOR,
    ),
    (
        "ablate_heads: a negative label",
        lambda e: _ablate(e, labels=e.labels(2, -1)),
        r"labels must be integers in 0\.\.5 \(the model's classes\), got -1 at index 2$",
    ),
    (
        "ablate_heads: float labels",
        lambda e: _ablate(e, labels=e.b.labels.float() + 0.7),
        FLOAT_LABELS,
    ),
    (
        "ablate_heads: float labels that look whole",
        lambda e: _ablate(e, labels=e.b.labels.double()),
        r"labels must be integer class indices in 0\.\.5, got torch\.float64",
    ),
    (
        "ablate_heads: bool labels",
        lambda e: _ablate(e, labels=e.b.labels > 2),
        r"labels must be integer class indices in 0\.\.5, got torch\.bool \(booleans are not class indices\); pass labels\.long\(\)",
    ),
    (
        "ablate_heads: labels of another length",
        lambda e: _ablate(e, labels=e.b.labels[:5]),
        r"^ablate_heads: labels must have shape \(24,\), one class per example, got \(5,\)$",
    ),
    (
        "ablate_heads: 2-D labels",
        lambda e: _ablate(e, labels=e.b.labels[:, None]),
        r"labels must have shape \(24,\), one class per example, got \(24, 1\)$",
    ),
    (
        "ablate_heads: a list of float labels",
        lambda e: _ablate(e, labels=[0.5] * 24),
        r"got torch\.float32",
    ),
    (
        "ablate_heads: labels as text",
        lambda e: _ablate(e, labels="abc"),
        r"labels must be a 1-D tensor of class indices, got str$",
    ),
    (
        "ablate_heads(engine='attribution'): labels out of range",
        lambda e: _ablate(e, labels=e.labels(), engine="attribution"),
        OOR,
    ),
    (
        "ablate_heads_naive: labels out of range",
        lambda e: ablate_heads_naive(e.m, e.b.tokens, e.labels(), pad_mask=e.b.pad_mask, **NO_BOOT),
        "^ablate_heads_naive: " + OOR,
    ),
    (
        "evaluate: labels out of range",
        lambda e: pe_interp.evaluate(e.m, with_labels(e.b, e.labels())),
        r"^evaluate: batch\.labels must be integers in 0\.\.5 \(the model's classes\), got 31 at index 4$",
    ),
    (
        "evaluate: a negative label",
        lambda e: pe_interp.evaluate(e.m, with_labels(e.b, e.labels(0, -3))),
        r"got -3 at index 0$",
    ),
    (
        "patch: clean labels out of range",
        lambda e: _patch(e, clean_labels=torch.full((12,), 31)),
        r"^patch: clean_labels must be integers in 0\.\.5 \(the model's classes\), got 31 at index 0$",
    ),
    (
        "patch: corrupt labels out of range",
        lambda e: _patch(e, corrupt_labels=torch.full((12,), 6)),
        r"^patch: corrupt_labels must be integers in 0\.\.5 \(the model's classes\), got 6 at index 0$",
    ),
    (
        "patch: float clean labels",
        lambda e: _patch(e, clean_labels=e.w.pairs.clean.labels.float()),
        r"^patch: clean_labels must be integer class indices in 0\.\.5, got torch\.float32",
    ),
    (
        "attribute: labels out of range",
        lambda e: attribute(e.m, with_labels(e.b, e.labels())),
        r"^attribute: clean\.labels must be integers in 0\.\.5 \(the model's classes\), got 31 at index 4$",
    ),
    (
        "attribute: corrupt labels out of range",
        lambda e: attribute(
            e.m, e.w.pairs.clean, with_labels(e.w.pairs.corrupt, torch.full((12,), 9))
        ),
        r"^attribute: corrupt\.labels must be integers in 0\.\.5 \(the model's classes\), got 9 at index 0$",
    ),
    (
        "path_patch: labels out of range",
        lambda e: path_patch(
            e.m, with_labels(e.w.pairs.clean, torch.full((12,), 7)), e.w.pairs.corrupt
        ),
        r"^path_patch: clean\.labels must be integers in 0\.\.5",
    ),
    (
        "gradient_coherence: labels out of range",
        lambda e: gradient_coherence(e.m, (e.b.tokens, e.labels(), e.b.pad_mask)),
        r"^gradient_coherence: " + OOR,
    ),
    (
        "gradient_coherence: float labels",
        lambda e: gradient_coherence(e.m, (e.b.tokens, e.b.labels.float(), e.b.pad_mask)),
        r"^gradient_coherence: " + FLOAT_LABELS,
    ),
    (
        "attention_patterns: labels out of range",
        lambda e: attention_patterns(
            e.m, e.b.tokens, [(0, 0)], pad_mask=e.b.pad_mask, labels=e.labels()
        ),
        r"^attention_patterns: " + OOR,
    ),
    # -- non-finite weights and logits ---------------------------------------------------------
    (
        "ablate_heads: NaN weights",
        lambda e: _ablate(e, model=e.broken()),
        r"^ablate_heads: " + NAN_WQ,
    ),
    (
        "ablate_heads: inf weights",
        lambda e: _ablate(e, model=e.broken("blocks.1.mlp.W_in", float("inf"))),
        r"^ablate_heads: the model has non-finite weights \(inf in blocks\.1\.mlp\.W_in\)",
    ),
    (
        "ablate_heads: a NaN LayerNorm gain",
        lambda e: _ablate(e, model=e.broken("blocks.0.ln1.w")),
        r"\(NaN in blocks\.0\.ln1\.w\)",
    ),
    (
        "ablate_heads: overflowing logits",
        lambda e: _ablate(e, model=e.overflowing()),
        r"^ablate_heads: " + OVERFLOW,
    ),
    (
        "evaluate: NaN weights (a NaN loss)",
        lambda e: pe_interp.evaluate(e.broken(), e.b),
        r"^evaluate: " + NAN_WQ,
    ),
    (
        "evaluate: -inf weights",
        lambda e: pe_interp.evaluate(e.broken("W_U", float("-inf")), e.b),
        r"\(inf in W_U\)",
    ),
    (
        "evaluate: overflowing logits",
        lambda e: pe_interp.evaluate(e.overflowing(), e.b),
        r"^evaluate: the loss is not finite \((nan|inf)\) although the weights are: the logits overflow; check the inputs",
    ),
    ("patch: NaN weights", lambda e: _patch(e, model=e.broken()), r"^patch: " + NAN_WQ),
    (
        "patch: overflowing logits",
        lambda e: _patch(e, model=e.overflowing()),
        r"^patch: " + OVERFLOW,
    ),
    (
        "attribute: NaN weights",
        lambda e: attribute(e.broken(), e.w.pairs),
        r"^attribute: " + NAN_WQ,
    ),
    (
        "attribute: overflowing logits",
        lambda e: attribute(e.overflowing(), e.w.pairs),
        r"^attribute: " + OVERFLOW,
    ),
    (
        "path_patch: NaN weights",
        lambda e: path_patch(e.broken(), e.w.pairs),
        r"^path_patch: " + NAN_WQ,
    ),
    (
        "attention_patterns: NaN weights",
        lambda e: attention_patterns(e.broken(), e.b.tokens, [(0, 0)]),
        r"^attention_patterns: " + NAN_WQ,
    ),
    (
        "logit_terms: NaN weights",
        lambda e: logit_terms(e.broken(), e.b.tokens, 0, 0),
        r"^logit_terms: " + NAN_WQ,
    ),
    (
        "positional_scores: NaN weights",
        lambda e: positional_scores(e.broken(), e.b.tokens),
        r"^positional_scores: " + NAN_WQ,
    ),
    (
        "faithfulness_curve: NaN weights",
        lambda e: faithfulness_curve(e.broken(), Circuit.load(e.file("circuit")), e.w.pairs),
        r"^faithfulness_curve: " + NAN_WQ,
    ),
    # -- pad masks ------------------------------------------------------------------------------
    (
        "ablate_heads: a pad mask of another batch",
        lambda e: _ablate(e, pad_mask=e.w.other.pad_mask),
        r"^ablate_heads: " + OTHER_MASK,
    ),
    (
        "ablate_heads: a pad mask that hides a real token",
        lambda e: _ablate(e, pad_mask=e.b.pad_mask & (torch.arange(16) < 3)),
        r"pad_mask does not fit the tokens: row 0, position 3 is marked padding, but it holds token \d+",
    ),
    (
        "ablate_heads: a float pad mask",
        lambda e: _ablate(e, pad_mask=e.b.pad_mask.float()),
        r"^ablate_heads: pad_mask must be a bool tensor shaped like tokens \(24, 16\), got torch\.float32 \(24, 16\)$",
    ),
    (
        "ablate_heads: a pad mask of another shape",
        lambda e: _ablate(e, pad_mask=e.b.pad_mask[:, :8]),
        r"pad_mask must be a bool tensor shaped like tokens \(24, 16\), got torch\.bool \(24, 8\)$",
    ),
    (
        "ablate_heads: pads attended, a pad mask of another batch",
        lambda e: ablate_heads(
            e.unmasked(), e.b.tokens, e.b.labels, pad_mask=e.w.other.pad_mask, **NO_BOOT
        ),
        OTHER_MASK,
    ),
    (
        "ablate_heads: pads attended, a pad mask of another shape",
        lambda e: ablate_heads(
            e.unmasked(), e.b.tokens, e.b.labels, pad_mask=e.b.pad_mask[:3], **NO_BOOT
        ),
        r"^ablate_heads: pad_mask must be a bool tensor shaped like tokens \(24, 16\), got torch\.bool \(3, 16\)$",
    ),
    (
        "ablate_heads: a mean-ablation reference with another batch's mask",
        lambda e: _ablate(e, method="mean", reference=(e.b.tokens, e.w.other.pad_mask)),
        r"^ablate_heads: the reference's " + OTHER_MASK,
    ),
    (
        "ablate_heads: a resample reference of numpy tokens",
        lambda e: _ablate(e, method="resample", reference=(e.b.tokens.numpy(), None)),
        r"^ablate_heads: reference must be a torch tensor of token ids \[batch, pos\], got a numpy array",
    ),
    (
        "patch: a pad mask of another batch",
        lambda e: _patch(e, pad_mask=e.w.other.pad_mask[:12]),
        r"^patch: " + OTHER_MASK,
    ),
    (
        "attribute: a Batch with another batch's pad mask",
        lambda e: attribute(e.m, Batch(e.b.tokens, e.b.labels, e.w.other.pad_mask)),
        r"^attribute: " + OTHER_MASK,
    ),
    (
        "attention_patterns: a pad mask of another batch",
        lambda e: attention_patterns(e.m, e.b.tokens, [(0, 0)], pad_mask=e.w.other.pad_mask),
        r"^attention_patterns: " + OTHER_MASK,
    ),
    (
        "logit_terms: a pad mask of another batch",
        lambda e: logit_terms(e.m, e.b.tokens, 0, 0, pad_mask=e.w.other.pad_mask),
        r"^logit_terms: " + OTHER_MASK,
    ),
    (
        "positional_scores: a pad mask of another batch",
        lambda e: positional_scores(e.m, e.b.tokens, pad_mask=e.w.other.pad_mask),
        r"^positional_scores: " + OTHER_MASK,
    ),
    # -- tokens ---------------------------------------------------------------------------------
    (
        "ablate_heads: numpy tokens",
        lambda e: _ablate(e, tokens=e.b.tokens.numpy()),
        r"^ablate_heads: " + NUMPY,
    ),
    (
        "patch: numpy tokens",
        lambda e: _patch(e, clean_tokens=e.w.pairs.clean.tokens.numpy()),
        r"^patch: clean_tokens must be a torch tensor of token ids \[batch, pos\], got a numpy array",
    ),
    (
        "attention_patterns: numpy tokens",
        lambda e: attention_patterns(e.m, e.b.tokens.numpy(), [(0, 0)]),
        r"^attention_patterns: " + NUMPY,
    ),
    (
        "logit_terms: numpy tokens",
        lambda e: logit_terms(e.m, e.b.tokens.numpy(), 0, 0),
        r"^logit_terms: " + NUMPY,
    ),
    (
        "positional_scores: numpy tokens",
        lambda e: positional_scores(e.m, e.b.tokens.numpy()),
        r"^positional_scores: " + NUMPY,
    ),
    ("the model: numpy tokens", lambda e: e.m(e.b.tokens.numpy()), "^" + NUMPY),
    (
        "a Batch of numpy tokens",
        lambda e: Batch(e.b.tokens.numpy(), e.b.labels, e.b.pad_mask),
        r"^Batch\.tokens must be a torch tensor, got a numpy array; convert it with torch\.as_tensor\(\)$",
    ),
    (
        "ablate_heads: int8 tokens",
        lambda e: _ablate(e, tokens=e.b.tokens.to(torch.int8)),
        r"^ablate_heads: tokens must be an integer tensor \[batch, pos\] \(int64, int32, int16 or uint8\), got torch\.int8 \(int8 holds ids only up to 127\); pass tokens\.long\(\)$",
    ),
    (
        "ablate_heads: float tokens",
        lambda e: _ablate(e, tokens=e.b.tokens.float()),
        r"got torch\.float32 \(token ids are whole numbers, not floats or booleans\); pass tokens\.long\(\)$",
    ),
    (
        "ablate_heads: a list of tokens",
        lambda e: _ablate(e, tokens=e.b.tokens.tolist()),
        r"^ablate_heads: tokens must be a torch tensor of token ids \[batch, pos\], got list; convert it with torch\.tensor\(\)$",
    ),
    (
        "ablate_heads: a token beyond the vocabulary",
        lambda e: _ablate(e, tokens=e.b.tokens + 100),
        r"^ablate_heads: tokens: id 1\d\d at \(0, 0\) is outside the vocabulary \[0, 32\)$",
    ),
    (
        "ablate_heads: tokens longer than n_ctx",
        lambda e: _ablate(
            e,
            tokens=torch.ones(24, 40, dtype=torch.long),
            pad_mask=torch.ones(24, 40, dtype=torch.bool),
        ),
        r"^ablate_heads: tokens: sequence length 40 exceeds n_ctx=16$",
    ),
    # -- bootstrap counts, batch sizes ------------------------------------------------------------
    (
        "ablate_heads(n_bootstrap=-5)",
        lambda e: _ablate(e, n_bootstrap=-5),
        r"^ablate_heads: n_bootstrap must be a whole number >= 0 \(0: none\), got -5$",
    ),
    (
        "ablate_heads(n_bootstrap=2.5)",
        lambda e: _ablate(e, n_bootstrap=2.5),
        r"n_bootstrap must be a whole number >= 0 \(0: none\), got 2\.5$",
    ),
    (
        "ablate_heads(n_bootstrap=True)",
        lambda e: _ablate(e, n_bootstrap=True),
        r"n_bootstrap must be a whole number >= 0 \(0: none\), got True$",
    ),
    (
        "ablate_heads(engine='attribution', n_bootstrap=-1)",
        lambda e: _ablate(e, n_bootstrap=-1, engine="attribution"),
        r"^ablate_heads: n_bootstrap must be a whole number >= 0",
    ),
    (
        "patch(n_bootstrap=-1)",
        lambda e: _patch(e, n_bootstrap=-1),
        r"^patch: n_bootstrap must be a whole number >= 0 \(0: none\), got -1$",
    ),
    (
        "patch(batch_size=0)",
        lambda e: _patch(e, batch_size=0),
        r"^patch: batch_size must be a positive whole number >= 1, got 0$",
    ),
    (
        "bootstrap_ci(n_bootstrap=-1)",
        lambda e: bootstrap_ci(np.zeros(5), n_bootstrap=-1),
        r"^n_bootstrap must be a whole number >= 0",
    ),
    (
        "paired_bootstrap(n_bootstrap=-3)",
        lambda e: paired_bootstrap(np.zeros(5), np.zeros((2, 5)), n_bootstrap=-3),
        r"^n_bootstrap must be a whole number >= 0 \(0: none\), got -3$",
    ),
    (
        "attribute(batch_size=0)",
        lambda e: attribute(e.m, e.w.pairs, batch_size=0),
        r"^attribute: batch_size must be a positive whole number >= 1, got 0$",
    ),
    (
        "path_patch(batch_size=-1)",
        lambda e: path_patch(e.m, e.w.pairs, batch_size=-1),
        r"^path_patch: batch_size must be a positive whole number >= 1, got -1$",
    ),
    (
        "positional_scores(batch_size=0)",
        lambda e: positional_scores(e.m, e.b.tokens, batch_size=0),
        r"^positional_scores: batch_size must be a positive whole number >= 1, got 0$",
    ),
    # -- layers, heads, examples, thresholds -------------------------------------------------------
    (
        "find_deposits(min_share=5)",
        lambda e: find_deposits(_ablation(e), min_share=5),
        r"^find_deposits: min_share must be a number in \(0, 1\], got 5$",
    ),
    (
        "find_deposits(min_share=0)",
        lambda e: find_deposits(_ablation(e), min_share=0),
        r"^find_deposits: min_share must be a number in \(0, 1\], got 0$",
    ),
    (
        "find_deposits(min_share=nan)",
        lambda e: find_deposits(_ablation(e), min_share=float("nan")),
        r"min_share must be a number in \(0, 1\], got nan$",
    ),
    (
        "find_deposits(min_drop=-1)",
        lambda e: find_deposits(_ablation(e), min_drop=-1),
        r"^find_deposits: min_drop must be a finite number >= 0, got -1$",
    ),
    (
        "find_deposits(min_drop=inf)",
        lambda e: find_deposits(_ablation(e), min_drop=float("inf")),
        r"min_drop must be a finite number >= 0, got inf$",
    ),
    (
        "find_deposits(min_drop='0.2')",
        lambda e: find_deposits(_ablation(e), min_drop="0.2"),
        r"min_drop must be a finite number >= 0, got '0\.2'$",
    ),
    (
        "find_deposits(layers=[7])",
        lambda e: find_deposits(_ablation(e), layers=[7]),
        r"^find_deposits: layer 7 is out of range: the model has 2 layers \(0\.\.1\)$",
    ),
    (
        "ablate_heads(layers=[7])",
        lambda e: _ablate(e, layers=[7]),
        r"^ablate_heads: layer 7 is out of range: the model has 2 layers \(0\.\.1\)$",
    ),
    (
        "ablate_heads(layers=[-1])",
        lambda e: _ablate(e, layers=[-1]),
        r"layer -1 is out of range: the model has 2 layers",
    ),
    (
        "ablate_heads(heads=[9])",
        lambda e: _ablate(e, heads=[9]),
        r"^ablate_heads: head 9 is out of range: each layer has 4 heads \(0\.\.3\)$",
    ),
    (
        "ablate_heads(head_sets=[[(5, 0)]])",
        lambda e: _ablate(e, head_sets=[[(5, 0)]]),
        r"^ablate_heads: layer 5 is out of range",
    ),
    (
        "keep_only(model, 5, 0)",
        lambda e: keep_only(e.m, 5, 0),
        r"^keep_only: layer 5 is out of range: the model has 2 layers \(0\.\.1\)$",
    ),
    (
        "keep_only(model, 0, 4)",
        lambda e: keep_only(e.m, 0, 4),
        r"^keep_only: head 4 is out of range: each layer has 4 heads \(0\.\.3\)$",
    ),
    (
        "AblationResult.layer(7)",
        lambda e: _ablation(e).layer(7),
        r"^AblationResult: layer 7 is out of range",
    ),
    (
        "head_means(layers=[3])",
        lambda e: head_means(e.m, e.b.tokens, e.b.pad_mask, layers=[3]),
        r"^head_means: layer 3 is out of range",
    ),
    (
        "attention_patterns: a head out of range",
        lambda e: attention_patterns(e.m, e.b.tokens, [(0, 9)]),
        r"^attention_patterns: head 9 is out of range: each layer has 4 heads \(0\.\.3\)$",
    ),
    (
        "attention_patterns: a layer out of range",
        lambda e: attention_patterns(e.m, e.b.tokens, [(5, 0)]),
        r"^attention_patterns: layer 5 is out of range: the model has 2 layers \(0\.\.1\)$",
    ),
    (
        "attention_patterns: an example out of range",
        lambda e: attention_patterns(e.m, e.b.tokens, [(0, 0)], example=400),
        r"^attention_patterns: example 400 is out of range: there are 24 examples \(0\.\.23\)$",
    ),
    (
        "attention_patterns: example -1",
        lambda e: attention_patterns(e.m, e.b.tokens, [(0, 0)], example=-1),
        r"example -1 is out of range",
    ),
    (
        "attention_patterns: a head that is not a pair",
        lambda e: attention_patterns(e.m, e.b.tokens, [(0,)]),
        r"^attention_patterns: a head is a \(layer, head\) pair, got \(0,\)$",
    ),
    (
        "attention_patterns: no heads",
        lambda e: attention_patterns(e.m, e.b.tokens, []),
        r"^attention_patterns: no heads given",
    ),
    (
        "logit_terms: layer 9",
        lambda e: logit_terms(e.m, e.b.tokens, 9, 0),
        r"^logit_terms: layer 9 is out of range",
    ),
    (
        "logit_terms: example 10**6",
        lambda e: logit_terms(e.m, e.b.tokens, 0, 0, example=10**6),
        r"^logit_terms: example 1000000 is out of range: there are 24 examples",
    ),
    (
        "patch(layers=[5])",
        lambda e: _patch(e, layers=[5]),
        r"^patch: layer 5 is out of range: the model has 2 layers",
    ),
]
