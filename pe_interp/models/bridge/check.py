"""The one forward a bridge's positions are checked against (:class:`ForwardCheck`, a base class of
:class:`pe_interp.models.bridge.encoding.BridgeEncoding`): which hooks hold the queries and keys right
before the rotation, whether the rotation tables read from the model reproduce its rotated q/k in
every layer, and whether its attention scores are ``scale * rot(q) . rot(k)``; and what the model
normalises before the rotation (QK-norm)."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from pe_interp.models.bridge.forward import cached

__all__ = ["ForwardCheck"]


class ForwardCheck:
    """What one forward of a bridge shows about its positions. The subclass gives ``model`` (a
    :class:`~pe_interp.models.bridge.model.BridgedModel`), ``why_not``, ``_alibi``, ``check_length``,
    ``_checked`` (None until checked), ``rotate`` and ``rotary_spans``."""

    model: Any
    why_not: str | None
    check_length: int
    _checked: dict[str, Any] | None

    def _check(self) -> dict[str, Any]:
        """One forward of :attr:`check_length` tokens, cached: which hooks hold q/k right before
        the rotation (``hook_q``/``hook_k``, else ``hook_q_normed``/``hook_k_normed``, behind a
        QK-norm), whether this encoding's rotation of them reproduces the bridge's rotated q/k
        (``hook_rot_q``/``hook_rot_k``, or, where it does not hook them, its scores) in every layer,
        and whether ``hook_attn_scores`` is ``scale * rot(q) . rot(k)`` where the mask allows it.
        ``{"tables", "scores"}``: why not (None: they do), one line each."""
        if self._checked is not None:
            return self._checked
        c, bridge = self.model.cfg, self.model.bridge
        out: dict[str, Any] = {
            "tables": None,
            "scores": None,
            "rotation_hooks": ("hook_q", "hook_k"),
            "unrotated_hooks": ("hook_q", "hook_k"),
        }
        if self.why_not is not None or self._alibi:
            self._checked = out
            return out
        # a length no head count shares, so that a hook's [b, head, pos, d] reads unambiguously
        fits = [n for n in range(2, max(2, self.check_length) + 4) if n <= max(2, int(c.n_ctx))]
        fits = [n for n in fits if n not in (c.n_heads, c.n_kv_heads)] or fits
        n = min(fits, key=lambda n: abs(n - self.check_length))
        g = torch.Generator().manual_seed(0)
        tokens = torch.randint(0, c.d_vocab, (1, n), generator=g).to(self.model.W_E.device)
        kinds = ("q", "k", "q_normed", "k_normed", "rot_q", "rot_k", "attn_scores")
        names = {f"blocks.{i}.attn.hook_{t}" for i in range(c.n_layers) for t in kinds}
        got, _ = cached(bridge, tokens, sorted(names))  # the normed and rotated ones are optional
        for layer in range(c.n_layers):
            why = self._check_layer(layer, got, out)
            if why is not None:
                out["tables" if why[0] == "tables" else "scores"] = why[1]
                if why[0] == "tables":
                    break
        self._checked = out
        return out

    def _check_layer(self, layer: int, got: dict, out: dict) -> tuple[str, str] | None:
        """:meth:`_check` of one layer: ``(what, why)`` where it fails, else None (``out``'s
        hooks set to those that reproduce the bridge)."""
        c, pre = self.model.cfg, f"blocks.{layer}.attn."
        name = c.encoding_name
        scores = got.get(pre + "hook_attn_scores")
        q, k = got.get(pre + "hook_q"), got.get(pre + "hook_k")
        rot_q, rot_k = got.get(pre + "hook_rot_q"), got.get(pre + "hook_rot_k")
        if q is None or k is None:
            return "tables", (
                f"{name}: the bridge's layer {layer} fires no hook_q/hook_k, which every reading of "
                "its queries and keys needs"
            )
        if self._rotary:
            try:
                spans = self.rotary_spans(layer, q.shape[1])
            except ValueError as err:
                return "tables", str(err)
            candidates = [("hook_q", "hook_k", q, k)]
            normed = [
                _heads_last(got.get(pre + f"hook_{t}_normed"), like)
                for t, like in (("q", q), ("k", k))
            ]
            if normed[0] is not None and normed[1] is not None:
                candidates.append(("hook_q_normed", "hook_k_normed", *normed))
            found, err = self._match(layer, candidates, spans, rot_q, rot_k, scores)
            if found is None:
                return "tables", self._unmatched(layer, rot_q, len(candidates), err)
            if found[0] != "hook_q":
                if rot_q is None or rot_k is None:
                    return "tables", (
                        f"{name}: QK-norm before the rotation: layer {layer}'s q/k are rotated after "
                        "the norm and the bridge hooks no rotated q/k (hook_rot_q/hook_rot_k) where "
                        "route shares could move them"
                    )
                out["rotation_hooks"] = ("hook_rot_q", "hook_rot_k")
                out["unrotated_hooks"] = None
            rq, rk = (found[2], found[3]) if rot_q is None else (rot_q, rot_k)
        else:
            rq, rk = q, k
        if out["scores"] is None:
            return self._check_scores(layer, rq, rk, scores)
        return None

    def _match(
        self, layer: int, candidates: list, spans, rot_q, rot_k, scores
    ) -> tuple[tuple | None, float]:
        """The first candidate ``(q hook, k hook, q, k)`` whose rotation reproduces the rotated q/k
        (or, where they are not hooked, the scores), rotated; and the smallest error seen."""
        found, err = None, math.inf
        for qn, kn, cq, ck in candidates:
            rq, rk = self._turn(cq, ck, spans)
            if rot_q is not None and rot_k is not None:
                e = max(_gap(rq, rot_q), _gap(rk, rot_k))
            else:  # no rotated q/k hooked: the scores say whether the rotation is the bridge's
                e = _score_gap(rq, rk, scores, self.model.attention_scale(layer))
            err = min(err, e)
            if e <= _tolerance(rq):
                found = (qn, kn, rq, rk)
                break
        return found, err

    def _unmatched(self, layer: int, rot_q, n_candidates: int, err: float) -> str:
        """Why no candidate's rotation reproduces the layer's: a QK-norm it cannot see behind, or
        tables other than the model's."""
        name = self.model.cfg.encoding_name
        if self._qk_norm(layer) and (rot_q is None or n_candidates == 1):
            lacks = (
                "a hook on them after the norm"
                if rot_q is not None
                else ("a hook on the rotated q/k (hook_rot_q/hook_rot_k)")
            )
            return (
                f"{name}: QK-norm before the rotation: the bridge's hook_q/hook_k hold q/k "
                f"before the norm of layer {layer}, and it has no {lacks}, so route shares "
                "and the logit decomposition cannot read or move its rotation"
            )
        return (
            f"{name}: the rotary tables read from the model's rotary module do not reproduce "
            f"layer {layer}'s rotated q/k (max error {err:.2g}; a RoPE layout other than "
            "Hugging Face's rotate_half, or a per-layer RoPE the module does not give), so "
            "route shares and the logit decomposition cannot read or move its rotation"
        )

    def _check_scores(self, layer: int, rq: Tensor, rk: Tensor, scores) -> tuple[str, str] | None:
        """Whether ``hook_attn_scores`` is ``scale * rot(q) . rot(k)`` where the mask allows it."""
        name = self.model.cfg.encoding_name
        if scores is None:
            return "scores", (
                f"{name}: the bridge fires no hook_attn_scores in layer {layer}, so the logit "
                "decomposition has nothing to split"
            )
        hf = self.model.bridge.original_model.config
        cap = getattr(hf, "attn_logit_softcapping", None)
        if cap:  # the softmax reads tanh-capped scores, whatever their size in this forward
            return "scores", (
                f"{name}: attention logit soft-capping (attn_logit_softcapping = {cap:g}): the "
                "softmax reads cap * tanh(scores / cap), which is no sum of terms, so the logit "
                "decomposition cannot split it; route shares, positional_scores' template and "
                "Toeplitz scores, ablation and patching run on it"
            )
        e = _score_gap(rq, rk, scores, self.model.attention_scale(layer))
        if e > _tolerance(scores):
            return "scores", (
                f"{name}: the bridge's hook_attn_scores are not scale * rot(q) . rot(k) in "
                f"layer {layer} (max error {e:.2g}: a bias or a cap inside them), so the logit "
                "decomposition cannot split them; route shares, positional_scores' template "
                "and Toeplitz scores, ablation and patching run on it"
            )
        return None

    def _qk_norm(self, layer: int) -> bool:
        """Whether layer ``layer``'s attention normalises its queries or keys (a ``q_norm`` or
        ``k_norm`` module, of the bridge or of the Hugging Face attention)."""
        attn = self.model.bridge.blocks[layer].attn
        inner = getattr(attn, "original_component", None)
        return any(
            isinstance(getattr(m, n, None), torch.nn.Module)
            for m in (attn, inner)
            for n in ("q_norm", "k_norm", "q_layernorm", "k_layernorm")
        )

    def unfrozen_norms(self, layer: int) -> list[str]:
        """The norms on the way to ``layer``'s q and k whose scale the layer-0 decomposition cannot
        freeze, each with why: a QK-norm (``q_norm``, ``k_norm``) whose scale the bridge does not
        hook (``attn.q_norm.hook_scale``), and a parameter-free ``ln1`` (no weight: the bridge
        applies a weight when a hook edits its scale, so it cannot run it frozen)."""
        block, names = self.model.bridge.blocks[layer], self.model.bridge.hook_dict
        attn, out = block.attn, []
        own = [
            n for n in ("q_norm", "k_norm") if isinstance(getattr(attn, n, None), torch.nn.Module)
        ]
        if not own and self._qk_norm(layer):  # a norm the bridge does not wrap at all
            out.append("a QK-norm the bridge does not wrap")
        out += [
            f"{n}: the bridge does not hook its scale"
            for n in own
            if f"blocks.{layer}.attn.{n}.hook_scale" not in names
        ]
        ln1 = getattr(getattr(block, "ln1", None), "original_component", None)
        if isinstance(ln1, torch.nn.Module) and getattr(ln1, "weight", None) is None:
            out.append("ln1: parameter-free, and the bridge cannot run it with its scale edited")
        return out


