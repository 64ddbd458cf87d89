"""Your own model: a TransformerLens 4 ``TransformerBridge`` seen through the seams the probes read.

A bridge wraps a Hugging Face causal language model; the probes read a classifier (tokens in,
one row of class logits out). :class:`BridgedModel` is that view of a bridge, the task in
language-model form: class ``c`` is the answer token ``answers[c]`` (default: every token of the
vocabulary, so a label is a token id), read at the last real position of each right-padded row.
It has no forward of its own: every forward is the bridge's (``attention_mask`` from the pad
mask), then one gather. Its hooks are the bridge's, under TransformerLens' names
(``blocks.{l}.attn.hook_z`` is ``[batch, pos, head, d_head]``).

It implements :class:`pe_interp.models.protocol.ProbeModel`. What it cannot offer, it says. It has no
seam inside a layer (``restart`` is ``"resid_pre"`` or ``"embed"``, ``can_restart`` False: the exact
ablation sweep stacks copies, :func:`probes.ablation.sweeps.sweep_stacked`; path patching and
``atp*`` run whole forwards with hooks); it restarts at a layer's input
(:meth:`BridgedModel.resume`, running that layer and the later ones only) where a check on the
bridge itself found it exact (:func:`~pe_interp.models.bridge.forward.resumes_exactly`: not BLOOM, whose
ALiBi the bridge then drops); a forward returning class logits unembeds only the position it reads;
edges need each head's residual term to be its own and per-head forks before the norm
(:func:`~pe_interp.models.bridge.forward.check_edges`, a check on the bridge: not BLOOM; a norm after
the attention or the MLP, as in Gemma 2 and 3 and OLMo 2, is recomputed, :meth:`BridgedModel.post_norm`;
grouped key/value heads get one k and one v reader per key/value head); and padding
must be on the right (a causal model then never lets a pad reach a real token).

    from transformer_lens.model_bridge import TransformerBridge
    bridge = TransformerBridge.boot_transformers(local_dir, tokenizer=tokenizer)
    model = BridgedModel(bridge, answers=answer_ids)
    probes.ablate_heads(model, tokens, labels)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from pe_interp.models.bridge.config import ARCH_OF, BridgeConfig
from pe_interp.models.bridge.encoding import BridgeEncoding, encoding_names
from pe_interp.models.bridge.forward import (
    check_hooks_from,
    keeps_logits,
    may_keep,
    mlp_hooks,
    post_norm_of,
    read_positions,
    resumes_exactly,
    skipping_blocks,
    why_no_edges,
)
from pe_interp.models.bridge.hf_arch import read_answers
from pe_interp.models.protocol import KVLayout, PostNorm, Restart
from pe_interp.util.checks import check_pad_mask_tensor, check_token_ids


def is_bridge(obj: Any) -> bool:
    """Whether ``obj`` is what :class:`BridgedModel` takes: a TransformerLens ``TransformerBridge``
    (``run_with_hooks``, the Hugging Face ``original_model``, a ``cfg``)."""
    return hasattr(obj, "run_with_hooks") and hasattr(obj, "original_model") and hasattr(obj, "cfg")


class BridgedModel(nn.Module):
    """A ``TransformerBridge`` as the probes read a model (module docstring)."""

    can_restart = False  # no seam inside a layer: forward_unchecked runs from the embedding

    def __init__(
        self,
        bridge: Any,
        *,
        answers: Sequence[int] | Tensor | None = None,
        pad_id: int | None = None,
    ) -> None:
        super().__init__()
        if not is_bridge(bridge):
            raise ValueError(
                f"BridgedModel takes a TransformerLens TransformerBridge, got {type(bridge).__name__}"
            )
        self.bridge = bridge
        c = bridge.cfg
        hf = bridge.original_model.config
        if pad_id is None:
            tok = getattr(bridge, "tokenizer", None)
            pad_id = getattr(tok, "pad_token_id", None)
            pad_id = getattr(hf, "pad_token_id", None) if pad_id is None else pad_id
        pad_id = -1 if pad_id is None else int(pad_id)
        if answers is not None:
            answers = torch.as_tensor(answers)
            if answers.ndim != 1 or len(answers) < 2 or answers.is_floating_point():
                raise ValueError(f"answers must be 2 or more token ids, got {answers.tolist()!r}")
            if len(set(answers.tolist())) != len(answers) or bool(
                (answers < 0).any() | (answers >= c.d_vocab).any()
            ):
                raise ValueError(
                    f"answers must be distinct token ids in [0, {c.d_vocab}), got {answers.tolist()!r}"
                )
            if pad_id in answers.tolist():
                raise ValueError(f"answers include the pad id {pad_id}")
        self.register_buffer(
            "answers", None if answers is None else answers.long(), persistent=False
        )
        self._encoding: BridgeEncoding | None = None
        self._keeps: bool | None = None
        kind = getattr(hf, "model_type", "?")
        arch = ARCH_OF.get(kind, kind)
        name, how = encoding_names(bridge, hf)
        mlp_in, mlp_out = mlp_hooks(bridge)
        self.cfg = BridgeConfig(
            n_layers=c.n_layers,
            n_heads=c.n_heads,
            d_head=c.d_head,
            d_model=c.d_model,
            d_vocab=c.d_vocab,
            d_mlp=int(getattr(c, "d_mlp", 0) or 0),
            n_ctx=c.n_ctx,
            pad_id=pad_id,
            n_classes=c.d_vocab if answers is None else len(answers),
            model_type=kind,
            n_kv_heads=int(
                getattr(c, "n_key_value_heads", None)
                or getattr(hf, "num_key_value_heads", None)
                or c.n_heads
            ),
            encoding_name=f"{arch}: {name}",
            encoding_kind=how,
            parallel_attn_mlp=bool(getattr(c, "parallel_attn_mlp", False)),
            mlp_in_hook=mlp_in,
            mlp_out_hook=mlp_out,
            flags=c,
        )
        self._resumes = resumes_exactly(bridge, c.d_vocab)  # one 7-token forward, here

    # ------------------------------------------------------------------ what the probes read
    @property
    def encoding(self) -> BridgeEncoding:
        """What route shares read of the encoding (:class:`BridgeEncoding`); the logit
        decomposition, which needs our own encoding modules, says so in one line."""
        if self._encoding is None:
            self._encoding = BridgeEncoding(self)
        return self._encoding

    @property
    def W_E(self) -> Tensor:
        return self.bridge.W_E

    @property
    def blocks(self) -> Any:
        return self.bridge.blocks

    def check_inputs(self, tokens: Tensor, pad_mask: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """Tokens checked (ids in the vocabulary, within the context) and the pad mask (None: no pads)."""
        cfg = self.cfg
        tokens = check_token_ids(tokens, cfg.d_vocab, cfg.n_ctx)
        pad_mask = check_pad_mask_tensor(tokens, pad_mask, cfg.pad_id)
        if bool((pad_mask[:, 1:] & ~pad_mask[:, :-1]).any()):
            row = int((pad_mask[:, 1:] & ~pad_mask[:, :-1]).any(1).nonzero()[0])
            raise ValueError(f"pad_mask: row {row} has a real token after a pad; pad on the right")
        return tokens, (None if bool(pad_mask.all()) else pad_mask)

    def forward(self, tokens: Tensor, pad_mask: Tensor | None = None) -> Tensor:
        """Class logits ``[batch, n_classes]`` at each row's last real token."""
        tokens, mask = self.check_inputs(tokens, pad_mask)
        return self._run(self.bridge, tokens, mask)

    def forward_unchecked(self, tokens: Tensor, key_valid: Tensor | None, **restart: Any) -> Tensor:
        """The forward on inputs :meth:`check_inputs` already checked (``key_valid``: its pad
        mask, None without pads). There is no restart seam: ``start_at_layer`` and the rest are
        refused."""
        if restart:
            raise ValueError(
                f"a bridge cannot restart its forward inside the model ({', '.join(restart)}); "
                "the probes run it from the embedding"
            )
        return self._run(self.bridge, tokens, key_valid)

    def attention_scale(self, layer: int) -> float:
        """The factor on ``q . k`` in layer ``layer``: the attention's ``scale`` or ``scaling``
        where it has one, else ``d_head ** -0.5``; the encoding's check holds the bridge's
        ``hook_attn_scores`` to it before the logit decomposition reads it."""
        attn = self.bridge.blocks[layer].attn
        scale = getattr(attn, "scale", None)
        scale = getattr(attn, "scaling", None) if scale is None else scale
        return float(self.cfg.d_head**-0.5 if scale is None else scale)

    # the per-head forks of the circuit probes (TransformerLens' flags, the bridge's own setters)
    def check_forks(self) -> None:
        """Raise, in one line, where an edge cannot be carried (a check on the bridge, once:
        :func:`~pe_interp.models.bridge.forward.check_edges`)."""
        why = why_no_edges(self.bridge, self.cfg.d_vocab)
        if why is not None:
            raise ValueError(
                f"{self.cfg.encoding_name}: {why}; so edge attribution, path patching and "
                "circuits do not run on it (node attribution, ablation and patching do)"
            )

    def post_norm(self, layer: int, branch: str) -> PostNorm | None:
        """The Hugging Face norm after block ``layer``'s ``branch`` (``"attn"``, ``"mlp"``), None
        where there is none (:func:`~pe_interp.models.bridge.forward.post_norm_of`)."""
        return post_norm_of(self.bridge, layer, branch)

    def set_use_split_qkv_input(self, on: bool) -> None:
        self.bridge.set_use_split_qkv_input(on)

    def set_use_attn_in(self, on: bool) -> None:
        self.bridge.set_use_attn_in(on)

    def set_use_hook_mlp_in(self, on: bool) -> None:
        self.bridge.set_use_hook_mlp_in(on)

    def run_with_hooks(
        self,
        tokens: Tensor,
        pad_mask: Tensor | None = None,
        *,
        fwd_hooks: Sequence = (),
        stop_at_layer: int | None = None,
        **kwargs: Any,
    ) -> Tensor:
        """The bridge's forward with ``fwd_hooks``, read as class logits; with ``stop_at_layer``
        below the number of layers, the residual stream before that block instead (as our own
        model and TransformerLens: the blocks from there on and the unembedding do not run)."""
        tokens, mask = self.check_inputs(tokens, pad_mask)
        fwd_hooks = list(fwd_hooks)
        if stop_at_layer is not None and stop_at_layer < self.cfg.n_layers:
            return self.bridge.run_with_hooks(
                tokens,
                fwd_hooks=fwd_hooks,
                stop_at_layer=stop_at_layer,
                **self._mask_kwargs(mask),
                **kwargs,
            )
        return self._run(
            self.bridge.run_with_hooks,
            tokens,
            mask,
            keep=self._may_keep(name for name, _ in fwd_hooks),
            fwd_hooks=fwd_hooks,
            **kwargs,
        )

    def run_with_cache(
        self, tokens: Tensor, pad_mask: Tensor | None = None, **kwargs: Any
    ) -> tuple[Tensor, Any]:
        """The bridge's ``run_with_cache`` (``names_filter`` and the rest pass through), its
        logits read as class logits; the cache is the bridge's ``ActivationCache``. Given a
        ``names_filter`` of names none of which is the unembedding's, only the read position is
        unembedded (module docstring)."""
        tokens, mask = self.check_inputs(tokens, pad_mask)
        names = kwargs.get("names_filter")
        names = [names] if isinstance(names, str) else names
        keep = isinstance(names, (list, tuple)) and self._may_keep(names)
        logits, cache = self._run(
            self.bridge.run_with_cache, tokens, mask, keep=keep, raw=True, **kwargs
        )
        return self._read_logits(logits, mask, keep), cache

    @property
    def can_resume(self) -> bool:
        """Whether :meth:`resume` is exact for this bridge (checked once on a 7-token forward,
        :func:`~pe_interp.models.bridge.forward.resumes_exactly`)."""
        return self._resumes

    @property
    def restart(self) -> Restart:
        """``"resid_pre"`` where :meth:`resume` is exact, else ``"embed"``."""
        return "resid_pre" if self.can_resume else "embed"

    @property
    def kv_layout(self) -> KVLayout:
        """The bridge's key/value heads (``n_key_value_heads``; its ``hook_k``/``hook_v`` carry
        those heads only)."""
        return KVLayout(self.cfg.n_heads, self.cfg.n_kv_heads)

    def resume(
        self,
        tokens: Tensor,
        layer: int,
        residual: Tensor,
        pad_mask: Tensor | None,
        fwd_hooks: Sequence = (),
    ) -> Tensor:
        """Class logits of the forward restarted at ``blocks.{layer}.hook_resid_pre`` = ``residual``
        (``pad_mask`` as checked by :meth:`check_inputs`; ``tokens`` unread), with ``fwd_hooks``
        (on layer ``layer`` or later: the blocks before it do not run, :func:`skipping_blocks`)."""
        if not self.can_resume:
            raise ValueError(
                f"{self.cfg.encoding_name}: the bridge cannot restart at a layer exactly"
            )
        fwd_hooks = list(fwd_hooks)
        check_hooks_from(fwd_hooks, layer)
        with self.bridge.hooks(fwd_hooks=fwd_hooks), skipping_blocks(self.bridge, layer):
            return self._run(
                self.bridge,
                residual,
                pad_mask,
                keep=self._may_keep(n for n, _ in fwd_hooks),
                start_at_layer=layer,
            )

    def hooks(self, fwd_hooks: Sequence = (), **kwargs: Any) -> Any:
        """The bridge's own hook context (hooks removed on exit)."""
        return self.bridge.hooks(fwd_hooks=list(fwd_hooks), **kwargs)

    # ------------------------------------------------------------------ internals
    @staticmethod
    def _mask_kwargs(mask: Tensor | None) -> dict[str, Tensor]:
        return {} if mask is None else {"attention_mask": mask.long()}

    @property
    def keeps_logits(self) -> bool:
        """Whether the Hugging Face model unembeds chosen positions only (``logits_to_keep``)."""
        if self._keeps is None:
            self._keeps = keeps_logits(self.bridge.original_model)
        return self._keeps

    def _may_keep(self, names: Any) -> bool:
        return self.keeps_logits and may_keep(names)

    def _run(
        self,
        call: Any,
        x: Tensor,
        mask: Tensor | None,
        *,
        keep: bool = True,
        raw: bool = False,
        **kwargs: Any,
    ) -> Any:
        """``call(x, attention_mask=..., **kwargs)`` (the bridge's forward or one of its runners),
        unembedding only each row's last real position where ``keep`` (and the model can), read
        as class logits (``raw``: the call's output as it is)."""
        keep = keep and self.keeps_logits
        if keep:
            kwargs["logits_to_keep"] = read_positions(mask, x.device)
        out = call(x, **self._mask_kwargs(mask), **kwargs)
        return out if raw else self._read_logits(out, mask, keep)

    def _read_logits(self, logits: Tensor, mask: Tensor | None, kept: bool) -> Tensor:
        """Class logits of the bridge's logits (``kept``: ``[batch, 1, vocab]``, the read position)."""
        return read_answers(logits, None if kept else mask, self.answers)

    def _read(self, logits: Tensor, mask: Tensor | None) -> Tensor:
        return read_answers(logits, mask, self.answers)


__all__ = [
    "BridgeEncoding",
    "BridgedModel",
    "is_bridge",
    "skipping_blocks",
]
