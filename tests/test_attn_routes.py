"""The attention route under CPU bf16 autocast (pe_interp.models.hooked.attn_routes): every route computes the
hooked path's function within bf16 tolerance (logits and gradients), the route is the fixed
default whatever the timings (issue 54), with ``fastest`` the choice is the measured fastest and
is remembered, the override works, and a resumed bf16 run uses the routes its checkpoint
recorded, which keeps it bit-identical to an uninterrupted one."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import ENCODINGS, TINY, smoke_trainer

from pe_interp import HookedPETransformer, ModelConfig
from pe_interp.models.hooked import attn_routes
from pe_interp.util import hardware

# bf16 keeps 8 bits of mantissa: logits of these tiny models (|logit| < 3) within 5e-2, as in
# test_fast_path; gradients within 5% of their scale (below).
LOGIT_ATOL = 5e-2
GRAD_RTOL = 5e-2


@pytest.fixture(autouse=True)
def _fresh_routes(monkeypatch):
    monkeypatch.setenv(hardware.ENV_OVERRIDE, "1")
    monkeypatch.delenv(attn_routes.OVERRIDE_ENV, raising=False)
    attn_routes.reset()
    yield
    attn_routes.reset()


def _batch(n: int = 5, n_pos: int = 10, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(1, TINY["d_vocab"], (n, n_pos), generator=gen)
    lengths = torch.tensor([10, 7, 4, 10, 6])[:n]
    tokens = tokens.masked_fill(torch.arange(n_pos)[None] >= lengths[:, None], 0)
    return tokens, torch.randint(0, TINY["n_classes"], (n,), generator=gen)


def _logits_and_grads(model, tokens, labels, amp: bool):
    model.zero_grad(set_to_none=True)
    with hardware.autocast("cpu", amp=amp):
        logits = model(tokens)
    F.cross_entropy(logits.float(), labels).backward()
    return logits.float().detach(), {
        n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None
    }


@pytest.mark.parametrize("encoding", ["rope", "t5", "alibi", "decoupled_rope", "sinusoidal+rope"])
@pytest.mark.parametrize("route", attn_routes.ROUTES)
def test_every_route_computes_the_hooked_paths_function(encoding, route):
    """Forced route in bf16 against the eager (hooked) path in fp32: logits and every gradient."""
    cfg = ModelConfig(
        **TINY, encoding=ENCODINGS.get(encoding, encoding), init_std=0.2, attn_backend="sdpa"
    )
    model = HookedPETransformer(cfg).train()
    reference = HookedPETransformer(cfg.replace(attn_backend="eager")).train()
    reference.load_state_dict(model.state_dict())
    tokens, labels = _batch()
    want, want_grads = _logits_and_grads(reference, tokens, labels, amp=False)
    with attn_routes.force(route):
        got, grads = _logits_and_grads(model, tokens, labels, amp=True)
    err = (got - want).abs().max().item()
    assert 0 < err <= LOGIT_ATOL  # really bf16 (not identical), and within its rounding
    assert grads.keys() == want_grads.keys()
    # relative to each parameter's largest gradient, floored at 1% of the model's largest (the
    # gradient of b_K is zero in exact arithmetic: softmax ignores a per-query constant)
    top = max(g.abs().max().item() for g in want_grads.values())
    for name, g in want_grads.items():
        scale = max(g.abs().max().item(), 1e-2 * top)
        assert (grads[name] - g).abs().max().item() <= GRAD_RTOL * scale, name


def test_by_default_the_route_is_fixed_whatever_the_timings(monkeypatch):
    """Timing each route made the weights depend on the machine's load (issue 54)."""
    monkeypatch.setattr(attn_routes, "_measure", lambda *a: pytest.fail("measured"))
    model = HookedPETransformer(ModelConfig(**TINY, encoding="rope", attn_backend="sdpa"))
    tokens, labels = _batch()
    _logits_and_grads(model, tokens, labels, amp=True)
    with torch.no_grad(), hardware.autocast("cpu", amp=True):
        model(tokens[:3])
    assert attn_routes.policy() == attn_routes.DEFAULT_ROUTE
    assert list(attn_routes.chosen().values()) == [attn_routes.DEFAULT_ROUTE] * 2


def test_the_route_is_measured_once_per_shape_and_is_the_fastest(monkeypatch):
    monkeypatch.setenv(attn_routes.OVERRIDE_ENV, attn_routes.MEASURE)
    calls = []

    def fake_measure(run, q, k, v, grad):
        calls.append(tuple(q.shape))
        return (
            {"math": 3.0, "sdpa": 2.0, "sdpa32": 1.0}
            if q.shape[0] == 5
            else {"math": 1.0, "sdpa": 2.0, "sdpa32": 3.0}
        )

    monkeypatch.setattr(attn_routes, "_measure", fake_measure)
    model = HookedPETransformer(ModelConfig(**TINY, encoding="rope", attn_backend="sdpa"))
    tokens, labels = _batch()
    for _ in range(2):
        _logits_and_grads(model, tokens, labels, amp=True)
    with torch.no_grad(), hardware.autocast("cpu", amp=True):
        model(tokens[:3])
    chosen = attn_routes.chosen()
    # one training shape (every layer shares it) and one inference shape, each measured once
    assert len(calls) == 2 and len(chosen) == 2
    assert sorted(chosen.values()) == ["math", "sdpa32"]
    assert any("grad1" in k and v == "sdpa32" for k, v in chosen.items())
    assert any("grad0" in k and v == "math" for k, v in chosen.items())


