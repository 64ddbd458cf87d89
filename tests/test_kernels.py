"""Fused flash-attention kernel (pe_interp.kernels) against the float64 torch reference.

On CUDA the kernels run compiled on the GPU; without CUDA (or with PE_INTERP_TEST_DEVICE=cpu)
they run on CPU tensors under the Triton interpreter. The device is chosen, and TRITON_INTERPRET
set, in conftest.py: it has to be set before anything imports triton (see the note there), and
importing pe_interp can.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zlib

import pytest
import torch

from pe_interp.kernels import (
    RelBiasSpec,
    RopeSpec,
    fused_attention,
    rebuild_pattern,
    reference_attention,
    triton_available,
)
from pe_interp.kernels import flash as flash_mod
from pe_interp.kernels.reference import attention_logits

# conftest.py resolved PE_INTERP_TEST_DEVICE (auto | cpu | cuda) to cpu or cuda.
DEVICE = os.environ.get("PE_INTERP_TEST_DEVICE", "auto").strip().lower() or "auto"
if DEVICE == "auto":
    DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
needs_triton = pytest.mark.skipif(not triton_available(), reason="triton is not installed")

ENCODINGS = ["nope", "rope", "rope_partial", "rope_heads", "alibi", "t5", "alibi_t5", "decoupled"]


@pytest.fixture
def gen(request) -> torch.Generator:
    """Fresh, per-test reproducible randomness (seed = hash of the test id)."""
    g = torch.Generator().manual_seed(zlib.crc32(request.node.nodeid.encode()))
    return g


@pytest.fixture(autouse=True)
def _poison(monkeypatch):
    # Outputs and gradient buffers start as NaN, so any element a kernel fails to write shows.
    monkeypatch.setattr(flash_mod, "POISON_OUTPUTS", True)


def rope_tables(S: int, R: int, base: float = 100.0):
    pos = torch.arange(S, dtype=torch.float64)[:, None]
    inv = base ** (-torch.arange(0, R, 2, dtype=torch.float64) / R)
    ang = pos * inv
    return ang.cos().float(), ang.sin().float()


def make_encoding(name: str, gen: torch.Generator, H: int, S: int, Dqk: int) -> dict:
    """Encoding kwargs for fused_attention; the table (if any) is a float32 leaf with grad."""
    kw: dict = {}
    S_table = S + 3  # tables may be longer than the sequence
    if name == "rope":
        kw["rope"] = RopeSpec(*rope_tables(S_table, Dqk), start=0, dim=Dqk)
    elif name == "rope_partial":
        kw["rope"] = RopeSpec(*rope_tables(S_table, Dqk // 2), start=0, dim=Dqk // 2)
    elif name == "rope_heads":
        heads = torch.tensor([True, False, True][:H])
        kw["rope"] = RopeSpec(*rope_tables(S_table, Dqk), start=0, dim=Dqk, heads=heads)
    elif name == "decoupled":  # MLA-style: content dims [0, 16) plain, rope dims [16, 24)
        kw["rope"] = RopeSpec(*rope_tables(S_table, 8), start=16, dim=8)
    if name in ("alibi", "alibi_t5"):
        kw["alibi_slopes"] = torch.tensor([0.5, 0.25, 0.125][:H])
    if name in ("t5", "alibi_t5"):
        nb = 7
        table = (torch.randn(H, nb, generator=gen) * 0.7).requires_grad_()
        buckets = torch.randint(0, nb, (S, S), generator=gen)  # arbitrary, not Toeplitz
        kw["rel_bias"] = RelBiasSpec(table=table, buckets=buckets)
    return kw


def to_device(kw: dict) -> dict:
    out = {}
    for key, val in kw.items():
        if isinstance(val, torch.Tensor):
            out[key] = val.to(DEVICE)
        elif isinstance(val, RopeSpec):
            heads = None if val.heads is None else val.heads.to(DEVICE)
            out[key] = RopeSpec(val.cos.to(DEVICE), val.sin.to(DEVICE), val.start, val.dim, heads)
        elif isinstance(val, RelBiasSpec):
            tab = val.table.detach().to(DEVICE).requires_grad_(val.table.requires_grad)
            out[key] = RelBiasSpec(tab, val.buckets.to(DEVICE))
        else:
            out[key] = val
    return out


def key_valid_for(B: int, S: int, padded: bool) -> torch.Tensor | None:
    if not padded:
        return None
    kv = torch.ones(B, S, dtype=torch.bool)
    kv[0, S - 2 :] = False  # right padding of different lengths per row
    kv[-1, S - 5 :] = False
    return kv


def make_qkv(gen, B, H, S, Dqk, Dv, dtype, transposed=True):
    """Leaf tensors (grad is read from them) and the [B, H, S, D] views passed to attention."""
    leaves, views = [], []
    for D in (Dqk, Dqk, Dv):
        if transposed:  # [B, S, H, D] storage, as the model passes x.transpose(1, 2)
            x = torch.randn(B, S, H, D, generator=gen, dtype=torch.float64).to(dtype).to(DEVICE)
            leaf = x.requires_grad_()
            view = leaf.transpose(1, 2)
        else:
            x = torch.randn(B, H, S, D, generator=gen, dtype=torch.float64).to(dtype).to(DEVICE)
            leaf = view = x.requires_grad_()
        leaves.append(leaf)
        views.append(view)
    return leaves, views


def compare_with_reference(
    gen,
    enc: str,
    causal: bool,
    padded: bool,
    *,
    dtype=torch.float32,
    B=2,
    H=2,
    S=13,
    D=16,
    transposed=True,
    rel=False,
) -> dict[str, float]:
    """Run fused + float64 reference forward/backward; return max abs (or scaled) errors."""
    Dqk, Dv = (24, 16) if enc == "decoupled" else (D, D)
    if enc == "rope_heads":
        H = 3
    kw = to_device(make_encoding(enc, gen, H, S, Dqk))
    kv = key_valid_for(B, S, padded)
    common = dict(scale=Dqk**-0.5, causal=causal, key_valid=None if kv is None else kv.to(DEVICE))
    leaves, (q, k, v) = make_qkv(gen, B, H, S, Dqk, Dv, dtype, transposed)

    out = fused_attention(q, k, v, **common, **kw)
    assert out.shape == (B, H, S, Dv) and out.dtype == dtype
    cot = torch.randn(B, H, S, Dv, generator=gen, dtype=torch.float64).to(DEVICE)
    table = kw["rel_bias"].table if "rel_bias" in kw else None
    wrt = leaves + ([table] if table is not None else [])
    grads = torch.autograd.grad((out.double() * cot).sum(), wrt)

    # float64 reference on the very same (possibly bf16-rounded) inputs
    leaves64 = [t.detach().double().requires_grad_() for t in leaves]
    views64 = [t.transpose(1, 2) if transposed else t for t in leaves64]
    kw64 = dict(kw)
    wrt64 = list(leaves64)
    if table is not None:
        tab64 = table.detach().double().requires_grad_()
        kw64["rel_bias"] = RelBiasSpec(tab64, kw["rel_bias"].buckets)
        wrt64.append(tab64)
    ref = reference_attention(*views64, **common, **kw64)
    grads64 = torch.autograd.grad((ref * cot).sum(), wrt64)

    assert torch.isfinite(out).all(), "unwritten (NaN-poisoned) or non-finite output"
    errs = {"out": max_err(out, ref, rel)}
    for name, g, g64 in zip(["dq", "dk", "dv", "dtable"], grads, grads64):
        assert torch.isfinite(g).all(), f"{name}: unwritten (NaN-poisoned) or non-finite gradient"
        errs[name] = max_err(g, g64, rel)
    return errs


def max_err(x: torch.Tensor, ref: torch.Tensor, rel: bool = False) -> float:
    """Max abs error; with rel, divided by max(1, max |ref|) (half-precision tolerance)."""
    err = (x.double() - ref.double()).abs().max().item()
    return err / max(1.0, ref.abs().max().item()) if rel else err


def assert_errs(errs: dict[str, float], tol: float) -> None:
    bad = {k: v for k, v in errs.items() if not v <= tol}
    assert not bad, f"max errors above {tol}: {bad} (all: {errs})"


@needs_triton
@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
@pytest.mark.parametrize("causal", [False, True], ids=["bidir", "causal"])
@pytest.mark.parametrize("enc", ENCODINGS)
def test_fused_matches_reference_fp32(gen, enc, causal, padded):
    errs = compare_with_reference(gen, enc, causal, padded, S=13)
    assert_errs(errs, 1e-4)


@needs_triton
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_fused_half_precision(gen, dtype):
    # bf16 / fp16 inputs, float64 reference on the same rounded inputs; error scaled by
    # max(1, max|ref|) since gradients (the table's especially) sum many rounded terms.
    errs = compare_with_reference(gen, "alibi_t5", True, True, dtype=dtype, S=19, rel=True)
    assert_errs(errs, 2e-2)
    errs = compare_with_reference(gen, "rope_heads", False, True, dtype=dtype, S=19, rel=True)
    assert_errs(errs, 2e-2)


@needs_triton
def test_fused_head_dim_32_contiguous(gen):
    # D=32, plain contiguous [B, H, S, D] inputs, longer ragged S, all encodings at once.
    Dqk = 32
    B, H, S = 2, 2, 19
    kw = make_encoding("alibi_t5", gen, H, S, Dqk)
    kw["rope"] = RopeSpec(*rope_tables(S, 16), start=8, dim=16)  # partial, offset start
    kw = to_device(kw)
    kv = key_valid_for(B, S, True).to(DEVICE)
    leaves, (q, k, v) = make_qkv(gen, B, H, S, Dqk, Dqk, torch.float32, transposed=False)
    common = dict(scale=0.3, causal=True, key_valid=kv)
    out = fused_attention(q, k, v, **common, **kw)
    tab = kw["rel_bias"].table
    grads = torch.autograd.grad(out.square().sum(), [*leaves, tab])
    leaves64 = [t.detach().double().requires_grad_() for t in leaves]
    tab64 = tab.detach().double().requires_grad_()
    kw64 = dict(kw, rel_bias=RelBiasSpec(tab64, kw["rel_bias"].buckets))
    ref = reference_attention(*leaves64, **common, **kw64)
    grads64 = torch.autograd.grad(ref.square().sum(), [*leaves64, tab64])
    errs = {"out": (out.double() - ref).abs().max().item()}
    errs.update(
        {
            n: (a.double() - b).abs().max().item()
            for n, a, b in zip(["dq", "dk", "dv", "dtable"], grads, grads64)
        }
    )
    assert_errs(errs, 1e-4)


@needs_triton
@pytest.mark.parametrize("prerotate", [True, False], ids=["bwd-prerotate", "bwd-rotate-on-load"])
def test_rope_odd_start_and_backward_modes(gen, monkeypatch, prerotate):
    # Odd start (pairs not aligned to even dims) and both backward rope strategies.
    monkeypatch.setattr(flash_mod, "BWD_PREROTATE", prerotate)
    B, H, S, D = 2, 3, 13, 16
    rope = RopeSpec(*rope_tables(S, 6), start=3, dim=6, heads=torch.tensor([False, True, True]))
    kw = to_device({"rope": rope, "alibi_slopes": torch.tensor([0.3, 0.2, 0.1])})
    kv = key_valid_for(B, S, True).to(DEVICE)
    leaves, (q, k, v) = make_qkv(gen, B, H, S, D, D, torch.float32)
    out = fused_attention(q, k, v, scale=0.25, causal=False, key_valid=kv, **kw)
    grads = torch.autograd.grad(out.square().sum(), leaves)
    leaves64 = [t.detach().double().requires_grad_() for t in leaves]
    ref = reference_attention(
        *[t.transpose(1, 2) for t in leaves64], scale=0.25, key_valid=kv, **kw
    )
    grads64 = torch.autograd.grad(ref.square().sum(), leaves64)
    errs = {"out": (out.double() - ref).abs().max().item()}
    errs.update(
        {
            n: (a.double() - b).abs().max().item()
            for n, a, b in zip(["dq", "dk", "dv"], grads, grads64)
        }
    )
    assert_errs(errs, 1e-4)


@needs_triton
@pytest.mark.parametrize("enc", ["rope_heads", "alibi_t5"])
def test_lse_and_rebuild_pattern(gen, enc):
    B, H, S, D = 2, 3, 13, 16
    kw = to_device(make_encoding(enc, gen, H, S, D))
    kv = key_valid_for(B, S, True).to(DEVICE)
    common = dict(scale=D**-0.5, causal=True, key_valid=kv, **kw)
    _, (q, k, v) = make_qkv(gen, B, H, S, D, D, torch.float32)
    with torch.no_grad():
        out, lse = fused_attention(q, k, v, return_lse=True, **common)
    assert lse.shape == (B, H, S) and lse.dtype == torch.float32 and torch.isfinite(lse).all()
    q64, k64, v64 = (t.detach().double() for t in (q, k, v))
    ref_out, ref_lse = reference_attention(q64, k64, v64, return_lse=True, **common)
    assert (lse.double() - ref_lse).abs().max().item() < 1e-5
    assert (out.double() - ref_out).abs().max().item() < 1e-5
    pattern = rebuild_pattern(q, k, lse, **common)
    ref_pattern = torch.softmax(attention_logits(q64, k64, **common), dim=-1)
    assert pattern.shape == (B, H, S, S)
    assert (pattern.double() - ref_pattern).abs().max().item() < 1e-5
    # rows sum to one, masked entries are exactly zero
    assert torch.allclose(pattern.sum(-1), torch.ones(B, H, S, device=pattern.device), atol=1e-5)
    assert (pattern.triu(1) == 0).all()


def _bad_inputs():
    q = torch.randn(2, 2, 5, 16)
    cos, sin = rope_tables(5, 8)
    good = dict(q=q, k=q.clone(), v=q.clone())
    cases = {
        "k-shape": dict(good, k=torch.randn(2, 2, 6, 16)),
        "v-batch": dict(good, v=torch.randn(1, 2, 5, 16)),
        "dqk-mismatch": dict(good, k=torch.randn(2, 2, 5, 8)),
        "head-dim-over-128": dict(
            q=torch.randn(1, 1, 3, 129), k=torch.randn(1, 1, 3, 129), v=torch.randn(1, 1, 3, 8)
        ),
        "dtype-mix": dict(good, v=q.clone().half()),
        "float64": dict(q=q.double(), k=q.double(), v=q.double()),
        "int-dtype": dict(good, q=torch.ones(2, 2, 5, 16, dtype=torch.int32)),
        "3d": dict(good, q=q[0]),
        "odd-rope-dim": dict(good, rope=RopeSpec(cos[:, :3], sin[:, :3], start=0, dim=7)),
        "rope-out-of-range": dict(good, rope=RopeSpec(cos, sin, start=10, dim=8)),
        "rope-short-table": dict(good, rope=RopeSpec(cos[:3], sin[:3], start=0, dim=8)),
        "rope-heads-shape": dict(
            good, rope=RopeSpec(cos, sin, 0, 8, heads=torch.ones(3, dtype=torch.bool))
        ),
        "key-valid-dtype": dict(good, key_valid=torch.ones(2, 5)),
        "key-valid-shape": dict(good, key_valid=torch.ones(2, 4, dtype=torch.bool)),
        "alibi-shape": dict(good, alibi_slopes=torch.ones(3)),
        "buckets-dtype": dict(good, rel_bias=RelBiasSpec(torch.zeros(2, 4), torch.zeros(5, 5))),
        "buckets-shape": dict(
            good, rel_bias=RelBiasSpec(torch.zeros(2, 4), torch.zeros(5, 4, dtype=torch.long))
        ),
        "buckets-range": dict(good, rel_bias=RelBiasSpec(torch.zeros(2, 4), torch.full((5, 5), 4))),
        "table-heads": dict(
            good, rel_bias=RelBiasSpec(torch.zeros(3, 4), torch.zeros(5, 5, dtype=torch.long))
        ),
    }
    if torch.cuda.is_available():
        cases["device-mix"] = dict(good, k=q.cuda())
    return cases


@pytest.mark.parametrize("case", list(_bad_inputs()))
def test_validation_errors(case):
    args = _bad_inputs()[case]
    q, k, v = args.pop("q"), args.pop("k"), args.pop("v")
    with pytest.raises(ValueError, match="attention"):
        fused_attention(q, k, v, scale=0.25, **args)


def test_reference_accepts_float64_and_masks_like_spec():
    # Fully padded batch row: every query still attends to itself, so the row is its own value.
    B, H, S, D = 1, 1, 4, 8
    q, k, v = (torch.randn(B, H, S, D, dtype=torch.float64) for _ in range(3))
    kv = torch.zeros(B, S, dtype=torch.bool)
    out = reference_attention(q, k, v, scale=1.0, key_valid=kv)
    assert torch.allclose(out, v)


def test_package_import_does_not_import_triton():
    # The kernels are not built on import. Triton itself may still be in sys.modules when a
    # dependency imported it (transformers -> torch._dynamo -> triton, e.g. with transformers
    # 5.17 and torch 2.11), but never through pe_interp alone.
    code = (
        "import sys, pe_interp.kernels as K; "
        "assert 'pe_interp.kernels._triton_flash' not in sys.modules, 'kernels built on import'; "
        "assert 'triton' not in sys.modules or 'torch._dynamo' in sys.modules, "
        "'triton imported eagerly'; "
        "print(K.triton_available())"
    )
    res = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=_env_without_interpreter(),
        cwd=REPO,
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() in ("True", "False")


def test_triton_missing_raises_import_error(monkeypatch):
    monkeypatch.setattr(flash_mod, "triton_available", lambda: False)
    q = torch.randn(1, 1, 3, 8)
    with pytest.raises(ImportError, match="Triton"):
        fused_attention(q, q, q, scale=1.0)


def _env_without_interpreter() -> dict:
    return {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@needs_triton
@pytest.mark.slow
def test_kernels_compile_for_hopper_without_gpu():
    """Lower every kernel to a sm_90 cubin on this (possibly GPU-less) machine with the GPU
    block configs: catches GPU-only compile errors and shared-memory overflows that the
    interpreter cannot see."""
    code = (
        "import json; from pe_interp.kernels.compile_check import compile_kernels; "
        "print(json.dumps(compile_kernels(arch=90, dtype='bf16', head_dim=64)))"
    )
    res = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=_env_without_interpreter(),
        cwd=REPO,
        timeout=600,
    )
    if res.returncode != 0 and "No module named 'triton.backends.nvidia'" in res.stderr:
        pytest.skip("this Triton build has no NVIDIA backend")
    assert res.returncode == 0, res.stderr[-3000:]
    import json

    from pe_interp.kernels.compile_check import SMEM_LIMIT

    rows = json.loads(res.stdout.strip().splitlines()[-1])
    assert {r["kernel"] for r in rows} == {"fwd", "dkdv", "dq", "rotate"}
    for r in rows:
        assert r["shared"] <= SMEM_LIMIT, r


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only exit path")
def test_gpu_benchmark_exits_cleanly_without_cuda(tmp_path):
    out = tmp_path / "bench.json"
    res = subprocess.run(
        [sys.executable, os.path.join(REPO, "benchmarks", "attention_gpu.py"), "--json", str(out)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=_env_without_interpreter(),
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    assert "no CUDA device" in res.stdout
    assert not out.exists()


@pytest.mark.parametrize(
    "encoding", ["rope", "t5", "alibi", "decoupled_rope", {"name": "rope", "heads": [1]}]
)
def test_model_trained_with_triton_matches_eager(encoding):
    """A small model trained a few steps with attn_backend='triton' (interpreter on CPU) ends
    where the same steps with 'eager' end: the fused path is a drop-in for training."""
    from pe_interp import HookedPETransformer, ModelConfig

    base = ModelConfig(
        encoding=encoding,
        n_layers=2,
        d_model=16,
        n_heads=2,
        d_mlp=32,
        n_ctx=12,
        d_vocab=20,
        n_classes=3,
        attention_dir="bidirectional",
    )
    gen = torch.Generator().manual_seed(5)
    tokens = torch.randint(1, 20, (3, 11), generator=gen)
    tokens[0, 8:] = 0  # a padded row
    labels = torch.randint(0, 3, (3,), generator=gen)
    tokens, labels = tokens.to(DEVICE), labels.to(DEVICE)
    finals = {}
    for backend in ("eager", "triton"):
        model = HookedPETransformer(base.replace(attn_backend=backend)).to(DEVICE)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        for _ in range(3):
            loss = torch.nn.functional.cross_entropy(model(tokens), labels)
            opt.zero_grad()
            loss.backward()
            opt.step()
        finals[backend] = {k: v.detach().clone() for k, v in model.state_dict().items()}
        assert model.blocks[0].attn.backend(model.context(tokens, tokens != 0, None)) == backend
    for k in finals["eager"]:
        torch.testing.assert_close(
            finals["triton"][k], finals["eager"][k], atol=1e-4, rtol=1e-4, msg=k
        )
