"""Decomposition of a head's pre-softmax attention logits into content and position terms.

Paper digest §2. For head h of layer l, with ``s = 1/sqrt(d_qk)``, the logit the model computes is

    L[i, j] = s * rot(q_i) . rot(k_j) + B[i, j]          (then + mask, then softmax)

where ``rot`` is the encoding's rotation (RoPE; identity otherwise) and ``B`` its relative bias
(T5, ALiBi; zero otherwise). See :mod:`pe_interp.models.hooked.attention`.

**Layer 0, any encoding** (:func:`logit_terms`). The layer's input is ``x = c + p``: token embedding
``c`` (``hook_embed``) plus the absolute positional vector ``p`` (``hook_pos_embed``; absent for
relative and rotary encodings). LayerNorm is made linear by freezing its scale at the value the
model actually used (``ln1.hook_scale``, as TransformerLens does when it folds LayerNorm), so

    LN(x_i) = (x_i - mean(x_i)) / scale_i * w + b
            = [centre(c_i)/scale_i * w] + [centre(p_i)/scale_i * w] + b
            =        content_i          +        position_i         + offset

The **offset** component collects everything that is the same at every position and for every
token: LayerNorm's bias ``b``; the projections' biases ``b_Q``/``b_K`` are added to it too (so
``q^offset = b W_Q + b_Q``). Keeping it separate (rather than folding it into content) keeps the
content terms purely token-driven. Each component goes through the (linear) projection, extension
(decoupled RoPE) and rotation separately, which gives 3 x 3 Gram terms ``"{query}-{key}"``, e.g.
``"content-position"`` = ``s * rot(q^content_i) . rot(k^position_j)``, plus ``"relative_bias"``.
Terms whose component does not exist (``position`` without an absolute encoding,
``relative_bias`` without a bias encoding) are left out. With ``kv_source="embed"`` the keys read
the raw, un-normalised input, so the key side has no LayerNorm and an offset of ``b_K`` alone.
The terms sum to the model's logits (tested to 1e-4 for every encoding).

Note: a term that depends only on the query (e.g. ``"content-offset"``: ``q^content_i . k^offset``)
shifts a whole row and so cannot change the attention pattern.

**Layers > 0**: the residual stream has no clean content/position split; the terms are ``"qk"``
(``s * rot(q) . rot(k)``) and ``"relative_bias"``.

**Rotary encodings, any layer** (:class:`RopeTerms`): writing each rotated pair k of the
(un-rotated) head vectors as a complex number, ``q_m^(k)``, ``k_n^(k)``,

    s * rot(q_m) . rot(k_n) = s * Re sum_k  q_m^(k) conj(k_n^(k)) e^{i (m - n) theta_k}  + unrotated
                            = s * Re sum_k  (G^(k) o E^(k))[m, n]                     + unrotated

with the complex content Gram matrix ``G^(k)_{mn} = q_m^(k) conj(k_n^(k))`` and the Toeplitz,
rank-one, unit-diagonal relative-position kernel ``E^(k)_{mn} = e^{i (m-n) theta_k}`` (the paper's
Hadamard form). ``unrotated`` holds dimensions the encoding does not rotate (partial RoPE, the
content path of decoupled RoPE). Pairs are RoPE's **adjacent (interleaved)** pairs
``(2k, 2k+1)`` of each rotated span in our models, and Hugging Face's ``rotate_half`` pairs
``(k, k + dim/2)`` on a TransformerLens bridge over Llama or GPT-NeoX.

**On a bridge** (:class:`pe_interp.models.bridge.model.BridgedModel`; :mod:`~probes.decomposition.reads`): the
rotated q/k are the bridge's own ``hook_rot_q/k`` where it caches them (Llama, Qwen, Gemma, ...) or
``hook_q/k`` rotated as the bridge does (GPT-NeoX, Phi-3); layer 0's components run the bridge's
own layer 0 on each part of its input (``blocks.0.hook_resid_pre`` replaced, ``ln1.hook_scale``
and a QK-norm's ``q_norm``/``k_norm.hook_scale`` frozen). What the encoding of a family never
tested here cannot show, it refuses in one line (:class:`pe_interp.models.bridge.encoding.BridgeEncoding`
checks its tables and the scores on one short forward first): ALiBi (BLOOM's, MPT's, Falcon's),
added inside the bridge's scores with no hook of its own; Gemma 2's attention-logit soft-capping; a QK-norm whose
scale the bridge does not hook (layer 0 only); a rotation its tables do not reproduce.
:func:`positional_scores` leaves the direct term NaN there, and fits each head's template over
its own mask (sliding-window layers allow fewer entries than global ones).

:func:`toeplitz_score` measures how much of a ``[q, k]`` matrix is a function of ``j - i`` alone,
and :func:`positional_scores` scores every head of a model for position-only structure.

One idea per module: :mod:`~probes.decomposition.toeplitz` (the Toeplitz score),
:mod:`~probes.decomposition.rope` (the per-frequency RoPE terms), :mod:`~probes.decomposition.terms`
(the logit terms of one head), :mod:`~probes.decomposition.positional` (positional scores of
every head) and :mod:`~probes.decomposition.reads` (what they read of a model). What they need
to know about the encoding (its rotated spans and their frequencies) they ask the encoding
(:meth:`pe_interp.encodings.Encoding.rotary_spans`); the projections, the norm and the rotation
they run are the model's own.

**RoPE frequency usage** (:mod:`~probes.decomposition.frequency`, Barbero et al. 2024): per head,
each frequency's share of the rotated q/k chunk norms and of the logit's per-frequency terms,
high band against low band, and the paper's two findings as k of n heads
(:mod:`~probes.decomposition.frequency_findings`).
"""

from probes.decomposition.frequency import FrequencyUsage, frequency_usage
from probes.decomposition.frequency_findings import (
    BandFinding,
    high_frequency_positional,
    low_frequency_norm,
    top_heads,
)
from probes.decomposition.positional import PositionalScores, positional_scores
from probes.decomposition.rope import RopeSpan, RopeTerms, rope_spans, rope_terms
from probes.decomposition.terms import LogitTerms, logit_terms
from probes.decomposition.toeplitz import diagonal_means, toeplitz_score

__all__ = [
    "BandFinding",
    "FrequencyUsage",
    "LogitTerms",
    "PositionalScores",
    "RopeSpan",
    "RopeTerms",
    "diagonal_means",
    "frequency_usage",
    "high_frequency_positional",
    "low_frequency_norm",
    "logit_terms",
    "positional_scores",
    "rope_spans",
    "rope_terms",
    "toeplitz_score",
    "top_heads",
]
