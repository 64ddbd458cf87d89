"""ModelConfig: valid configurations construct and derive their defaults; every invalid field
raises a ValueError whose message names the field as ``ModelConfig.<field>``."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pe_interp import EncodingSpec, ModelConfig, available_encodings
from pe_interp.encodings import RoPE

BASE = dict(n_layers=2, d_model=16, n_heads=2, d_mlp=32, n_ctx=12, d_vocab=20, n_classes=5)
HYP = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def build(**changes) -> ModelConfig:
    return ModelConfig(**{**BASE, **changes})


def assert_rejected(field: str, **changes) -> None:
    with pytest.raises(ValueError) as info:
        build(**changes)
    assert f"ModelConfig.{field}" in str(info.value), str(info.value)


# ---- valid configurations -----------------------------------------------------------------------
@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"d_mlp": 0},
        {"d_mlp": None},
        {"d_head": 4},
        {"n_heads": 3, "d_head": 5, "encoding": "nope"},
        {"normalization_type": None},
        {"normalization_type": "RMS", "act_fn": "silu", "final_norm": False},
        {"attention_dir": "causal", "pooling": "last", "attn_backend": "sdpa"},
        {"pooling": "first", "attn_backend": "eager", "kv_source": "embed"},
        {"dropout": 0.0, "attn_dropout": 0.999, "init_std": 10.0, "eps": 0.0},
        {"mask_padding": False, "pad_id": 19, "seed": 0},
        {"attn_backend": "triton", "encoding": "rope"},
        {"encoding": "sinusoidal+rope"},
        {"encoding": ["sinusoidal", {"name": "alibi", "slopes": "authors"}]},
        {"encoding": {"name": "rope", "rotary_dim": 2, "heads": [1]}},
        {"encoding": {"name": "t5", "buckets": 4, "max_distance": 2}},
        {"encoding": {"name": "decoupled_rope", "d_rope": 2}},
        {"encoding": RoPE.spec(base=500.0)},
        {"encoding": RoPE},
        {"device": "cuda:1"},
    ],
)
def test_valid_configs_construct(changes):
    cfg = build(**changes)
    assert isinstance(cfg.encoding, tuple) and all(
        isinstance(s, EncodingSpec) for s in cfg.encoding
    )
    assert isinstance(cfg.d_head, int) and isinstance(cfg.d_mlp, int)


def test_derived_defaults():
    cfg = ModelConfig(d_model=48, n_heads=6)
    assert cfg.d_head == 8 and cfg.d_mlp == 192
    assert cfg.n_key_value_heads is None
    assert build(d_head=3, n_heads=5, encoding="nope").d_head == 3


def test_encoding_normalised_to_specs():
    cfg = build(encoding=" sinusoidal + rope ")
    assert cfg.encoding == (EncodingSpec("sinusoidal"), EncodingSpec("rope"))
    assert cfg.encoding_name == "sinusoidal+rope"
    # Default-valued parameters are dropped, so equal models have equal specs.
    assert build(encoding={"name": "rope", "base": 10000.0}).encoding == (EncodingSpec("rope"),)
    spec = build(encoding={"name": "rope", "base": 500, "heads": [0, 1]}).encoding[0]
    assert spec.kwargs == {"base": 500, "heads": (0, 1)}
    assert str(spec) == "rope(base=500,heads=(0, 1))"
    assert RoPE.spec(base=500).to_json() == {"name": "rope", "base": 500}


@pytest.mark.parametrize(
    "encoding, kind",
    [
        ("nope", "none"),
        ("sinusoidal", "additive"),
        ("learned", "additive"),
        ("t5", "additive"),
        ("alibi", "additive"),
        ("rope", "multiplicative"),
        ("decoupled_rope", "hybrid"),
        ("sinusoidal+rope", "hybrid"),
        ("sinusoidal+alibi", "additive"),
    ],
)
def test_encoding_kind(encoding, kind):
    assert build(encoding=encoding).encoding_kind == kind


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"encoding": [{"name": "rope", "heads": (0,), "rotary_dim": 4}, "sinusoidal"]},
        {
            "encoding": {"name": "alibi", "slopes": "authors"},
            "d_mlp": 0,
            "normalization_type": None,
        },
    ],
)
def test_dict_round_trip_through_json(changes):
    cfg = build(**changes)
    again = ModelConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert again == cfg
    with pytest.raises(ValueError, match="unknown field"):
        ModelConfig.from_dict({**cfg.to_dict(), "n_layer": 3})


def test_replace_keeps_derived_sizes_consistent():
    cfg = build()  # d_head 8, d_mlp 32 (explicit)
    wider = cfg.replace(d_model=32)
    assert wider.d_head == 16 and wider.d_mlp == 32
    default_mlp = ModelConfig(d_model=16, n_heads=2)
    assert default_mlp.replace(d_model=32).d_mlp == 128
    assert cfg.replace(n_heads=4).d_head == 4
    assert_rejected("d_head", n_heads=3)


# ---- invalid fields -----------------------------------------------------------------------------
def not_an_int() -> st.SearchStrategy:
    return st.one_of(
        st.floats(allow_nan=True), st.text(max_size=3), st.booleans(), st.just([1]), st.just(2.0)
    )


def bad_int(low: int, none_ok: bool = False) -> st.SearchStrategy:
    values = st.one_of(st.integers(max_value=low - 1), not_an_int())
    return values if none_ok else st.one_of(values, st.none())


def bad_choice(allowed: tuple) -> st.SearchStrategy:
    return st.one_of(st.text(max_size=8), st.integers(), st.floats(), st.none()).filter(
        lambda v: not any(v is a or (isinstance(v, str) and v == a) for a in allowed)
    )


def bad_float(low: float, high: float, high_open: bool) -> st.SearchStrategy:
    above = st.floats(min_value=high, exclude_min=not high_open)
    return st.one_of(
        st.floats(max_value=low, exclude_max=True),
        above,
        st.just(math.nan),
        st.just(math.inf),
        st.text(max_size=3),
        st.booleans(),
        st.none(),
    )


def bad_bool() -> st.SearchStrategy:
    # 0 and 1 compare equal to False/True; they have their own test below.
    return st.one_of(st.text(max_size=4), st.integers(min_value=2), st.none(), st.just([True]))


INVALID = {
    "n_layers": bad_int(1),
    "d_model": bad_int(1),
    "n_heads": bad_int(1),
    "n_ctx": bad_int(1),
    "d_vocab": bad_int(1),
    "n_classes": bad_int(2),
    "d_head": bad_int(1, none_ok=True),
    "d_mlp": bad_int(0, none_ok=True),
    "seed": bad_int(0),
    "pad_id": st.one_of(bad_int(0), st.integers(min_value=BASE["d_vocab"])),
    "act_fn": bad_choice(("relu", "gelu", "silu")),
    "normalization_type": bad_choice(("LN", "RMS", None)),
    "attention_dir": bad_choice(("bidirectional", "causal")),
    "pooling": bad_choice(("mean", "first", "last")),
    "attn_backend": bad_choice(("auto", "eager", "sdpa", "triton")),
    "kv_source": bad_choice(("residual", "embed")),
    "final_norm": bad_bool(),
    "mask_padding": bad_bool(),
    "dropout": bad_float(0.0, 1.0, high_open=True),
    "attn_dropout": bad_float(0.0, 1.0, high_open=True),
    "init_std": bad_float(1e-6, 10.0, high_open=False),
    "init_mode": bad_choice(("normal", "torch")),
    "embed_dropout": bad_float(0.0, 1.0, high_open=True).filter(lambda v: v is not None),
    "use_attn_result": bad_bool(),
    "use_split_qkv_input": bad_bool(),
    "use_attn_in": bad_bool(),
    "use_hook_mlp_in": bad_bool(),
    "eps": bad_float(0.0, 1.0, high_open=False),
    "silent_heads": st.one_of(
        st.integers(), st.sampled_from([[(99, 0)], [(0, 0), (0, 0)], ["a:b"], [(0,)], [(0, -1)]])
    ),
    "arch": st.one_of(st.integers(), st.sampled_from(["gpt3", "", "GPT2", "neox"])),
    "device": st.one_of(
        st.text(max_size=6).filter(lambda s: s.split(":")[0] not in ("cpu", "cuda", "mps")),
        st.integers(),
        st.none(),
    ),
}


@pytest.mark.parametrize("field", list(INVALID))
@HYP
@given(data=st.data())
def test_invalid_field_raises_value_error_naming_it(field, data):
    value = data.draw(INVALID[field], label=field)
    assert_rejected(field, **{field: value})


def test_every_field_has_an_invalid_strategy():
    import dataclasses

    fields = {f.name for f in dataclasses.fields(ModelConfig)} - {"encoding"}
    assert fields == set(INVALID)


def test_d_model_not_divisible_by_heads():
    assert_rejected("d_head", d_model=16, n_heads=3)


def test_triton_without_attention_dropout():
    assert_rejected("attn_dropout", attn_backend="triton", attn_dropout=0.1)


@pytest.mark.parametrize("field", ["final_norm", "mask_padding"])
@pytest.mark.parametrize("value", [1, 0, 1.0])
def test_bool_fields_reject_numbers(field, value):
    """Regression (fixed): ``check_choice(own, "final_norm", v, (True, False))`` used ``in``, and
    ``1 == True``, so 1, 0 and 1.0 passed validation and were stored (and serialised) as numbers."""
    assert_rejected(field, **{field: value})


# ---- the encoding field -------------------------------------------------------------------------
KNOWN = set(available_encodings())
unknown_name = st.text(
    alphabet=st.characters(min_codepoint=33, max_codepoint=126, blacklist_characters="+"),
    min_size=1,
    max_size=10,
).filter(lambda s: s.strip() not in KNOWN)

# Parameters each encoding must reject, for the tiny config (d_head 8, 2 heads, n_ctx 12).
BAD_PARAMS = {
    "rope": st.one_of(
        st.fixed_dictionaries({"rotary_dim": st.integers(1, 8).filter(lambda d: d % 2)}),
        st.fixed_dictionaries({"rotary_dim": st.integers(min_value=9)}),
        st.fixed_dictionaries({"rotary_dim": st.integers(max_value=0)}),
        st.fixed_dictionaries(
            {"heads": st.lists(st.integers(min_value=2), min_size=1, max_size=3)}
        ),
        st.fixed_dictionaries(
            {"heads": st.lists(st.integers(max_value=-1), min_size=1, max_size=3)}
        ),
        st.fixed_dictionaries({"heads": st.just([])}),
        st.fixed_dictionaries({"base": st.floats(max_value=1.0)}),
    ),
    "t5": st.one_of(
        st.fixed_dictionaries({"buckets": st.integers(max_value=3)}),
        st.fixed_dictionaries({"buckets": st.integers(4, 1000).filter(lambda b: b % 2)}),
        st.integers(2, 100).map(lambda b: {"buckets": 2 * b, "max_distance": b // 2}),
    ),
    "alibi": st.fixed_dictionaries(
        {"slopes": st.text(max_size=10).filter(lambda s: s not in ("standard", "authors"))}
    ),
    "decoupled_rope": st.one_of(
        st.fixed_dictionaries({"d_rope": st.integers(max_value=0)}),
        st.fixed_dictionaries({"d_rope": st.integers(min_value=1).filter(lambda d: d % 2)}),
    ),
    "sinusoidal": st.fixed_dictionaries(
        {"layout": st.text(max_size=10).filter(lambda s: s not in ("interleaved", "concat"))}
    ),
}


@HYP
@given(name=unknown_name)
def test_unknown_encoding_name(name):
    assert_rejected("encoding", encoding=name)
    assert_rejected("encoding", encoding=f"sinusoidal+{name}")
    assert_rejected("encoding", encoding={"name": name})


@pytest.mark.parametrize("name", list(BAD_PARAMS))
@HYP
@given(data=st.data())
def test_bad_encoding_parameters(name, data):
    params = data.draw(BAD_PARAMS[name], label="params")
    assert_rejected("encoding", encoding={"name": name, **params})
    assert_rejected("encoding", encoding=["nope", {"name": name, **params}])


@pytest.mark.parametrize(
    "name", ["nope", "sinusoidal", "learned", "t5", "alibi", "rope", "decoupled_rope"]
)
@HYP
@given(param=st.text(min_size=1, max_size=12))
def test_unknown_encoding_parameter(name, param):
    from pe_interp.encodings import get_encoding_class
    from pe_interp.encodings.spec import _hyperparameters

    if param in _hyperparameters(get_encoding_class(name)):
        return
    assert_rejected("encoding", encoding={"name": name, param: 1})


@pytest.mark.parametrize(
    "encoding",
    [
        None,
        5,
        2.5,
        [],
        "",
        "+",
        "rope+",
        "+rope",
        "rope++nope",
        {"rotary_dim": 4},
        ["rope", 7],
        "decoupled_rope+decoupled_rope",
    ],
    ids=repr,
)
def test_malformed_encoding_values(encoding):
    assert_rejected("encoding", encoding=encoding)


def test_sinusoidal_needs_even_d_model():
    assert_rejected("encoding", d_model=15, n_heads=3, encoding="sinusoidal")


@pytest.mark.parametrize(
    "params",
    [
        # wrong types: these currently leak a TypeError (or IndexError) from the constructor
        {"name": "rope", "rotary_dim": "8"},
        {"name": "rope", "base": "x"},
        {"name": "rope", "heads": 1},
        {"name": "rope", "heads": "0"},
        {"name": "rope", "heads": [True]},
        {"name": "t5", "buckets": "8"},
        {"name": "t5", "buckets": 8.0},
        {"name": "t5", "buckets": [8]},
        {"name": "t5", "buckets": 8, "max_distance": "x"},
        {"name": "decoupled_rope", "d_rope": "8"},
        {"name": "decoupled_rope", "d_rope": 4.0},
        {"name": "sinusoidal", "base": "x"},
        # wrong values that are silently accepted and give NaN tables or a wrong head mask
        {"name": "rope", "base": math.nan},
        {"name": "rope", "heads": [0.5]},
        {"name": "sinusoidal", "base": -1.0},
        {"name": "decoupled_rope", "base": 0.5},
    ],
    ids=lambda p: ",".join(f"{k}={v!r}" for k, v in p.items()),
)
def test_encoding_parameters_of_wrong_type_or_value(params):
    """Regression (fixed): encoding constructors compared/iterated parameters without type checks,
    so a wrong type escaped ``ModelConfig`` as TypeError, and NaN/negative bases were accepted."""
    assert_rejected("encoding", encoding=params)
