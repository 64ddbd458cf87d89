"""Which RoPE frequencies every query head uses (Barbero et al. 2024, "Round and Round We Go! What
makes Rotary Positional Encodings useful?", arXiv 2410.06205): on Gemma 7B, positional heads use
RoPE's highest frequencies, while most of the queries' and keys' norm sits in the lowest ones.

Each rotated pair ``p`` of a head vector (two adjacent dims, or dims ``i`` and ``i + dim/2`` of a
``halves`` span: :class:`~pe_interp.encodings.RotarySpan`) turns at ``theta_p`` rad/token. Per RoPE
layer and query head, with the pairs **ordered by frequency, highest first** (index 0 is the
fastest pair, the last the slowest; ties keep the spans' order):

- **view A, norms** (the paper's measure): ``q_norm[l, h, p]``, the mean over every real token of
  every example of the Euclidean norm of the query's 2-D chunk ``p`` (rotated, which leaves the
  norm as it is); ``k_norm`` the same for the key. With grouped key/value heads a key chunk
  belongs to the key/value head, and each query head reports its own key/value head's
  (:meth:`~pe_interp.models.protocol.KVLayout.kv_head`). ``norm_share`` is a chunk's share of the
  summed mean chunk norms, averaged over queries and keys.
- **view B, logits**: the pair's exact term of the logit, ``a_p[m, n] = s (rq0_m rk0_n + rq1_m
  rk1_n)`` (:attr:`~probes.decomposition.RopeTerms.pair_logits`, the Hadamard form's pair ``p``);
  its share of the summed squares ``sum_{m,n} a_p^2 / sum_p sum_{m,n} a_p^2`` over the (query,
  key) entries the model's mask allows between real tokens (causal where the model is; the
  entries where ``hook_attn_scores`` is not masked), then averaged over the examples
  (``logit_share``). Squares, because a pair's term has either sign and terms of opposite signs
  do not cancel in what a pair contributes; the scale ``s`` and any un-rotated dims drop out of
  the share (it is :meth:`RopeTerms.frequency_share` over the allowed entries). Examples where
  a head's terms are all 0 are left out of its average.
- **view B', the pattern** (``pattern_share``): the same with each pair's term centred over the
  keys each query may see before squaring (``a_p[m, n] - mean_n a_p[m, n]``). The softmax ignores
  whatever is constant along a query's row, so this is each frequency's share of what can shape
  the attention pattern; a term that mostly shifts whole rows (a large, slowly turning chunk whose
  content differs little between keys) weighs in ``logit_share`` and not here. Rows with one key
  count 0.

**Bands**: the ``round(band * n_pairs)`` (at least 1) fastest pairs of a layer are its high band,
as many slowest its low band (``band`` = 0.25: the top and bottom quarter of the thetas). Per head
:meth:`FrequencyUsage.norm_bands` and :meth:`FrequencyUsage.logit_bands` give each band's share.
The verdicts on the paper's two findings are in :mod:`probes.decomposition.frequency_findings`.

One forward per batch (``run_with_cache`` of the rotated q/k and the scores), computed per batch
in float64; nothing is sized by the model's context (the rotation tables are asked at the prompts'
length, :func:`~pe_interp.encodings.rotary_spans_for`), and the summed squares are a quadratic form
(``(q0 k0 + q1 k1)^2`` expanded) so no ``[pairs, q, k]`` tensor is built.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from pe_interp.encodings import rotary_spans_for
from pe_interp.util.io import load_result, nan_array, register_result, write_result
from pe_interp.util.modes import eval_mode
from probes.common.inputs import (
    check_count,
    check_examples,
    check_finite_model,
    check_layers,
    takes_probe_model,
)
from probes.decomposition.frequency_sums import F64, cached_rotation, layer_sums, rotated_heads
from probes.decomposition.reads import allowed

if TYPE_CHECKING:
    from pe_interp.models.protocol import ProbeModel

__all__ = ["FrequencyUsage", "frequency_usage", "not_rotary"]

DEFINITION = (
    "pairs ordered by theta, highest first; q_norm/k_norm = mean 2-D chunk norm over real tokens; "
    "logit_share = share of summed squared pair logits over allowed real (query, key) entries, "
    "mean over examples; pattern_share = the same with each term centred over each query's keys; "
    "bands = round(band * n_pairs) fastest / slowest pairs"
)
RESULT_KIND = register_result(
    "frequency usage", "FrequencyUsage.load", ("theta", "q_norm", "k_norm", "logit_share")
)


@dataclass(frozen=True, eq=False)
class FrequencyUsage:
    """How each query head of the RoPE ``layers`` uses each frequency (module doc).

    - ``layers``: the layers measured (row ``i`` of every table is layer ``layers[i]``);
    - ``theta [n_layers, n_pairs]``: each pair's frequency (rad/token), highest first; NaN pads a
      layer with fewer pairs;
    - ``q_norm``, ``k_norm [n_layers, n_heads, n_pairs]``: mean chunk norms (NaN where a head is
      not rotated);
    - ``logit_share [n_layers, n_heads, n_pairs]``: each pair's share of the squared logit terms,
      mean over examples (sums to 1 over the pairs of a rotated head);
    - ``pattern_share``: the same for the terms centred along each query's row (view B');
    - ``band``: the fraction of pairs in each band; ``n_examples``, ``n_tokens`` (real tokens).
    """

    layers: tuple[int, ...]
    theta: Tensor
    q_norm: Tensor
    k_norm: Tensor
    logit_share: Tensor
    band: float
    n_examples: int
    n_tokens: int
    pattern_share: Tensor | None = None  # None: not measured

    @property
    def n_pairs(self) -> Tensor:
        """Pairs per layer ``[n_layers]``."""
        return torch.isfinite(self.theta).sum(-1)

    @staticmethod
    def _share(x: Tensor) -> Tensor:
        total = x.nansum(-1, keepdim=True)
        return torch.where(total > 0, x / total.clamp(min=1e-300), torch.full_like(x, math.nan))

    @property
    def q_share(self) -> Tensor:
        """Each chunk's share of the summed mean query chunk norms ``[n_layers, n_heads, n_pairs]``."""
        return self._share(self.q_norm)

    @property
    def k_share(self) -> Tensor:
        return self._share(self.k_norm)

    @property
    def norm_share(self) -> Tensor:
        """The mean of :attr:`q_share` and :attr:`k_share`: the q/k norm's share per pair."""
        return (self.q_share + self.k_share) / 2

    def band_masks(self) -> tuple[Tensor, Tensor]:
        """``(high, low)`` bool ``[n_layers, n_pairs]``: each layer's fastest and slowest
        ``max(1, round(band * n_pairs))`` pairs (pairs are ordered highest first)."""
        idx = torch.arange(self.theta.shape[-1])[None]
        n = self.n_pairs[:, None]
        k = torch.clamp(torch.floor(n * self.band + 0.5), min=1).long()
        return idx < k, (idx >= n - k) & (idx < n)

    def band_shares(self, share: Tensor) -> tuple[Tensor, Tensor]:
        """``(high, low)`` ``[n_layers, n_heads]``: the summed ``share [n_layers, n_heads,
        n_pairs]`` over each band (NaN for a head that is not rotated)."""
        out = []
        for mask in self.band_masks():
            m = mask[:, None, :].to(share.dtype)
            s = (torch.nan_to_num(share) * m).sum(-1)
            out.append(torch.where(torch.isnan(share).all(-1), torch.full_like(s, math.nan), s))
        return out[0], out[1]

    def norm_bands(self, which: str = "qk") -> tuple[Tensor, Tensor]:
        """``(high, low)`` share of the chunk norms in each band ``[n_layers, n_heads]``, of the
        queries and keys together (``"qk"``: :attr:`norm_share`), the queries (``"q"``) or keys."""
        share = {"qk": self.norm_share, "q": self.q_share, "k": self.k_share}.get(which)
        if share is None:
            raise ValueError(f"norm_bands: which must be 'qk', 'q' or 'k', got {which!r}")
        return self.band_shares(share)

    def logit_bands(self, centred: bool = False) -> tuple[Tensor, Tensor]:
        """``(high, low)`` share of the squared logit terms in each band ``[n_layers, n_heads]``
        (of the row-centred terms, :attr:`pattern_share`, with ``centred``)."""
        share = self.pattern_share if centred else self.logit_share
        if share is None:
            raise ValueError("this FrequencyUsage has no pattern_share (an older file)")
        return self.band_shares(share)

    def row(self, layer: int) -> int:
        """The row of ``layer`` in the tables."""
        if layer not in self.layers:
            raise ValueError(f"layer {layer} was not measured (layers {list(self.layers)})")
        return self.layers.index(layer)

    def to_dict(self) -> dict[str, Any]:
        return {
            "layers": list(self.layers),
            "theta": self.theta.tolist(),
            "q_norm": self.q_norm.tolist(),
            "k_norm": self.k_norm.tolist(),
            "logit_share": self.logit_share.tolist(),
            "pattern_share": None if self.pattern_share is None else self.pattern_share.tolist(),
            "band": self.band,
            "n_examples": self.n_examples,
            "n_tokens": self.n_tokens,
            "definition": DEFINITION,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FrequencyUsage:
        def t(key: str) -> Tensor:
            return torch.from_numpy(nan_array(d[key]))

        return cls(
            layers=tuple(int(x) for x in d["layers"]),
            theta=t("theta"),
            q_norm=t("q_norm"),
            k_norm=t("k_norm"),
            logit_share=t("logit_share"),
            band=float(d["band"]),
            n_examples=int(d["n_examples"]),
            n_tokens=int(d["n_tokens"]),
            pattern_share=None if d.get("pattern_share") is None else t("pattern_share"),
        )

    def save(self, path: str | Path) -> Path:
        return write_result(path, RESULT_KIND, self.to_dict(), indent=None)

    @classmethod
    def load(cls, path: str | Path) -> FrequencyUsage:
        return load_result(path, RESULT_KIND, cls.from_dict)


@takes_probe_model
def not_rotary(model: ProbeModel, layers: list[int] | None = None, n_pos: int = 2) -> str | None:
    """Why :func:`frequency_usage` cannot read ``model`` (its encoding rotates no query and key,
    or rotates them in a way it does not describe), or None: what a caller checks before its
    work, without a forward."""
    enc = model.encoding
    try:
        rotates = enc.rotates
    except ValueError as err:
        return str(err)
    why = enc.cannot_move  # a bridge whose rotation our tables do not reproduce
    if why:
        return str(why)
    if not rotates:
        return (
            f"{model.cfg.encoding_name} does not rotate queries and keys; frequency usage is "
            "defined for rotary encodings (RoPE)"
        )
    layers = range(model.cfg.n_layers) if layers is None else layers
    if any(rotary_spans_for(enc, layer, n_pos) is None for layer in layers):
        return (
            f"{model.cfg.encoding_name} rotates without describing its frequencies "
            "(rotary_spans), which frequency usage needs"
        )
    return None


@takes_probe_model
def frequency_usage(
    model: ProbeModel,
    tokens: Tensor,
    pad_mask: Tensor | None = None,
    *,
    layers=None,
    band: float = 0.25,
    batch_size: int = 8,
    progress: bool = False,
) -> FrequencyUsage:
    """:class:`FrequencyUsage` of every query head of ``layers`` (None: every layer) on ``tokens
    [n, pos]`` (right-padded; ``pad_mask`` marks the real tokens, default ``tokens != pad_id``).
    ``band`` in (0, 0.5]: the fraction of each layer's pairs in the high and in the low band.
    One forward per ``batch_size`` examples, each cut to its longest row where pads reach no real
    token; ``progress``: a bar over the batches."""
    tokens, pad_mask, layers = _check_args(model, tokens, pad_mask, layers, band, batch_size)
    n, n_pos = tokens.shape
    enc = model.encoding
    spans = {layer: rotary_spans_for(enc, layer, n_pos) for layer in layers}
    sums, counts, n_tokens = _sums(model, tokens, pad_mask, layers, spans, batch_size, progress)
    H = model.cfg.n_heads
    n_pairs = {layer: sum(s.dim // 2 for s in spans[layer]) for layer in layers}
    n_max = max(n_pairs.values())
    out = torch.full((4, len(layers), H, n_max), math.nan, dtype=F64)
    theta = torch.full((len(layers), n_max), math.nan, dtype=F64)
    for i, layer in enumerate(layers):
        if not n_pairs[layer]:
            continue
        th = torch.cat([s.theta.double().cpu() for s in spans[layer]])
        order = torch.sort(-th, stable=True).indices  # highest frequency first
        s = sums[layer].cpu()
        nan = torch.full_like(s[0], math.nan)
        rotated = rotated_heads(spans[layer], H)  # [H, pairs]
        q_norm = torch.where(rotated, s[0] / max(n_tokens, 1), nan)
        k_norm = torch.where(rotated, s[1] / max(n_tokens, 1), nan)
        c = counts[layer].cpu()[:, :, None]
        share = torch.where(rotated & (c[0] > 0), s[2] / c[0].clamp(min=1), nan)
        pattern = torch.where(rotated & (c[1] > 0), s[3] / c[1].clamp(min=1), nan)
        theta[i, : len(th)] = th[order]
        for j, x in enumerate((q_norm, k_norm, share, pattern)):
            out[j, i, :, : len(th)] = x[:, order]
    return FrequencyUsage(
        layers=tuple(layers),
        theta=theta,
        q_norm=out[0],
        k_norm=out[1],
        logit_share=out[2],
        pattern_share=out[3],
        band=float(band),
        n_examples=n,
        n_tokens=n_tokens,
    )


def _check_args(model: ProbeModel, tokens, pad_mask, layers, band, batch_size):
    """The inputs checked, ``layers`` sorted (default every one), and a rotary encoding that
    says how it rotates (:func:`not_rotary`)."""
    who = "frequency_usage"
    check_finite_model(model, who)
    check_count(batch_size, "batch_size", 1, who)
    if isinstance(band, bool) or not isinstance(band, int | float) or not 0 < band <= 0.5:
        raise ValueError(f"{who}: band must be a number in (0, 0.5], got {band!r}")
    tokens, _, pad_mask = check_examples(model, tokens, None, pad_mask, who=who)
    layers = check_layers(model, layers, who)
    layers = list(range(model.cfg.n_layers)) if layers is None else sorted(set(layers))
    if not layers:
        raise ValueError(f"{who}: no layers given")
    why = not_rotary(model, layers, tokens.shape[1])
    if why:
        raise ValueError(f"{who}: {why}")
    return tokens, pad_mask, layers


def _sums(model: ProbeModel, tokens, pad_mask, layers, spans, batch_size, progress):
    """One forward per batch: per layer the summed ``[4, H, pairs]`` of
    :func:`~probes.decomposition.frequency_sums.layer_sums` and the ``[2, H]`` examples counted,
    and the real tokens seen."""
    n, n_pos = tokens.shape
    H, device = model.cfg.n_heads, model.W_E.device
    kv = torch.tensor([model.kv_layout.kv_head(h) for h in range(H)], device=device)
    n_pairs = {layer: sum(s.dim // 2 for s in spans[layer]) for layer in layers}
    sums = {
        layer: torch.zeros(4, H, n_pairs[layer], dtype=F64, device=device) for layer in layers
    }  # q norms, k norms, per-example logit shares, per-example pattern shares
    counts = {layer: torch.zeros(2, H, dtype=F64, device=device) for layer in layers}
    n_tokens = 0
    names = [
        f"blocks.{layer}.attn.hook_{x}"
        for layer in layers
        for x in ("q", "k", "rot_q", "rot_k", "attn_scores")
    ]
    starts = range(0, n, batch_size)
    if progress:
        from tqdm.auto import tqdm

        starts = tqdm(starts, desc="frequency usage", unit="batch")
    with eval_mode(model), torch.no_grad():
        for start in starts:
            rows = slice(start, min(n, start + batch_size))
            real = pad_mask[rows].to(device)
            width = int(real.sum(1).max()) if model.cfg.mask_padding else n_pos
            real, toks = real[:, :width], tokens[rows, :width].to(device)
            _, cache = model.run_with_cache(toks, real, names_filter=names)
            n_tokens += int(real.sum())
            for layer in layers:
                q, k = cached_rotation(model, cache, layer)
                ok = allowed(cache[f"blocks.{layer}.attn.hook_attn_scores"])
                ok = ok & real[:, None, :, None] & real[:, None, None, :]
                got, valid = layer_sums(q, k, ok, real, spans[layer], kv)
                sums[layer] += got
                counts[layer] += valid
    return sums, counts, n_tokens
