"""Our model in "authors' mode" against an independent restatement of the authors' forward pass.

The authors' code (github.com/Qihuai27/Deposit-Pattern-Research, mirrored bare at
``/work/.mirror/Qihuai27+Deposit-Pattern-Research/repo``) is restated below, in our own words, as
small plain-PyTorch modules (``AuthorsLayer``, ``AuthorsModel``); it is not imported and not
copied. What is restated, and from where:

- ``dis_gen/trans.py`` (``count_gen/trans.py`` is byte-identical): ``TransformerDecoder`` and
  ``AttentionDecoderLayer`` (lines 128-286) as the training loop calls them,
  ``model(ids, memory=ids)`` (lines 336, 355). Each layer: Pre-LN on the query side only
  (``norm1`` of the residual stream feeds ``q_linear``); K and V from ``memory`` = token embedding
  + residual PE of the *input* (the same tensor for every layer, not normalised, no dropout); no
  attention mask and no padding mask; ``q / sqrt(head_dim)``; ALiBi or relative bias added to the
  logits; softmax; dropout on the attention weights, on the attention output and on the FFN
  output (one ``nn.Dropout``); ReLU FFN; no final LayerNorm; mean over *all* positions, pads
  included; a Linear head.
- The six PEs of ``trans.py``: ``nope`` (nothing); ``absolute`` = ``AbsolutePositionalEncoding``,
  interleaved sin/cos added to the input (lines 44-58); ``random`` = ``nn.Embedding(max_len,
  d_model)`` added (lines 71-79); ``relative`` = one ``[2*max_len-1, n_heads]`` table per layer,
  entry ``(j - i + max_len - 1)`` added to logit ``(i, j)`` (lines 147-152, 212-220); ``alibi`` =
  ``-exp(-h/H) * |i - j|`` (lines 163-168, 207-211); ``rope`` = the model-level ``RoPE`` module's
  concat-layout table ``[sin(all freqs), cos(all freqs)]`` added to the input (lines 93-99,
  254-255) *and* RoPE on adjacent pairs ``(2i, 2i+1)`` at ``theta_i = 10000^(-2i/d_head)`` on q
  and k of every head (lines 101-112, 142-143, 190-193).
- ``dis_gen/partialrope.py``: the same layer with RoPE (the same rotation, written there with a
  cached even/odd table, lines 36-98) on the first ``k_rope_heads`` heads only, and no absolute PE
  at all (lines 189-198).
- ``torch.nn`` default initialisation of that model (``nn.Linear``, ``nn.Embedding``,
  ``nn.LayerNorm``; the relative table ``normal_(std=0.02)``), for the initialisation test.
- The warm-up + cosine ``LambdaLR`` of ``trans.py`` lines 316-324, for the schedule test.

Deliberately not restated: the tokenizer (``vocab-gen.py``; a Unigram tokenizer trained on a
``c.txt`` that is not in the repository), the data files and their generators (``data-gen.py``,
``vocab.json`` and ``generated_dataset.json`` are not in the repository either), the
``random_split`` into train/test, the optimiser loop itself, and the ablation scripts
(``transvis.py``/``partialvis.py``, which zero a head's rows of ``v_linear``; our equivalent is
tested in ``tests/test_ablation.py``). The sinusoid and rotation tables are computed here in
float64 and cast to float32, so float rounding is all that separates them from the authors'
float32 tables.

One deliberate size difference: the authors' head is ``nn.Linear(d_model, vocab_size)`` (574
outputs whatever the task); ours has ``n_classes`` outputs. The restatement takes the width as a
parameter; one case below uses ``n_classes == d_vocab`` as they do.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pe_interp import HookedPETransformer, ModelConfig
from pe_interp.config.presets import AUTHORS_ENCODINGS, build_run_configs

torch.set_num_threads(1)

ATOL = 1e-5  # float32, absolute, on logits of order 1


# =================================================================================================
# The restatement of the authors' model
# =================================================================================================
def interleaved_sinusoid(max_len: int, d_model: int) -> Tensor:
    """``AbsolutePositionalEncoding``: column 2i = sin(p * w_i), column 2i+1 = cos(p * w_i), with
    ``w_i = exp(-2i * ln(10000) / d_model)``."""
    pos = torch.arange(max_len, dtype=torch.float64)[:, None]
    w = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float64) * -(math.log(10000.0) / d_model))
    table = torch.zeros(max_len, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(pos * w)
    table[:, 1::2] = torch.cos(pos * w)
    return table.float()


def concat_sinusoid(max_len: int, d_model: int) -> Tensor:
    """The model-level ``RoPE.forward`` of ``trans.py``: all sines, then all cosines, at
    ``inv_freq = 1 / 10000^(2i / d_model)``."""
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, d_model, 2, dtype=torch.float64) / d_model))
    angles = torch.arange(max_len, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return torch.cat([angles.sin(), angles.cos()], dim=-1).float()


def rotation_tables(max_len: int, head_dim: int) -> tuple[Tensor, Tensor]:
    """cos and sin ``[max_len, head_dim // 2]`` of angle ``p * 10000^(-i / (head_dim/2))``, as in
    ``partialrope.py`` (the same as ``trans.py``'s ``10000^(-2i/head_dim)``)."""
    half = head_dim // 2
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, half, dtype=torch.float64) / half))
    angles = torch.arange(max_len, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return angles.cos().float(), angles.sin().float()


def rotate_adjacent_pairs(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x: ``[..., seq, head_dim]``. Pair i is dims (2i, 2i+1):
    ``(a, b) -> (a cos - b sin, a sin + b cos)``."""
    seq = x.shape[-2]
    c, s = cos[:seq], sin[:seq]
    a, b = x[..., 0::2], x[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = a * c - b * s
    out[..., 1::2] = a * s + b * c
    return out


def rotate_half_split(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """The *other* RoPE layout (GPT-NeoX: pair i is dims (i, i + d/2)); used only to show that the
    comparison can tell the layouts apart."""
    seq, half = x.shape[-2], x.shape[-1] // 2
    c, s = cos[:seq], sin[:seq]
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * c - b * s, a * s + b * c], dim=-1)


PE_NAMES = ("nope", "absolute", "random", "relative", "alibi", "rope", "partialrope")


@dataclass(frozen=True)
class AuthorsConfig:
    vocab_size: int
    d_model: int
    d_ff: int
    num_heads: int
    num_layers: int
    max_len: int
    n_out: int  # the authors use vocab_size here
    pe: str = "nope"  # one of PE_NAMES
    k_rope_heads: int = 0  # partialrope only
    dropout: float = 0.1
    # the pair layout of the rotation; a sanity check swaps in rotate_half_split
    rotate: Callable[[Tensor, Tensor, Tensor], Tensor] = rotate_adjacent_pairs


class AuthorsLayer(nn.Module):
    """``AttentionDecoderLayer``: ``forward(x, memory)``."""

    def __init__(self, cfg: AuthorsConfig):
        super().__init__()
        M, H = cfg.d_model, cfg.num_heads
        assert M % H == 0
        self.cfg, self.H, self.D = cfg, H, M // H
        self.q_linear = nn.Linear(M, M)
        self.k_linear = nn.Linear(M, M)
        self.v_linear = nn.Linear(M, M)
        self.out_linear = nn.Linear(M, M)
        self.ffn = nn.Sequential(nn.Linear(M, cfg.d_ff), nn.ReLU(), nn.Linear(cfg.d_ff, M))
        self.dropout = nn.Dropout(cfg.dropout)
        self.norm1 = nn.LayerNorm(M)
        self.norm2 = nn.LayerNorm(M)
        if cfg.pe == "relative":
            self.relative_bias_table = nn.Parameter(torch.zeros(2 * cfg.max_len - 1, H))
            nn.init.normal_(self.relative_bias_table, std=0.02)
        self.rope_heads = {"rope": H, "partialrope": cfg.k_rope_heads}.get(cfg.pe, 0)
        cos, sin = rotation_tables(cfg.max_len, self.D)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, x: Tensor, memory: Tensor) -> Tensor:
        B, T, M = x.shape
        H, D, k_rope = self.H, self.D, self.rope_heads
        q = self.q_linear(self.norm1(x))  # only the queries see the (normalised) residual stream
        k = self.k_linear(memory)
        v = self.v_linear(memory)
        q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in (q, k, v))  # [B, H, T, D]
        if k_rope:
            rot = self.cfg.rotate
            q = torch.cat([rot(q[:, :k_rope], self.cos, self.sin), q[:, k_rope:]], dim=1)
            k = torch.cat([rot(k[:, :k_rope], self.cos, self.sin), k[:, k_rope:]], dim=1)
        q = q * (1.0 / math.sqrt(D))
        scores = q @ k.transpose(-2, -1)  # [B, H, T, T]; no mask of any kind
        offset = torch.arange(T)[None, :] - torch.arange(T)[:, None]  # [i, j] = j - i
        if self.cfg.pe == "alibi":
            slopes = torch.exp(-torch.arange(H, dtype=torch.float32) / H)
            scores = scores - offset.abs()[None] * slopes[:, None, None]
        elif self.cfg.pe == "relative":
            table = self.relative_bias_table[offset + self.cfg.max_len - 1]  # [T, T, H]
            scores = scores + table.permute(2, 0, 1)
        weights = self.dropout(F.softmax(scores, dim=-1))
        attn = (weights @ v).transpose(1, 2).reshape(B, T, M)
        x = x + self.dropout(self.out_linear(attn))
        return x + self.dropout(self.ffn(self.norm2(x)))


class AuthorsModel(nn.Module):
    """``TransformerDecoder``: ``forward(tgt, memory)`` with ``memory`` a token tensor."""

    def __init__(self, cfg: AuthorsConfig):
        super().__init__()
        assert cfg.pe in PE_NAMES, cfg.pe
        self.cfg = cfg
        self.embedding = nn.Embedding(cfg.vocab_size, cfg.d_model)
        if cfg.pe == "random":
            self.position_embeddings = nn.Embedding(cfg.max_len, cfg.d_model)
        table = {"absolute": interleaved_sinusoid, "rope": concat_sinusoid}.get(cfg.pe)
        pe_table = table(cfg.max_len, cfg.d_model) if table else None
        self.register_buffer("pe_table", pe_table, persistent=False)
        self.layers = nn.ModuleList(AuthorsLayer(cfg) for _ in range(cfg.num_layers))
        self.fc_out = nn.Linear(cfg.d_model, cfg.n_out)

    def embed(self, ids: Tensor) -> Tensor:
        x = self.embedding(ids)
        T = ids.shape[1]
        if self.cfg.pe == "random":
            x = x + self.position_embeddings(torch.arange(T)[None].expand(ids.shape[0], T))
        elif self.pe_table is not None:
            x = x + self.pe_table[:T][None]
        return x

    def forward(self, tgt: Tensor, memory: Tensor | None = None) -> Tensor:
        x = self.embed(tgt)
        mem = x if memory is None else self.embed(memory)
        for layer in self.layers:
            x = layer(x, mem)
        return self.fc_out(x.mean(dim=1))  # every position, pads included


# =================================================================================================
# Our side, and the map from our parameters onto theirs
# =================================================================================================
def authors_mode(**shape) -> dict:
    """Our ModelConfig fields for the authors' model (``shape`` holds sizes and the encoding)."""
    return dict(
        act_fn="relu",
        final_norm=False,
        mask_padding=False,
        kv_source="embed",
        dropout=0.1,
        attn_dropout=0.1,
        embed_dropout=0.0,
        init_mode="torch",
        normalization_type="LN",
        pooling="mean",
        attention_dir="bidirectional",
        **shape,
    )


def encoding_param(ours: HookedPETransformer, leaf: str) -> str:
    """The name of the unique encoding parameter called ``leaf`` (alone or in a composite)."""
    pattern = re.compile(rf"encoding\.(parts\.\d+\.)?{leaf}")
    found = [n for n, _ in ours.named_parameters() if pattern.fullmatch(n)]
    assert len(found) == 1, f"expected one encoding parameter {leaf!r}, found {found}"
    return found[0]


def their_layout(
    ours: HookedPETransformer, tensors: dict[str, Tensor] | None = None
) -> dict[str, tuple[str, Tensor]]:
    """``{their parameter name: (our parameter name, value in their layout)}`` covering every one
    of our parameters; ``tensors`` (default: our parameters) maps our names to what to lay out
    (e.g. their gradients)."""
    cfg = ours.cfg
    H, M, D = cfg.n_heads, cfg.d_model, cfg.d_head
    P = {n: p.detach() for n, p in ours.named_parameters()} if tensors is None else tensors
    out: dict[str, tuple[str, Tensor]] = {}

    def put(theirs: str, name: str, fn=lambda t: t) -> None:
        out[theirs] = (name, fn(P[name]))

    put("embedding.weight", "W_E")
    if any(n.endswith("W_pos") for n in P):
        put("position_embeddings.weight", encoding_param(ours, "W_pos"))
    rel = encoding_param(ours, "rel_bias") if any(n.endswith("rel_bias") for n in P) else None
    for layer in range(cfg.n_layers):
        t, o = f"layers.{layer}", f"blocks.{layer}"
        put(f"{t}.norm1.weight", f"{o}.ln1.w")
        put(f"{t}.norm1.bias", f"{o}.ln1.b")
        put(f"{t}.norm2.weight", f"{o}.ln2.w")
        put(f"{t}.norm2.bias", f"{o}.ln2.b")
        for x, lin in (("Q", "q_linear"), ("K", "k_linear"), ("V", "v_linear")):
            put(
                f"{t}.{lin}.weight",
                f"{o}.attn.W_{x}",
                lambda w: w.permute(0, 2, 1).reshape(H * D, M),
            )
            put(f"{t}.{lin}.bias", f"{o}.attn.b_{x}", lambda b: b.reshape(H * D))
        put(f"{t}.out_linear.weight", f"{o}.attn.W_O", lambda w: w.reshape(H * D, M).T)
        put(f"{t}.out_linear.bias", f"{o}.attn.b_O")
        put(f"{t}.ffn.0.weight", f"{o}.mlp.W_in", lambda w: w.T)
        put(f"{t}.ffn.0.bias", f"{o}.mlp.b_in")
        put(f"{t}.ffn.2.weight", f"{o}.mlp.W_out", lambda w: w.T)
        put(f"{t}.ffn.2.bias", f"{o}.mlp.b_out")
        if rel is not None:  # their table of layer l, [2 * max_len - 1, head], is our rel_bias[l].T
            put(f"{t}.relative_bias_table", rel, lambda r, layer=layer: r[layer].T)
    put("fc_out.weight", "W_U", lambda w: w.T)
    put("fc_out.bias", "b_U")
    return out


def load_ours_into_theirs(
    ours: HookedPETransformer, theirs: AuthorsModel, strict: bool = True
) -> None:
    """Copy every parameter across, checking that the two parameter sets correspond one to one
    (``strict=False``: ours may have more, for the perturbation checks)."""
    mapped = their_layout(ours)
    their_params = dict(theirs.named_parameters())
    assert set(mapped) == set(their_params), (
        f"only ours: {sorted(set(mapped) - set(their_params))}; "
        f"only theirs: {sorted(set(their_params) - set(mapped))}"
    )
    used = {name for name, _ in mapped.values()}
    assert not strict or used == {n for n, _ in ours.named_parameters()}, (
        "some of our parameters have no counterpart"
    )
    with torch.no_grad():
        for name, (_, value) in mapped.items():
            assert their_params[name].shape == value.shape, (
                name,
                their_params[name].shape,
                value.shape,
            )
            their_params[name].copy_(value)


def authors_config_for(
    ours_cfg: ModelConfig, pe: str, k_rope_heads: int = 0, **changes
) -> AuthorsConfig:
    return AuthorsConfig(
        vocab_size=ours_cfg.d_vocab,
        d_model=ours_cfg.d_model,
        d_ff=ours_cfg.d_mlp,
        num_heads=ours_cfg.n_heads,
        num_layers=ours_cfg.n_layers,
        max_len=ours_cfg.n_ctx,
        n_out=ours_cfg.n_classes,
        pe=pe,
        k_rope_heads=k_rope_heads,
        dropout=ours_cfg.dropout,
        **changes,
    )


def padded_tokens(batch: int, n_pos: int, d_vocab: int, seed: int = 0) -> Tensor:
    """Real ids in [1, d_vocab), right-padded with 0 to different lengths (one row unpadded)."""
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(1, d_vocab, (batch, n_pos), generator=gen)
    lengths = [n_pos, n_pos - 3, n_pos // 2, 5, 1, n_pos - 1][:batch]
    for row, length in enumerate(lengths):
        tokens[row, length:] = 0
    return tokens


SMALL = dict(n_layers=3, d_model=32, n_heads=4, d_mlp=64, n_ctx=24, d_vocab=50, n_classes=7)
WIDE = dict(SMALL, d_model=64, n_heads=16)  # d_head = 4, so "k = 16" means all heads, as theirs

# id -> (our shape, our encoding, their PE, their k_rope_heads)
CASES: dict[str, tuple[dict, object, str, int]] = {
    "nope": (SMALL, AUTHORS_ENCODINGS["nope"], "nope", 0),
    "absolute": (SMALL, AUTHORS_ENCODINGS["absolute"], "absolute", 0),
    "random": (SMALL, AUTHORS_ENCODINGS["random"], "random", 0),
    "relative": (SMALL, AUTHORS_ENCODINGS["relative"], "relative", 0),
    "alibi": (SMALL, AUTHORS_ENCODINGS["alibi"], "alibi", 0),
    "rope": (SMALL, AUTHORS_ENCODINGS["rope"], "rope", 0),
    "rope-vocab-head": (
        dict(SMALL, n_classes=SMALL["d_vocab"]),
        AUTHORS_ENCODINGS["rope"],
        "rope",
        0,
    ),
    "partialrope-k1": (WIDE, {"name": "rope", "heads": [0]}, "partialrope", 1),
    "partialrope-k3": (WIDE, {"name": "rope", "heads": [0, 1, 2]}, "partialrope", 3),
    "partialrope-k16-list": (WIDE, {"name": "rope", "heads": list(range(16))}, "partialrope", 16),
    "partialrope-k16": (WIDE, "rope", "partialrope", 16),
}
# Cases whose bias table is scaled up after initialisation (N(0, 0.02) barely moves the logits,
# so an indexing error in it would show only at ~1e-3).
TABLE_SCALE = {"relative-table-x25": 25.0}
CASES["relative-table-x25"] = CASES["relative"]


def build_pair(
    case: str, seed: int = 0, strict: bool = True, **our_changes
) -> tuple[HookedPETransformer, AuthorsModel]:
    """Our model in authors' mode for ``case`` (with ``our_changes``), and the restatement of the
    authors' model for the case, holding our weights."""
    shape, encoding, pe, k = CASES[case]
    cfg = ModelConfig(**{**authors_mode(**shape, encoding=encoding, seed=seed), **our_changes})
    ours = HookedPETransformer(cfg).eval()
    if case in TABLE_SCALE:
        with torch.no_grad():
            ours.get_parameter(encoding_param(ours, "rel_bias")).mul_(TABLE_SCALE[case])
    theirs = AuthorsModel(authors_config_for(cfg, pe, k)).eval()
    load_ours_into_theirs(ours, theirs, strict)
    return ours, theirs


# =================================================================================================
# 1. The forward pass, eval mode
# =================================================================================================
def test_authors_encodings_table():
    """The map from the authors' PE names to ours, as documented."""
    assert set(AUTHORS_ENCODINGS) == {"nope", "absolute", "random", "relative", "alibi", "rope"}
    as_specs = {k: ModelConfig(**SMALL, encoding=v).encoding for k, v in AUTHORS_ENCODINGS.items()}
    assert [s.name for s in as_specs["rope"]] == ["sinusoidal", "rope"]
    assert as_specs["rope"][0].kwargs == {"layout": "concat"}
    assert as_specs["alibi"][0].kwargs == {"slopes": "authors"}
    assert [(s.name, s.kwargs) for s in as_specs["absolute"]] == [("sinusoidal", {})]


@pytest.mark.parametrize("backend", ["eager", "auto"])
@pytest.mark.parametrize("case", list(CASES))
def test_logits_match_the_authors_forward(case, backend):
    """Eval mode, right-padded batches at full and at shorter length: logits agree to 1e-5, and
    so does every parameter's gradient of a loss (pads and the gradient into the PE tables
    included)."""
    ours, theirs = build_pair(case, attn_backend=backend)
    n_ctx, d_vocab, n_classes = ours.cfg.n_ctx, ours.cfg.d_vocab, ours.cfg.n_classes
    for n_pos in (n_ctx, n_ctx - 7):
        tokens = padded_tokens(6, n_pos, d_vocab, seed=n_pos)
        assert (tokens == 0).any() and (tokens[0] != 0).all()
        mine = ours(tokens)
        ref = theirs(tokens, memory=tokens)
        assert mine.shape == ref.shape == (6, n_classes)
        assert ref.abs().max() > 0.1  # logits are not trivially small
        torch.testing.assert_close(mine, ref, atol=ATOL, rtol=0)

    labels = torch.arange(6) % n_classes
    F.cross_entropy(mine, labels).backward()
    F.cross_entropy(ref, labels).backward()
    assert_grads_match(ours, theirs)


def assert_grads_match(ours: HookedPETransformer, theirs: AuthorsModel) -> None:
    """Every gradient of ours, laid out as theirs, equals theirs (and none is missing or zero)."""
    ours_grads = {n: p.grad for n, p in ours.named_parameters()}
    assert all(g is not None for g in ours_grads.values()), [
        n for n, g in ours_grads.items() if g is None
    ]
    theirs_grads = {n: p.grad for n, p in theirs.named_parameters()}
    for name, (our_name, grad) in their_layout(ours, ours_grads).items():
        torch.testing.assert_close(
            grad, theirs_grads[name], atol=ATOL, rtol=1e-4, msg=f"{name} / {our_name}"
        )
    assert max(g.abs().max().item() for g in ours_grads.values()) > 0.01


def max_gap(ours: nn.Module, theirs: nn.Module, n_pos: int | None = None) -> float:
    n_pos = n_pos or ours.cfg.n_ctx
    tokens = padded_tokens(6, n_pos, ours.cfg.d_vocab, seed=3)
    with torch.no_grad():
        return (ours(tokens) - theirs(tokens, memory=tokens)).abs().max().item()


PERTURBATIONS = {
    # our textbook switches, one at a time
    "ours: padding masked": ("random", dict(mask_padding=True)),
    "ours: K/V from the residual stream": ("nope", dict(kv_source="residual")),
    "ours: final LayerNorm": ("absolute", dict(final_norm=True)),
    "ours: GELU": ("nope", dict(act_fn="gelu")),
    "ours: interleaved sinusoid under RoPE": ("rope", dict(encoding=["sinusoidal", "rope"])),
    "ours: concat sinusoid as 'absolute'": (
        "absolute",
        dict(encoding={"name": "sinusoidal", "layout": "concat"}),
    ),
    "ours: standard ALiBi slopes": ("alibi", dict(encoding="alibi")),
    "ours: RoPE only (no sinusoid)": ("rope", dict(encoding="rope")),
    "ours: RoPE on head 1, not head 0": (
        "partialrope-k1",
        dict(encoding={"name": "rope", "heads": [1]}),
    ),
    # their side
    "theirs: half-split RoPE pairs": ("rope", "rotate_half_split"),
    "theirs: relative table transposed (i - j)": ("relative-table-x25", "flip_relative"),
}


@pytest.mark.parametrize("what", list(PERTURBATIONS))
def test_tolerance_detects_each_perturbation(what):
    """Each single change, on either side, moves the logits by far more than the tolerance, so
    agreement to 1e-5 above is evidence, not an accident of a loose threshold."""
    case, change = PERTURBATIONS[what]
    if isinstance(change, dict):
        # ours changed, theirs the authors' model
        ours, theirs = build_pair(case, strict=False, **change)
    else:
        ours, theirs = build_pair(case)
        assert max_gap(ours, theirs) < ATOL  # unperturbed, they agree
        if change == "rotate_half_split":
            cfg = authors_config_for(ours.cfg, "rope", rotate=rotate_half_split)
            theirs = AuthorsModel(cfg).eval()
            load_ours_into_theirs(ours, theirs)
        else:
            with torch.no_grad():
                for layer in theirs.layers:
                    layer.relative_bias_table.copy_(layer.relative_bias_table.flip(0))
    assert max_gap(ours, theirs) > 100 * ATOL, what


# =================================================================================================
# 2. Train mode: where dropout sits
# =================================================================================================
def test_train_mode_dropout_placement():
    """With ``dropout = attn_dropout = 0.1`` and ``embed_dropout = 0`` in train mode:

    - the embedding is not dropped (``blocks.0.hook_resid_pre`` = ``hook_embed`` +
      ``hook_pos_embed``, equal to the eval-mode value);
    - every layer's keys and values come from that undropped embedding, so they equal their
      eval-mode values exactly (the authors' ``memory``);
    - the layer-0 attention output and every MLP output are inverted-dropout copies of their
      undropped values (each entry 0 or value / 0.9, about 10 % zeros);
    - the attention weights are dropped after the softmax (``hook_pattern`` rows still sum to 1,
      but ``hook_z`` is not ``pattern @ v``);
    - nothing is dropped after the last block: logits = mean over positions of the last
      ``hook_resid_post`` @ W_U + b_U (no final LayerNorm).
    """
    cfg = ModelConfig(**authors_mode(**SMALL, encoding=AUTHORS_ENCODINGS["random"], seed=1))
    model = HookedPETransformer(cfg)
    tokens = padded_tokens(6, cfg.n_ctx, cfg.d_vocab, seed=5)
    model.eval()
    _, clean = model.run_with_cache(tokens)
    model.train()
    torch.manual_seed(0)
    logits, cache = model.run_with_cache(tokens)
    keep = 1 - cfg.dropout

    embed = cache["hook_embed"] + cache["hook_pos_embed"]
    torch.testing.assert_close(cache["blocks.0.hook_resid_pre"], embed, atol=0, rtol=0)
    torch.testing.assert_close(
        cache["blocks.0.hook_resid_pre"], clean["blocks.0.hook_resid_pre"], atol=0, rtol=0
    )
    for layer in range(cfg.n_layers):
        for what in ("k", "v"):
            name = f"blocks.{layer}.attn.hook_{what}"
            torch.testing.assert_close(cache[name], clean[name], atol=0, rtol=0, msg=name)
    # queries of layer >= 1 read the (dropped) residual stream, so they do change
    assert not torch.allclose(cache["blocks.1.attn.hook_q"], clean["blocks.1.attn.hook_q"])

    def check_inverted_dropout(dropped: Tensor, undropped: Tensor, name: str) -> None:
        zero = dropped == 0
        torch.testing.assert_close(
            dropped[~zero], undropped[~zero] / keep, atol=1e-6, rtol=1e-5, msg=name
        )
        frac = zero.float().mean().item()
        assert 0.06 < frac < 0.14, f"{name}: {frac:.3f} of the entries dropped, expected about 0.1"

    # layer 0's attention sees identical inputs in both modes, only its weights are dropped
    # (attn_dropout), and its output is dropped again (dropout)
    for layer in range(cfg.n_layers):
        block = model.blocks[layer]
        mlp_clean = block.mlp(block.ln2(cache[f"blocks.{layer}.hook_resid_mid"]))
        check_inverted_dropout(
            cache[f"blocks.{layer}.hook_mlp_out"], mlp_clean, f"layer {layer} mlp_out"
        )
        pattern, v, z = (cache[f"blocks.{layer}.attn.hook_{n}"] for n in ("pattern", "v", "z"))
        torch.testing.assert_close(pattern.sum(-1), torch.ones_like(pattern.sum(-1)))
        undropped_z = torch.einsum("bhqk,bkhd->bqhd", pattern, v)
        assert (z - undropped_z).abs().max() > 1e-3, f"layer {layer}: attention weights not dropped"
    torch.testing.assert_close(
        cache["blocks.0.attn.hook_pattern"], clean["blocks.0.attn.hook_pattern"]
    )
    attn0 = torch.einsum("bqhd,hdm->bqm", cache["blocks.0.attn.hook_z"], model.blocks[0].attn.W_O)
    check_inverted_dropout(
        cache["blocks.0.hook_attn_out"], attn0 + model.blocks[0].attn.b_O, "layer 0 attn_out"
    )

    last = cache[f"blocks.{cfg.n_layers - 1}.hook_resid_post"]
    torch.testing.assert_close(logits, last.mean(1) @ model.W_U + model.b_U, atol=1e-6, rtol=0)


def test_train_mode_matches_the_authors_with_the_same_dropout_masks():
    """In train mode with the eager backend, both models draw their dropout masks from torch's
    global generator in the same order and shapes (per layer: attention weights, attention
    output, FFN output; nothing for the embedding), so from the same seed they compute the same
    logits and gradients. This pins the placement of every dropout, not only its presence."""
    ours, theirs = build_pair("relative", seed=2, attn_backend="eager")
    ours.train()
    theirs.train()
    tokens = padded_tokens(6, ours.cfg.n_ctx, ours.cfg.d_vocab, seed=9)
    labels = torch.arange(6) % ours.cfg.n_classes
    torch.manual_seed(123)
    mine = ours(tokens)
    torch.manual_seed(123)
    ref = theirs(tokens, memory=tokens)
    torch.manual_seed(124)
    other_masks = theirs(tokens, memory=tokens)
    assert (other_masks - ref).abs().max() > 1e-3  # dropout is really on
    torch.testing.assert_close(mine, ref, atol=ATOL, rtol=0)
    F.cross_entropy(mine, labels).backward()
    F.cross_entropy(ref, labels).backward()
    assert_grads_match(ours, theirs)


# =================================================================================================
# 3. Initialisation statistics against PyTorch's defaults on their model
# =================================================================================================
def ks_two_sample(a: Tensor, b: Tensor) -> float:
    """Kolmogorov-Smirnov statistic sup |F_a - F_b| of two samples."""
    a, b = a.double().flatten().sort().values, b.double().flatten().sort().values
    grid = torch.cat([a, b])
    fa = torch.searchsorted(a, grid, right=True) / a.numel()
    fb = torch.searchsorted(b, grid, right=True) / b.numel()
    return (fa - fb).abs().max().item()


def ks_one_sample(a: Tensor, cdf) -> float:
    """Kolmogorov-Smirnov statistic of a sample against a continuous CDF."""
    x = a.double().flatten().sort().values
    n = x.numel()
    f = cdf(x)
    i = torch.arange(1, n + 1, dtype=torch.float64)
    return max((i / n - f).max().item(), (f - (i - 1) / n).max().item())


def ks_critical(n: int, m: int | None = None, alpha: float = 1e-4) -> float:
    """Asymptotic critical value of the KS statistic at level ``alpha``."""
    c = math.sqrt(-0.5 * math.log(alpha / 2))
    return c * math.sqrt(1 / n + (1 / m if m else 0.0))


@dataclass(frozen=True)
class Law:
    kind: str  # "uniform", "normal", "const"
    scale: float  # uniform: the bound; normal: the std; const: the value


def their_law(name: str, cfg: AuthorsConfig) -> Law:
    """PyTorch's default initialisation of each of their parameters (fan_in = input features)."""
    M, F_ = cfg.d_model, cfg.d_ff
    if name == "embedding.weight" or name == "position_embeddings.weight":
        return Law("normal", 1.0)  # nn.Embedding
    if name.endswith("relative_bias_table"):
        return Law("normal", 0.02)
    if ".norm" in name:
        return Law("const", 1.0 if name.endswith("weight") else 0.0)  # nn.LayerNorm
    fan_in = F_ if ".ffn.2." in name else M  # out_linear's fan_in is H * D = M
    return Law("uniform", 1.0 / math.sqrt(fan_in))  # nn.Linear, weight and bias alike


def law_failures(name: str, sample: Tensor, law: Law, reference: Tensor | None) -> list[str]:
    """What is wrong with ``sample`` as a draw from ``law`` (and as a sample of the same law as
    ``reference``); empty when nothing is."""
    x = sample.double().flatten()
    n = x.numel()
    bad: list[str] = []
    if law.kind == "const":
        if not bool((x == law.scale).all()):
            bad.append(f"{name}: not all {law.scale}")
        return bad
    if law.kind == "uniform":
        bound = law.scale
        sigma = bound / math.sqrt(3)
        rel_se_std = math.sqrt(0.2 / n)  # sd of the sample std / sigma (kurtosis 9/5)
        top = x.abs().max().item()
        if top > bound * (1 + 1e-6):
            bad.append(f"{name}: max |w| = {top:.5f} exceeds the bound {bound:.5f}")
        if top < bound * (1 - 20 / n):
            bad.append(f"{name}: max |w| = {top:.5f} well inside the bound {bound:.5f}")

        def cdf(t):
            return ((t + bound) / (2 * bound)).clamp(0, 1)
    else:
        sigma = law.scale
        rel_se_std = math.sqrt(0.5 / n)

        def cdf(t):
            return 0.5 * (1 + torch.erf(t / (sigma * math.sqrt(2))))

    mean, std = x.mean().item(), x.std().item()
    if abs(mean) > 5 * sigma / math.sqrt(n):
        bad.append(f"{name}: mean {mean:.5f}, expected 0 +- {sigma / math.sqrt(n):.5f}")
    if abs(std / sigma - 1) > 5 * rel_se_std:
        bad.append(f"{name}: std {std:.5f}, expected {sigma:.5f} (+- {100 * rel_se_std:.1f} %)")
    d = ks_one_sample(x, cdf)
    if d > ks_critical(n):
        bad.append(f"{name}: KS against the {law.kind} law {d:.4f} > {ks_critical(n):.4f}")
    if reference is not None:
        d2 = ks_two_sample(x, reference)
        crit = ks_critical(n, reference.numel())
        if d2 > crit:
            bad.append(f"{name}: two-sample KS against theirs {d2:.4f} > {crit:.4f}")
    return bad


INIT_SHAPE = dict(
    n_layers=2, d_model=128, n_heads=4, d_mlp=256, n_ctx=64, d_vocab=500, n_classes=500
)


def init_report(init_mode: str) -> tuple[list[str], list[str], set[str]]:
    """(failures of ours, failures of theirs, every parameter name checked) for a learned-PE
    and a relative-PE model of each side."""
    ours_bad: list[str] = []
    theirs_bad: list[str] = []
    checked: set[str] = set()
    for pe, encoding, seed in (
        ("random", AUTHORS_ENCODINGS["random"], 11),
        ("relative", AUTHORS_ENCODINGS["relative"], 12),
    ):
        cfg = ModelConfig(
            **{**authors_mode(**INIT_SHAPE, encoding=encoding, seed=seed), "init_mode": init_mode}
        )
        ours = HookedPETransformer(cfg)
        torch.manual_seed(seed)
        theirs = AuthorsModel(authors_config_for(cfg, pe))
        their_params = dict(theirs.named_parameters())
        mapped = their_layout(ours)
        assert set(mapped) == set(their_params)
        for name, (our_name, value) in mapped.items():
            law = their_law(name, theirs.cfg)
            ref = their_params[name].detach()
            theirs_bad += law_failures(f"theirs {name}", ref, law, None)
            ours_bad += law_failures(f"ours {our_name}", value, law, ref)
            checked.add(our_name)
    return ours_bad, theirs_bad, checked


def test_torch_init_matches_pytorch_defaults_on_their_model():
    """``init_mode="torch"``: every parameter has the law PyTorch gives the authors' model
    (support, mean, std within 5 standard errors, one-sample KS against the law and two-sample
    KS against their own draw, both at level 1e-4); their draw passes the same checks."""
    ours_bad, theirs_bad, checked = init_report("torch")
    assert not theirs_bad, "the laws themselves are wrong:\n" + "\n".join(theirs_bad)
    assert not ours_bad, "\n".join(ours_bad)
    assert {"W_E", "W_U", "b_U", "blocks.0.attn.W_Q", "blocks.1.mlp.b_out"} <= checked
    assert any(n.endswith("W_pos") for n in checked)
    assert any(n.endswith("rel_bias") for n in checked)


def test_default_normal_init_is_told_apart():
    """The same checks reject our default ``init_mode="normal"`` (N(0, 0.02) weights, zero
    biases): the init test can fail."""
    ours_bad, _, _ = init_report("normal")
    flagged = {line.split(":")[0].removeprefix("ours ") for line in ours_bad}
    must_fail = (
        "W_E W_U b_U blocks.0.attn.W_Q blocks.0.attn.b_Q blocks.0.attn.W_O blocks.1.mlp.W_out"
    )
    for name in (*must_fail.split(), "blocks.1.mlp.b_in"):
        assert name in flagged, f"{name} passed the checks under init_mode='normal'"
    assert any(n.endswith("W_pos") for n in flagged)


# =================================================================================================
# 4. The presets: authors_quirks=True sets all of the above
# =================================================================================================
@pytest.mark.parametrize("task_name", ["distance", "count"])
@pytest.mark.parametrize("their_name", ["nope", "absolute", "random", "relative", "alibi", "rope"])
def test_build_run_configs_authors_quirks(their_name, task_name):
    """``build_run_configs(..., authors_quirks=True)`` gives the authors' model fields and data
    switches, and the model it configures computes the restated forward."""
    cfg, task, train_cfg = build_run_configs(
        task_name, AUTHORS_ENCODINGS[their_name], "smoke", 3, authors_quirks=True
    )
    expected = dict(
        act_fn="relu",
        final_norm=False,
        mask_padding=False,
        kv_source="embed",
        dropout=0.1,
        attn_dropout=0.1,
        embed_dropout=0.0,
        init_mode="torch",
        normalization_type="LN",
        pooling="mean",
        attention_dir="bidirectional",
    )
    assert {k: getattr(cfg, k) for k in expected} == expected
    assert cfg.encoding == ModelConfig(**SMALL, encoding=AUTHORS_ENCODINGS[their_name]).encoding
    if their_name not in ("nope", "rope"):  # their other names are accepted as they are
        by_name = build_run_configs(task_name, their_name, "smoke", 3, authors_quirks=True)[0]
        assert by_name.encoding == cfg.encoding
    if task_name == "distance":
        # data-gen.py: fillers may be the triggers, are distinct within a segment
        # (random.sample), and the generated set is deduplicated
        assert task.fillers_include_triggers and task.distinct_fillers and task.dedup
    else:
        # count_gen/data-gen.py: count 0 is generated (and ignored by the loss); no dedup
        assert (task.ignore_zero, task.dedup) == (False, False)
    assert train_cfg.betas == (0.98, 0.9)

    ours = HookedPETransformer(cfg).eval()
    theirs = AuthorsModel(authors_config_for(cfg, their_name)).eval()
    load_ours_into_theirs(ours, theirs)
    batch = task.sample(8, seed=1)
    if task_name == "distance":
        assert (batch.tokens == 0).any()  # the distance task pads
    mine, ref = ours(batch.tokens), theirs(batch.tokens, memory=batch.tokens)
    assert ref.abs().max() > 0.1
    torch.testing.assert_close(mine, ref, atol=ATOL, rtol=0)


def authors_lambda_lr(total_steps: int, warmup_frac: float, base_lr: float) -> list[float]:
    """The learning rate of each optimizer step under their ``get_cosine_schedule_with_warmup``
    (``LambdaLR``, stepped after every batch)."""
    warm = int(warmup_frac * total_steps)

    def factor(step: int) -> float:
        if step < warm:
            return step / max(1, warm)
        progress = (step - warm) / max(1, total_steps - warm)
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=base_lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
    lrs = []
    for _ in range(total_steps):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return lrs


def test_authors_train_settings():
    """The optimisation of ``trans.py`` (``train_model``, lines 364-379): AdamW lr 1e-4 at the
    paper size, weight decay 1e-5 on every parameter, betas (0.98, 0.9), no gradient clipping,
    ``CrossEntropyLoss(ignore_index=0)``, and the warm-up + cosine ``LambdaLR`` (starting from 0,
    ``int(0.06 * total)`` warm-up steps, cosine to 0)."""
    _, _, train_cfg = build_run_configs("distance", "nope", "smoke", 0, authors_quirks=True)
    assert train_cfg.betas == (0.98, 0.9)
    assert train_cfg.weight_decay == 1e-5
    assert train_cfg.grad_clip == 0
    assert train_cfg.lr_schedule == "authors"
    assert train_cfg.lr == 1e-4
    # Task 1: their labels are distances >= 2, so ignore_index=0 ignores nothing; our class 0 is
    # distance 2 and must be counted.
    assert train_cfg.ignore_index is None
    # Task 2: count 0 is generated, then left out of the loss and of accuracy.
    _, count_task, count_cfg = build_run_configs("count", "nope", "smoke", 0, authors_quirks=True)
    assert count_task.count_to_class(0) == 0 and count_cfg.ignore_index == 0
    _, _, paper = build_run_configs("distance", "nope", "paper", 0, authors_quirks=True)
    assert (paper.lr, paper.batch_size, paper.epochs, paper.warmup_frac) == (1e-4, 512, 100, 0.06)
    assert (paper.n_train, paper.n_test) == (70_000, 30_000)  # their 70/30 split of 100k
    for cfg in (train_cfg, dataclasses.replace(paper, n_train=5000, epochs=3)):
        expected = authors_lambda_lr(cfg.total_steps, cfg.warmup_frac, cfg.lr)
        got = [cfg.lr_at(s) for s in range(cfg.total_steps)]
        assert got == pytest.approx(expected, rel=1e-12, abs=1e-15)