def test_real_measurement_times_every_route_without_touching_state(monkeypatch):
    """The measurement itself: one timing per route, the minimum chosen, no RNG or grad touched."""
    monkeypatch.setenv(attn_routes.OVERRIDE_ENV, attn_routes.MEASURE)
    model = HookedPETransformer(ModelConfig(**TINY, encoding="t5", attn_backend="sdpa"))
    tokens, labels = _batch()
    rng = torch.get_rng_state()
    with hardware.autocast("cpu", amp=True):
        model(tokens)
    assert torch.equal(rng, torch.get_rng_state())
    assert all(p.grad is None for p in model.parameters())  # the T5 table's bias was detached
    ((key, seconds),) = attn_routes.timings().items()
    assert set(seconds) == set(attn_routes.ROUTES) and all(s > 0 for s in seconds.values())
    assert attn_routes.chosen()[key] == min(seconds, key=seconds.get)


def test_override_and_bad_override(monkeypatch):
    model = HookedPETransformer(ModelConfig(**TINY, encoding="rope", attn_backend="sdpa"))
    tokens, labels = _batch()
    monkeypatch.setattr(
        attn_routes, "_measure", lambda *a: pytest.fail("an override must not measure")
    )
    monkeypatch.setenv(attn_routes.OVERRIDE_ENV, "math")
    seen = []
    monkeypatch.setattr(
        type(model.blocks[0].attn),
        "_eager",
        lambda self, *a: (
            seen.append(1) or torch.zeros(a[0].shape[:3] + a[2].shape[-1:], dtype=a[2].dtype)
        ),
    )
    with torch.no_grad(), hardware.autocast("cpu", amp=True):
        model(tokens)
    assert len(seen) == TINY["n_layers"]
    monkeypatch.setenv(attn_routes.OVERRIDE_ENV, "flash")
    with (
        pytest.raises(
            ValueError,
            match="PE_INTERP_ATTN_ROUTE must be one of math, sdpa, sdpa32, fastest, got 'flash'",
        ),
        torch.no_grad(),
        hardware.autocast("cpu", amp=True),
    ):
        model(tokens)
    with pytest.raises(ValueError, match="route must be one of"), attn_routes.force("fast"):
        pass
    with pytest.raises(ValueError, match="must be one of"):
        attn_routes.pin({"k": "fast"})


def test_fp32_and_hooked_layers_do_not_consult_the_chooser(monkeypatch):
    monkeypatch.setattr(attn_routes, "choose", lambda *a, **k: pytest.fail("consulted"))
    model = HookedPETransformer(ModelConfig(**TINY, encoding="rope", attn_backend="sdpa"))
    tokens, _ = _batch()
    with torch.no_grad():
        model(tokens)  # fp32: SDPA as before
        with hardware.autocast("cpu", amp=True):
            _, cache = model.run_with_cache(tokens)  # patterns cached: the eager path, every layer
    assert cache["blocks.0.attn.hook_pattern"].shape[-1] == tokens.shape[1]


def test_resumed_bf16_run_uses_the_routes_of_its_checkpoint(tmp_path, monkeypatch):
    """A fresh process would measure again and might choose otherwise; the resumed run pins the
    checkpoint's choices and ends bit-identical to the uninterrupted run."""
    monkeypatch.setenv(attn_routes.OVERRIDE_ENV, attn_routes.MEASURE)
    run = smoke_trainer(crash_at=5)

    first = {"math": 1.0, "sdpa": 2.0, "sdpa32": 3.0}
    monkeypatch.setattr(attn_routes, "_measure", lambda *a: first)
    ref = run(tmp_path / "ref")
    attn_routes.reset()
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path / "killed", crash=True)
    recorded = attn_routes.chosen()
    assert set(recorded.values()) == {"math"}
    # "a new process", whose measurement would now prefer another route
    attn_routes.reset()
    monkeypatch.setattr(
        attn_routes, "_measure", lambda *a: {"math": 3.0, "sdpa": 2.0, "sdpa32": 1.0}
    )
    resumed = run(tmp_path / "killed", resume=True)
    assert all(recorded[k] == v for k, v in attn_routes.chosen().items() if k in recorded)
    assert all(torch.equal(ref[k], resumed[k]) for k in ref)
    # the control: the other route really gives other weights, so the pin is what kept them equal
    attn_routes.reset()
    other = run(tmp_path / "other")
    assert any(not torch.equal(ref[k], other[k]) for k in ref)


def test_forced_bf16_on_emulating_hardware_warns_once(monkeypatch):
    monkeypatch.setattr(hardware, "cpu_flags", lambda: frozenset({"avx2", "fma"}))
    hardware._warn_emulated.cache_clear()
    with pytest.warns(RuntimeWarning, match="bf16 is emulated there"):
        assert hardware.cpu_has_bf16()  # forced by the fixture's PE_INTERP_CPU_BF16=1
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert hardware.cpu_has_bf16()  # once per process
    monkeypatch.setattr(hardware, "cpu_flags", lambda: frozenset({"avx512_bf16"}))
    hardware._warn_emulated.cache_clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert hardware.cpu_has_bf16()  # native: nothing to say