def _heads_last(x: Tensor | None, like: Tensor) -> Tensor | None:
    """``x`` (a bridge's ``hook_q_normed``/``hook_k_normed``: ``[b, head, pos, d]`` after a per-head
    norm, ``[b, pos, head * d]`` after a norm over the whole projection) as ``like``'s
    ``[b, pos, head, d]``; None where it is neither."""
    if x is None:
        return None
    b, n, h, d = like.shape
    if x.shape == like.shape and h != n:
        return x
    if x.shape == (b, h, n, d):
        return x.transpose(1, 2)
    if x.shape == (b, n, h * d):
        return x.reshape(b, n, h, d)
    return None


def _tolerance(x: Tensor) -> float:
    """What rounding allows between two computations of ``x``'s values (its dtype's; a mask's
    lowest values left out)."""
    eps = torch.finfo(x.dtype).eps if x.is_floating_point() else 1e-7
    x = x.detach()
    seen = x[torch.isfinite(x) & (x > torch.finfo(x.dtype).min / 2)]  # not a mask's value
    return max(1e-5, 16 * eps) * (1.0 + (float(seen.abs().max()) if seen.numel() else 0.0))


def _gap(a: Tensor, b: Tensor) -> float:
    if a.shape != b.shape:
        return math.inf
    return float((a.double() - b.double()).abs().max())


def _score_gap(q: Tensor, k: Tensor, scores: Tensor | None, scale: float) -> float:
    """Max ``|scale * q . k - scores|`` where the mask allows ``scores [b, head, q, k]``
    (grouped key heads repeated to one per query head; inf where it cannot be compared)."""
    if scores is None or q.shape[2] % k.shape[2]:
        return math.inf
    k = k.repeat_interleave(q.shape[2] // k.shape[2], dim=2)
    mine = torch.einsum("bqhd,bkhd->bhqk", q.double(), k.double()) * scale
    if mine.shape != scores.shape:
        return math.inf
    ok = torch.isfinite(scores) & (scores > torch.finfo(scores.dtype).min / 2)
    return float((mine - scores.double()).abs()[ok].max()) if bool(ok.any()) else 0.0
