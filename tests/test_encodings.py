"""Positional encodings against formulas written independently here: sinusoidal closed form,
ALiBi slopes (Press et al.'s recipe) and T5 biases/buckets (a scalar re-implementation), the
pinned adjacent-pair RoPE layout, RoPE's translation invariance, kinds, and an encoding
registered from outside the package that trains."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pe_interp import HookedPETransformer, ModelConfig, available_encodings, register_encoding
from pe_interp.encodings import Encoding, alibi_slopes, sinusoidal_table, t5_buckets


def assert_toeplitz(m: torch.Tensor, atol: float = 0.0) -> None:
    """Every ``[..., q, k]`` slice is constant along its diagonals (a function of k - q)."""
    n_q, n_k = m.shape[-2:]
    for off in range(-(n_q - 1), n_k):
        diag = torch.diagonal(m, offset=off, dim1=-2, dim2=-1)
        spread = (diag - diag[..., :1]).abs().max().item()
        assert spread <= atol, f"offset {off}: spread {spread}"


def toeplitz_defect(m: torch.Tensor) -> float:
    n_q, n_k = m.shape[-2:]
    worst = 0.0
    for off in range(-(n_q - 1), n_k):
        diag = torch.diagonal(m, offset=off, dim1=-2, dim2=-1)
        worst = max(worst, (diag - diag[..., :1]).abs().max().item())
    return worst


# ---- kinds --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "encoding, kind",
    [
        ("nope", "none"),
        ("sinusoidal", "additive"),
        ("learned", "additive"),
        ("t5", "additive"),
        ({"name": "t5", "buckets": 8}, "additive"),
        ("alibi", "additive"),
        ("rope", "multiplicative"),
        ({"name": "rope", "heads": (0,)}, "multiplicative"),
        ("decoupled_rope", "hybrid"),
        ("sinusoidal+rope", "hybrid"),
    ],
)
def test_kind_of_built_encoding(make_model, encoding, kind):
    model = make_model(encoding=encoding)
    assert model.encoding.kind == kind
    assert model.cfg.encoding_kind == kind


def test_capabilities(make_model):
    flags = lambda enc: (enc.rotates, enc.has_bias, enc.residual(3) is not None)  # noqa: E731
    assert flags(make_model(encoding="nope").encoding) == (False, False, False)
    assert flags(make_model(encoding="learned").encoding) == (False, False, True)
    assert flags(make_model(encoding="t5").encoding) == (False, True, False)
    assert flags(make_model(encoding="rope").encoding) == (True, False, False)
    assert flags(make_model(encoding="decoupled_rope").encoding) == (True, False, False)
    assert flags(make_model(encoding="sinusoidal+alibi").encoding) == (False, True, True)
    assert make_model(encoding="decoupled_rope").encoding.extra_qk_dims() == 8


# ---- sinusoidal ---------------------------------------------------------------------------------
def closed_form_sinusoidal(n_pos: int, d: int, concat: bool = False) -> torch.Tensor:
    pe = torch.zeros(n_pos, d, dtype=torch.float64)
    for p in range(n_pos):
        for i in range(d // 2):
            angle = p / 10000 ** (2 * i / d)
            if concat:
                pe[p, i], pe[p, d // 2 + i] = math.sin(angle), math.cos(angle)
            else:
                pe[p, 2 * i], pe[p, 2 * i + 1] = math.sin(angle), math.cos(angle)
    return pe


@pytest.mark.parametrize("layout", ["interleaved", "concat"])
def test_sinusoidal_closed_form(make_model, tokens_fn, layout):
    d, n = 16, 12
    expected = closed_form_sinusoidal(n, d, concat=layout == "concat").float()
    torch.testing.assert_close(sinusoidal_table(n, d, layout=layout), expected, atol=1e-6, rtol=0)
    model = make_model(encoding={"name": "sinusoidal", "layout": layout}, d_model=d, n_ctx=n)
    torch.testing.assert_close(model.encoding.residual(7), expected[:7], atol=1e-6, rtol=0)
    tokens = tokens_fn(2, 9)
    _, cache = model.run_with_cache(tokens)
    torch.testing.assert_close(
        cache["hook_pos_embed"], expected[:9].expand(2, 9, d), atol=1e-6, rtol=0
    )
    torch.testing.assert_close(
        cache["blocks.0.hook_resid_pre"], model.W_E[tokens] + expected[:9], atol=1e-6, rtol=0
    )


def test_learned_positions_are_a_parameter(make_model):
    model = make_model(encoding="learned")
    assert model.encoding.residual(5) is not None
    torch.testing.assert_close(model.encoding.residual(5), model.encoding.W_pos[:5])
    assert model.encoding.W_pos.requires_grad and model.encoding.W_pos.std() > 0


# ---- ALiBi --------------------------------------------------------------------------------------
def press_slopes(n: int) -> list[float]:
    """The reference recipe from Press et al.'s repository (attention_with_linear_biases)."""

    def power_of_2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(n).is_integer():
        return power_of_2(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_2(closest) + press_slopes(2 * closest)[0::2][: n - closest]


def test_alibi_slopes_formulas():
    assert press_slopes(8) == pytest.approx([2 ** (-8 * h / 8) for h in range(1, 9)], abs=0)
    for n in (1, 2, 3, 4, 5, 6, 7, 8, 12, 16):
        torch.testing.assert_close(
            alibi_slopes(n), torch.tensor(press_slopes(n), dtype=torch.float32), rtol=1e-7, atol=0
        )
    six = [2**-2, 2**-4, 2**-6, 2**-8, 2**-1, 2**-3]  # 4 from n=4, then every other one of n=8
    assert press_slopes(6) == six
    for n in (4, 6, 8):
        expected = [math.exp(-h / n) for h in range(n)]
        torch.testing.assert_close(
            alibi_slopes(n, "authors"), torch.tensor(expected), rtol=1e-7, atol=0
        )


@pytest.mark.parametrize(
    "n_heads, slopes",
    [(8, "standard"), (6, "standard"), (8, "authors"), (6, "authors")],
)
def test_alibi_bias_matrix(make_model, tokens_fn, n_heads, slopes):
    model = make_model(
        encoding={"name": "alibi", "slopes": slopes},
        d_model=8 * n_heads,
        n_heads=n_heads,
        n_layers=1,
    )
    if slopes == "authors":
        m = [math.exp(-h / n_heads) for h in range(n_heads)]
    else:
        m = press_slopes(n_heads)
        if n_heads == 8:
            m = [2 ** (-8 * h / 8) for h in range(1, 9)]
    n = 10
    expected = torch.tensor(
        [[[-m[h] * abs(i - j) for j in range(n)] for i in range(n)] for h in range(n_heads)]
    )
    bias = model.encoding.bias(n, n, 0)
    assert bias.shape == (n_heads, n, n)
    assert_toeplitz(bias)
    torch.testing.assert_close(bias, expected, rtol=1e-6, atol=1e-6)
    tokens = tokens_fn(2, n, d_vocab=model.cfg.d_vocab)
    _, cache = model.run_with_cache(tokens)
    torch.testing.assert_close(cache["blocks.0.attn.hook_pos_bias"], expected, rtol=1e-6, atol=1e-6)
    # The bias really is in the logits: scores = q.k / sqrt(d) + bias.
    q, k = cache["blocks.0.attn.hook_q"], cache["blocks.0.attn.hook_k"]
    content = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(model.cfg.d_head)
    torch.testing.assert_close(
        cache["blocks.0.attn.hook_attn_scores"], content + expected, atol=1e-5, rtol=0
    )


# ---- T5 -----------------------------------------------------------------------------------------
def t5_bucket_scalar(rel: int, num_buckets: int, max_distance: int) -> int:
    """Raffel et al.'s bidirectional ``_relative_position_bucket`` for one offset ``rel = k - q``."""
    n = num_buckets // 2
    out = n if rel > 0 else 0
    d = abs(rel)
    max_exact = n // 2
    if d < max_exact:
        return out + d
    large = max_exact + int(
        math.log(d / max_exact) / math.log(max_distance / max_exact) * (n - max_exact)
    )
    return out + min(large, n - 1)


@pytest.mark.parametrize(
    "num_buckets, max_distance", [(8, 128), (32, 128), (16, 20), (4, 5), (6, 7)]
)
def test_t5_bucket_function(num_buckets, max_distance):
    rel = torch.arange(-200, 201)
    expected = [t5_bucket_scalar(r, num_buckets, max_distance) for r in rel.tolist()]
    assert t5_buckets(rel, num_buckets, max_distance).tolist() == expected
    assert min(expected) == 0 and max(expected) == num_buckets - 1


def test_t5_full_table(make_model, tokens_fn):
    model = make_model(encoding="t5", n_heads=3, d_model=24, n_ctx=12)
    table = model.encoding.rel_bias
    assert table.shape == (2, 3, 2 * 12 - 1)
    with torch.no_grad():
        table.copy_(torch.randn(table.shape))  # distinct values everywhere
    for n_q, n_k in [(12, 12), (5, 5), (3, 7)]:
        for layer in range(2):
            bias = model.encoding.bias(n_q, n_k, layer)
            expected = torch.tensor(
                [
                    [
                        [table[layer, h, (j - i) + 12 - 1].item() for j in range(n_k)]
                        for i in range(n_q)
                    ]
                    for h in range(3)
                ]
            )
            assert_toeplitz(bias)
            assert torch.equal(bias, expected)
    _, cache = model.run_with_cache(tokens_fn(2, 9))
    for layer in range(2):
        assert torch.equal(
            cache[f"blocks.{layer}.attn.hook_pos_bias"], model.encoding.bias(9, 9, layer)
        )
    assert not torch.equal(model.encoding.bias(9, 9, 0), model.encoding.bias(9, 9, 1))


@pytest.mark.parametrize("buckets, max_distance", [(8, 128), (8, 5), (4, 3)])
def test_t5_bucketed_table(make_model, buckets, max_distance):
    model = make_model(encoding={"name": "t5", "buckets": buckets, "max_distance": max_distance})
    table = model.encoding.rel_bias
    assert table.shape == (2, 2, buckets)
    with torch.no_grad():
        table.copy_(torch.randn(table.shape))
    n = 12
    for layer in range(2):
        bias = model.encoding.bias(n, n, layer)
        expected = torch.tensor(
            [
                [
                    [
                        table[layer, h, t5_bucket_scalar(j - i, buckets, max_distance)].item()
                        for j in range(n)
                    ]
                    for i in range(n)
                ]
                for h in range(2)
            ]
        )
        assert_toeplitz(bias)
        assert torch.equal(bias, expected)


# ---- RoPE ---------------------------------------------------------------------------------------
def rotate_reference(
    x: torch.Tensor, dims: int, base: float = 10000.0, start: int = 0
) -> torch.Tensor:
    """Adjacent pairs (2i, 2i+1) of dims [start, start+dims) rotated by pos * base^(-2i/dims)."""
    out = x.clone().double()
    for p in range(x.shape[1]):
        for i in range(dims // 2):
            theta = p * base ** (-2 * i / dims)
            a, b = x[:, p, :, start + 2 * i].double(), x[:, p, :, start + 2 * i + 1].double()
            out[:, p, :, start + 2 * i] = a * math.cos(theta) - b * math.sin(theta)
            out[:, p, :, start + 2 * i + 1] = a * math.sin(theta) + b * math.cos(theta)
    return out.float()


@pytest.mark.parametrize(
    "encoding, dims, heads",
    [
        ("rope", 8, (0, 1)),
        ({"name": "rope", "rotary_dim": 4}, 4, (0, 1)),
        ({"name": "rope", "heads": (1,)}, 8, (1,)),
        ({"name": "rope", "base": 100.0, "rotary_dim": 6, "heads": [0]}, 6, (0,)),
    ],
)
def test_rope_layout_is_adjacent_pairs(make_model, tokens_fn, encoding, dims, heads):
    model = make_model(encoding=encoding, init_std=0.3)
    base = model.encoding.base
    _, cache = model.run_with_cache(tokens_fn(2, 10))
    for name in ("q", "k"):
        raw, rot = cache[f"blocks.1.attn.hook_{name}"], cache[f"blocks.1.attn.hook_rot_{name}"]
        expected = rotate_reference(raw, dims, base)
        for h in range(2):
            want = expected[:, :, h] if h in heads else raw[:, :, h]
            torch.testing.assert_close(rot[:, :, h], want, atol=1e-5, rtol=1e-5)


def test_decoupled_rope_layout(make_model, tokens_fn):
    model = make_model(encoding={"name": "decoupled_rope", "d_rope": 4}, init_std=0.3)
    enc = model.encoding
    tokens = tokens_fn(2, 10)
    _, cache = model.run_with_cache(tokens)
    for layer in range(2):
        a = f"blocks.{layer}.attn."
        q, k = cache[a + "hook_q"], cache[a + "hook_k"]
        rq, rk = cache[a + "hook_rot_q"], cache[a + "hook_rot_k"]
        assert rq.shape == (2, 10, 2, 12) and rk.shape == (2, 10, 2, 12)
        torch.testing.assert_close(rq[..., :8], q)  # content part untouched
        torch.testing.assert_close(rk[..., :8], k)
        x = cache[f"blocks.{layer}.ln1.hook_normalized"]
        q_r = torch.einsum("bpm,mhr->bphr", x, enc.W_QR[layer])
        k_r = (x @ enc.W_KR[layer])[:, :, None, :].expand(-1, -1, 2, -1)
        torch.testing.assert_close(rq[..., 8:], rotate_reference(q_r, 4), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(rk[..., 8:], rotate_reference(k_r, 4), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(rk[:, :, 0, 8:], rk[:, :, 1, 8:])  # one key part for all heads
        scores = torch.einsum("bqhd,bkhd->bhqk", rq, rk) / math.sqrt(8 + 4)
        torch.testing.assert_close(cache[a + "hook_attn_scores"], scores, atol=1e-5, rtol=1e-5)


TRANSLATION_INVARIANT = {
    "rope": "rope",
    "rope-dim4": {"name": "rope", "rotary_dim": 4},
    "rope-head0": {"name": "rope", "heads": (0,)},
    "decoupled_rope": "decoupled_rope",
    "alibi": "alibi",
    "t5-buckets8": {"name": "t5", "buckets": 8},
    "nope": "nope",
}


@pytest.mark.parametrize(
    "encoding", list(TRANSLATION_INVARIANT.values()), ids=list(TRANSLATION_INVARIANT)
)
@pytest.mark.parametrize("token", [3, 17])
def test_scores_of_constant_input_depend_only_on_offset(make_model, encoding, token):
    """Same token everywhere, no residual PE: layer-0 scores are Toeplitz (RoPE is relative)."""
    model = make_model(encoding=encoding, init_std=0.5)
    tokens = torch.full((2, 12), token)
    _, cache = model.run_with_cache(tokens, names_filter=lambda n: n.startswith("blocks.0.attn"))
    scores = cache["blocks.0.attn.hook_attn_scores"]
    assert_toeplitz(scores, atol=1e-5)
    if encoding != "nope":  # and position does show: the scores are not all equal
        assert (scores - scores[..., :1, :1]).abs().max() > 1e-3


@pytest.mark.parametrize("encoding", ["sinusoidal", "learned", "sinusoidal+rope"])
def test_absolute_positions_break_translation_invariance(make_model, encoding):
    """The same check fails for absolute encodings, so it can fail."""
    model = make_model(encoding=encoding, init_std=0.5)
    _, cache = model.run_with_cache(torch.full((2, 12), 3))
    assert toeplitz_defect(cache["blocks.0.attn.hook_attn_scores"]) > 1e-2


def test_rope_relative_property_on_random_vectors():
    """q_m . k_n after rotation depends on m - n only, for arbitrary (non-constant) q and k."""
    cfg = ModelConfig(n_layers=1, d_model=16, n_heads=2, n_ctx=12, d_vocab=20, n_classes=2)
    enc = HookedPETransformer(cfg).encoding
    gen = torch.Generator().manual_seed(0)
    q0, k0 = torch.randn(1, 1, 2, 8, generator=gen), torch.randn(1, 1, 2, 8, generator=gen)
    q, k = enc.rotate(q0.expand(1, 12, 2, 8), k0.expand(1, 12, 2, 8), 0)
    assert_toeplitz(torch.einsum("bqhd,bkhd->bhqk", q, k), atol=1e-5)
    torch.testing.assert_close(q.norm(dim=-1), q0.norm(dim=-1).expand(1, 12, 2))  # a rotation


# ---- an encoding defined outside the package ----------------------------------------------------
@register_encoding("my_test_enc")
class LearnedDistancePenalty(Encoding):
    """A learned per-layer, per-head slope times -|i - j| (a trainable ALiBi)."""

    kind = "additive"

    def __init__(self, cfg, scale: float = 1.0):
        super().__init__(cfg)
        self.scale = scale
        self.slope = nn.Parameter(torch.empty(cfg.n_layers, cfg.n_heads))
        pos = torch.arange(cfg.n_ctx, dtype=torch.float32)
        self.register_buffer("distance", (pos[None, :] - pos[:, None]).abs(), persistent=False)

    def bias(self, n_q, n_k, layer):
        return -self.scale * self.slope[layer][:, None, None] * self.distance[:n_q, :n_k]


@pytest.mark.parametrize(
    "encoding", ["my_test_enc", "sinusoidal+my_test_enc", {"name": "my_test_enc", "scale": 2.0}]
)
def test_custom_encoding_trains(make_config, tokens_fn, encoding):
    assert "my_test_enc" in available_encodings()
    model = HookedPETransformer(make_config(encoding=encoding, init_std=0.3)).train()
    assert model.cfg.encoding_kind == "additive"
    slope = dict(model.named_parameters())[
        "encoding.slope" if encoding != "sinusoidal+my_test_enc" else "encoding.parts.1.slope"
    ]
    before = slope.detach().clone()
    assert before.abs().min() > 0  # initialised by the default init_parameters
    tokens = tokens_fn(8, 10, lengths=[10, 7, 4, 10, 9, 2, 10, 5])
    labels = torch.randint(0, 5, (8,), generator=torch.Generator().manual_seed(1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    logits, cache = model.run_with_cache(tokens)
    bias = model.encoding.bias(10, 10, 1)
    torch.testing.assert_close(cache["blocks.1.attn.hook_pos_bias"], bias)
    loss = F.cross_entropy(model(tokens), labels)
    assert torch.isfinite(loss)
    loss.backward()
    assert slope.grad is not None and slope.grad.abs().min() > 0
    opt.step()
    assert not torch.equal(slope.detach(), before)
    assert torch.isfinite(F.cross_entropy(model(tokens), labels))


def test_custom_encoding_agrees_across_backends(make_config, tokens_fn):
    tokens = tokens_fn(3, 10, lengths=[10, 6, 3])
    grads, outs = {}, {}
    for backend in ("eager", "sdpa"):
        model = HookedPETransformer(
            make_config(encoding="my_test_enc", attn_backend=backend, init_std=0.3)
        )
        outs[backend] = model(tokens)
        outs[backend].logsumexp(-1).sum().backward()
        grads[backend] = model.encoding.slope.grad
    torch.testing.assert_close(outs["eager"], outs["sdpa"], atol=1e-5, rtol=0)
    torch.testing.assert_close(grads["eager"], grads["sdpa"], atol=1e-5, rtol=0)


def test_custom_encoding_parameters_are_validated(make_config):
    with pytest.raises(ValueError, match="ModelConfig.encoding"):
        make_config(encoding={"name": "my_test_enc", "slope": 2.0})


def test_register_encoding_rejects_bad_input():
    with pytest.raises(TypeError):
        register_encoding("not_a_class")(object)
    for bad in ("", "a+b", "f(x)"):
        with pytest.raises(ValueError):
            register_encoding(bad)(type("E", (Encoding,), {}))
    with pytest.raises(ValueError):
        register_encoding("bad_kind")(type("E", (Encoding,), {"kind": "sideways"}))
    assert "bad_kind" not in available_encodings()


# ---- encoding specs written as strings (what --encoding takes) ------------------------------------
@pytest.mark.parametrize(
    "text, want",
    [
        (
            "sinusoidal(layout=concat)+rope(base=500)",
            [{"name": "sinusoidal", "layout": "concat"}, {"name": "rope", "base": 500}],
        ),
        ("rope(heads=(0, 1))", [{"name": "rope", "heads": [0, 1]}]),
        ("rope(heads=[0,1], rotary_dim=4)", [{"name": "rope", "heads": [0, 1], "rotary_dim": 4}]),
        ("alibi(slopes='authors')", [{"name": "alibi", "slopes": "authors"}]),
        (
            " t5( buckets = 8 ) + sinusoidal ",
            [{"name": "t5", "buckets": 8}, {"name": "sinusoidal"}],
        ),
        (
            "rope(base=1e+4)",
            [{"name": "rope"}],
        ),  # the default, dropped; '+' inside brackets does not split
        ('{"name": "alibi", "slopes": "authors"}', [{"name": "alibi", "slopes": "authors"}]),
        (
            '[{"name": "sinusoidal", "layout": "concat"}, "rope"]',
            [{"name": "sinusoidal", "layout": "concat"}, {"name": "rope"}],
        ),
        ("rope()", [{"name": "rope"}]),
    ],
)
def test_spec_strings_with_parameters(text, want):
    from pe_interp.encodings import parse_encoding

    assert [s.to_json() for s in parse_encoding(text)] == want
    assert ModelConfig(n_heads=4, d_model=32, encoding=text).encoding == parse_encoding(want)


def test_every_printed_spec_reads_back(make_config):
    """``str(spec)`` (what reports and ``encoding_name`` print) is itself an accepted spec string."""
    from conftest import ENCODINGS

    from pe_interp.encodings import parse_encoding

    for value in ENCODINGS.values():
        cfg = make_config(encoding=value)
        assert parse_encoding(cfg.encoding_name) == cfg.encoding, cfg.encoding_name


@pytest.mark.parametrize(
    "text, message",
    [
        ("rope(500)", "parameter '500' of 'rope' is not key=value"),
        ("rope(bse=5)", "unknown parameter 'bse'"),
        ("rope(base=5", "unbalanced brackets"),
        ("rope)", "unbalanced ')'"),
        ("rope(base=1, base=2)", "given twice"),
        ("rope+", "malformed composition"),
        ("{bad", "invalid JSON"),
        ("ropee(base=3)", "unknown name 'ropee'"),
        ("rope(base=abc)", "rope: base must be a finite number"),
    ],
)
def test_bad_spec_strings_say_what_is_wrong(text, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ModelConfig(n_heads=4, d_model=32, encoding=text)


def test_written_parameters_survive_the_authors_defaults():
    """authors_quirks gives a sinusoid next to RoPE the concat layout unless the user wrote one,
    also when it is written in a string, and also when it is the default value."""
    from pe_interp.config.presets import authors_encoding

    assert str(authors_encoding("sinusoidal+rope")[0]) == "sinusoidal(layout=concat)"
    assert str(authors_encoding("sinusoidal(layout=interleaved)+rope")[0]) == "sinusoidal"
    assert (
        str(authors_encoding('[{"name": "sinusoidal", "layout": "interleaved"}, "rope"]')[0])
        == "sinusoidal"
    )
