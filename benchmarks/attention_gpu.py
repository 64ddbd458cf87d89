#!/usr/bin/env python
"""Check and time fused attention with positional encodings on one GPU, in one run.

Contenders (each for forward and forward+backward, bf16 inputs):

* ``triton``  -- ``pe_interp.kernels.fused_attention`` (RoPE / bias fused into the kernel)
* ``eager``   -- ``pe_interp.kernels.reference_attention`` (materialised scores)
* ``sdpa``    -- ``F.scaled_dot_product_attention``; RoPE applied separately, the position bias
  (plus the causal mask) materialised as a float ``attn_mask`` [1, H, S, S]
* ``flex``    -- ``torch.nn.attention.flex_attention`` under ``torch.compile``; RoPE applied
  separately, the bias as a ``score_mod``, causality as a precomputed ``BlockMask``

Shapes: ``paper`` (batch 512, 16 heads, 128 tokens, head dim 16) and ``long`` (batch 2,
16 heads, 4096 tokens, head dim 64). Encodings: rope, alibi, t5 (learned table, gets a grad).

Reported per (shape, encoding, contender, mode):

* ``ms``: median of >= 20 timed repetitions (CUDA events) after warm-up;
* ``tflops``: algorithmic FLOPs / time, with (Dqk = Dv = D, causal halves both)
  forward = 2*B*H*S^2*(Dqk + Dv) = 4*B*H*S^2*D,
  backward = 2*B*H*S^2*(3*Dqk + 2*Dv) = 10*B*H*S^2*D (QK^T recompute, dV, dP, dQ, dK),
  forward+backward = 14*B*H*S^2*D. Every contender is charged the same nominal count;
* ``err``: max abs error of the output (and of dq/dk/dv/dtable for fwd+bwd) against the float64
  reference on the same bf16 inputs (full batch unless ``--err-batch``; the float64 reference
  of the long shape needs roughly 30 GB);
* ``peak_mib``: peak CUDA memory of the call above what was allocated before it;
* ``first_call_s``: wall time of the first call (includes Triton / torch.compile compilation).

Each contender is guarded: a failure is printed and recorded, and the run goes on.
Prints a table and writes JSON (``--json``, default benchmarks/attention_gpu.json).
On a machine without CUDA it prints a message and exits (status 0) without doing anything;
``--cpu-smoke`` instead runs tiny shapes on CPU (Triton interpreter, uncompiled flex) to check
the script itself.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

SHAPES = {  # name: (B, H, S, D)
    "paper": (512, 16, 128, 16),
    "long": (2, 16, 4096, 64),
}
SMOKE_SHAPES = {"tiny": (2, 2, 19, 16)}
ENCODINGS = ("rope", "alibi", "t5")
CONTENDERS = ("triton", "eager", "sdpa", "flex")
MODES = ("fwd", "fwd+bwd")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=",".join(SHAPES), help="comma list of: " + ",".join(SHAPES))
    ap.add_argument("--encodings", default=",".join(ENCODINGS))
    ap.add_argument(
        "--contenders",
        default=",".join(CONTENDERS),
        help="comma list of: triton, triton-rotload (backward rotates on load), eager, sdpa, flex",
    )
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--bidirectional", action="store_true", help="non-causal (default: causal)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument(
        "--err-batch",
        type=int,
        default=None,
        help="batch slice for the float64 error check (default: full batch; "
        "a smaller one saves memory but costs flex a recompile)",
    )
    ap.add_argument("--no-err", action="store_true", help="skip the float64 error checks")
    ap.add_argument("--json", default=str(Path(__file__).with_name("attention_gpu.json")))
    ap.add_argument(
        "--cpu-smoke",
        action="store_true",
        help="tiny shapes on CPU (Triton interpreter) to test this script",
    )
    return ap.parse_args(argv)


# --------------------------------------------------------------------------------------------
# inputs


def rope_tables(S: int, R: int, device, base: float = 10000.0):
    pos = torch.arange(S, device=device, dtype=torch.float64)[:, None]
    inv = base ** (-torch.arange(0, R, 2, device=device, dtype=torch.float64) / R)
    ang = pos * inv
    return ang.cos().float(), ang.sin().float()


def t5_buckets(S: int, device, num_buckets: int = 32, max_distance: int = 128) -> torch.Tensor:
    """T5 bidirectional relative-position buckets [S, S] (int64)."""
    ctx = torch.arange(S, device=device)
    rel = ctx[None, :] - ctx[:, None]  # j - i
    nb = num_buckets // 2
    ret = (rel > 0).long() * nb
    n = rel.abs()
    max_exact = nb // 2
    is_small = n < max_exact
    large = (
        max_exact
        + (
            torch.log(n.float().clamp(min=1) / max_exact)
            / math.log(max_distance / max_exact)
            * (nb - max_exact)
        ).long()
    )
    large = large.clamp(max=nb - 1)
    return ret + torch.where(is_small, n, large)


def make_problem(shape, enc: str, causal: bool, device, dtype=torch.bfloat16, seed=0):
    from pe_interp.kernels import RelBiasSpec, RopeSpec

    B, H, S, D = shape
    g = torch.Generator(device="cpu").manual_seed(seed)

    def rnd(*s):
        return torch.randn(*s, generator=g).to(device=device, dtype=dtype)

    # [B, S, H, D] storage with [B, H, S, D] views, like the model passes them
    leaves = [rnd(B, S, H, D).requires_grad_() for _ in range(3)]
    kw: dict = {}
    if enc == "rope":
        kw["rope"] = RopeSpec(*rope_tables(S, D, device), start=0, dim=D)
    elif enc == "alibi":
        kw["alibi_slopes"] = torch.tensor(
            [2 ** (-8 * (h + 1) / H) for h in range(H)], device=device
        )
    elif enc == "t5":
        nb = 32
        table = (torch.randn(H, nb, generator=g) * 0.5).to(device).requires_grad_()
        kw["rel_bias"] = RelBiasSpec(table=table, buckets=t5_buckets(S, device, nb))
    elif enc != "nope":
        raise ValueError(enc)
    grad_out = rnd(B, H, S, D)
    return dict(leaves=leaves, kw=kw, causal=causal, scale=D**-0.5, grad_out=grad_out, shape=shape)


def slice_problem(prob: dict, nb: int) -> dict:
    leaves = [t.detach()[:nb].clone().requires_grad_() for t in prob["leaves"]]
    kw = dict(prob["kw"])
    if "rel_bias" in kw:
        from pe_interp.kernels import RelBiasSpec

        rb = kw["rel_bias"]
        kw["rel_bias"] = RelBiasSpec(rb.table.detach().clone().requires_grad_(), rb.buckets)
    B, H, S, D = prob["shape"]
    return dict(prob, leaves=leaves, kw=kw, grad_out=prob["grad_out"][:nb], shape=(nb, H, S, D))


def grad_inputs(prob: dict) -> list[torch.Tensor]:
    ins = list(prob["leaves"])
    if "rel_bias" in prob["kw"]:
        ins.append(prob["kw"]["rel_bias"].table)
    return ins


# --------------------------------------------------------------------------------------------
# contenders: each returns fn(prob) -> out [B, H, S, D] (differentiable)


def views(prob):
    return [t.transpose(1, 2) for t in prob["leaves"]]


def make_triton(rotate_on_load: bool = False):
    from pe_interp.kernels import flash, fused_attention

    def run(prob):
        q, k, v = views(prob)
        old = flash.BWD_PREROTATE  # read at call time; the backward uses the captured value
        flash.BWD_PREROTATE = not rotate_on_load
        try:
            return fused_attention(
                q, k, v, scale=prob["scale"], causal=prob["causal"], **prob["kw"]
            )
        finally:
            flash.BWD_PREROTATE = old

    return run


def make_eager():
    from pe_interp.kernels import reference_attention

    def run(prob):
        q, k, v = views(prob)
        return reference_attention(
            q, k, v, scale=prob["scale"], causal=prob["causal"], **prob["kw"]
        )

    return run


def _causal_bias(S, device, dtype):
    i = torch.arange(S, device=device)
    return torch.zeros(S, S, device=device, dtype=dtype).masked_fill(
        i[None, :] > i[:, None], float("-inf")
    )


def make_sdpa():
    from pe_interp.kernels.reference import apply_rope

    cache: dict = {}

    def run(prob):
        q, k, v = views(prob)
        kw, causal = prob["kw"], prob["causal"]
        B, H, S, D = prob["shape"]
        q, k = apply_rope(q, kw.get("rope")), apply_rope(k, kw.get("rope"))
        mask = None
        if "alibi_slopes" in kw:  # constant: built once, outside the timed region
            key = ("alibi", S, causal, q.device)
            if key not in cache:
                i = torch.arange(S, device=q.device)
                dist = (i[:, None] - i[None, :]).abs().float()
                m = -kw["alibi_slopes"].float().view(H, 1, 1) * dist
                if causal:
                    m = m + _causal_bias(S, q.device, torch.float32)
                cache[key] = m.to(q.dtype).unsqueeze(0)
            mask = cache[key]
        elif "rel_bias" in kw:  # learned: gathered every call so the table gets its grad
            rb = kw["rel_bias"]
            m = rb.table[:, rb.buckets]
            if causal:
                m = m + _causal_bias(S, q.device, m.dtype)
            mask = m.to(q.dtype).unsqueeze(0)
        if mask is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=prob["scale"])
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=prob["scale"])

    return run


def make_flex(compile_: bool = True):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    from pe_interp.kernels.reference import apply_rope

    if compile_:
        cfg = torch._dynamo.config  # one compile per (shape, encoding): lift the recompile caps
        for name in (
            "recompile_limit",
            "cache_size_limit",
            "accumulated_recompile_limit",
            "accumulated_cache_size_limit",
        ):
            if hasattr(cfg, name):
                setattr(cfg, name, max(getattr(cfg, name), 256))
    flex = torch.compile(flex_attention, dynamic=False) if compile_ else flex_attention
    cache: dict = {}

    def causal_mod(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    def mods(prob, device):
        """Block mask / score_mod built once per problem (stable objects avoid recompiles)."""
        kw, S = prob["kw"], prob["shape"][2]
        key = (
            S,
            prob["causal"],
            *(
                id(t)
                for t in (
                    kw.get("alibi_slopes"),
                    kw["rel_bias"].table if "rel_bias" in kw else None,
                )
            ),
        )
        if key in cache:
            return cache[key]
        block_mask = None
        if prob["causal"]:
            block_mask = create_block_mask(causal_mod, None, None, S, S, device=device)
        score_mod = None
        if "alibi_slopes" in kw:
            slopes = kw["alibi_slopes"].float()

            def score_mod(score, b, h, q_idx, kv_idx):
                return score - slopes[h] * (q_idx - kv_idx).abs()

        elif "rel_bias" in kw:
            table, buckets = kw["rel_bias"].table, kw["rel_bias"].buckets

            def score_mod(score, b, h, q_idx, kv_idx):
                return score + table[h, buckets[q_idx, kv_idx]]

        cache[key] = (score_mod, block_mask)
        return cache[key]

    def run(prob):
        q, k, v = views(prob)
        kw = prob["kw"]
        q, k = apply_rope(q, kw.get("rope")), apply_rope(k, kw.get("rope"))
        score_mod, block_mask = mods(prob, q.device)
        return flex(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=prob["scale"])

    return run


# --------------------------------------------------------------------------------------------
# measurement


class Timer:
    def __init__(self, cuda: bool):
        self.cuda = cuda

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def time(self, fn: Callable[[], object], reps: int, warmup: int) -> float:
        for _ in range(warmup):
            fn()
        self.sync()
        times = []
        for _ in range(reps):
            if self.cuda:
                start, end = (
                    torch.cuda.Event(enable_timing=True),
                    torch.cuda.Event(enable_timing=True),
                )
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end))
            else:
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)


def flops(shape, causal: bool, mode: str) -> float:
    B, H, S, D = shape
    f = 4.0 * B * H * S * S * D
    if mode == "fwd+bwd":
        f *= 3.5  # backward = 2.5 x forward (5 vs 2 matmuls)
    return f * ((S + 1) / (2 * S) if causal else 1.0)


def detached(prob: dict) -> dict:
    """Inference view of a problem: no tensor requires grad (forward-only timing)."""
    kw = dict(prob["kw"])
    if "rel_bias" in kw:
        from pe_interp.kernels import RelBiasSpec

        kw["rel_bias"] = RelBiasSpec(kw["rel_bias"].table.detach(), kw["rel_bias"].buckets)
    return dict(prob, leaves=[t.detach() for t in prob["leaves"]], kw=kw)


def step(fn, prob, mode):
    """One timed call. "fwd" is a training-style forward (inputs require grad, so every
    contender records what its backward needs; flex reuses its fwd+bwd compilation)."""
    out = fn(prob)
    if mode == "fwd":
        return out
    return torch.autograd.grad(out, grad_inputs(prob), prob["grad_out"].to(out.dtype))


def max_errors(fn, prob_slice, mode, ref_cache, detach_fwd=False) -> dict[str, float]:
    """Contender vs float64 reference on a (small) batch slice."""
    from pe_interp.kernels import RelBiasSpec, reference_attention

    names = ["dq", "dk", "dv", "dtable"]
    if mode not in ref_cache:
        p64 = dict(prob_slice)
        p64["leaves"] = [t.detach().double().requires_grad_() for t in prob_slice["leaves"]]
        kw = dict(prob_slice["kw"])
        if "rel_bias" in kw:
            rb = kw["rel_bias"]
            kw["rel_bias"] = RelBiasSpec(rb.table.detach().double().requires_grad_(), rb.buckets)
        p64["kw"] = kw
        q, k, v = views(p64)
        ref = reference_attention(q, k, v, scale=p64["scale"], causal=p64["causal"], **kw)
        res = [ref.detach()]
        if mode == "fwd+bwd":
            res += list(torch.autograd.grad(ref, grad_inputs(p64), p64["grad_out"].double()))
        ref_cache[mode] = res
        del ref
    ref = ref_cache[mode]
    out = fn(detached(prob_slice) if (detach_fwd and mode == "fwd") else prob_slice)
    if mode == "fwd":
        return {"out": (out.detach().double() - ref[0]).abs().max().item()}
    grads = torch.autograd.grad(out, grad_inputs(prob_slice), prob_slice["grad_out"].to(out.dtype))
    errs = {"out": (out.detach().double() - ref[0]).abs().max().item()}
    for n, g, r in zip(names, grads, ref[1:]):
        errs[n] = (g.double() - r).abs().max().item()
    return errs


def main(argv=None) -> int:
    args = parse_args(argv)
    smoke = args.cpu_smoke
    if smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    elif not torch.cuda.is_available():
        print(
            "attention_gpu.py: no CUDA device found; this benchmark needs a GPU "
            "(nothing was run; use --cpu-smoke to exercise the script on CPU)."
        )
        return 0
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout
    from pe_interp.kernels import triton_available

    device = torch.device("cpu" if smoke else "cuda")
    timer = Timer(cuda=not smoke)
    shapes = SMOKE_SHAPES if smoke else {k: SHAPES[k] for k in args.shapes.split(",") if k}
    encs = [e for e in args.encodings.split(",") if e]
    modes = [m for m in args.modes.split(",") if m]
    causal = not args.bidirectional
    reps, warmup = (2, 1) if smoke else (max(20, args.reps), args.warmup)
    factories = {
        "triton": lambda: make_triton(False),
        "triton-rotload": lambda: make_triton(True),
        "eager": make_eager,
        "sdpa": make_sdpa,
        "flex": lambda: make_flex(compile_=not smoke),
    }
    contenders = [c for c in args.contenders.split(",") if c]
    for c in contenders:
        if c not in factories:
            print(f"unknown contender {c!r}; choose from {sorted(factories)}")
            return 2

    env = dict(
        torch=torch.__version__,
        cuda=torch.version.cuda,
        triton_available=triton_available(),
        device=torch.cuda.get_device_name() if not smoke else "cpu (smoke)",
        causal=causal,
        dtype="bfloat16",
        reps=reps,
        warmup=warmup,
    )
    try:
        import triton

        env["triton"] = triton.__version__
    except Exception:
        env["triton"] = None
    print("env:", env, flush=True)

    results = []
    for shape_name, shape in shapes.items():
        # Full batch by default: a different batch would make flex recompile (dynamic=False).
        err_b = min(args.err_batch or shape[0], shape[0])
        for enc in encs:
            try:
                prob = make_problem(shape, enc, causal, device)
                prob_slice = slice_problem(prob, err_b)
            except Exception as e:  # pragma: no cover - e.g. OOM
                print(f"[{shape_name}/{enc}] input setup failed: {e!r}", flush=True)
                continue
            ref_cache: dict = {}
            for cname in contenders:
                fn = None
                for mode in modes:
                    row = dict(
                        shape=shape_name,
                        B=shape[0],
                        H=shape[1],
                        S=shape[2],
                        D=shape[3],
                        encoding=enc,
                        contender=cname,
                        mode=mode,
                        causal=causal,
                    )
                    try:
                        if fn is None:
                            fn = factories[cname]()
                        # (CPU smoke: flex has no CPU backward, so time its forward detached)
                        p = detached(prob) if (smoke and mode == "fwd") else prob
                        call = lambda fn=fn, mode=mode, p=p: step(fn, p, mode)  # noqa: E731
                        base = 0
                        if not smoke:
                            torch.cuda.synchronize()
                            base = torch.cuda.memory_allocated()
                            torch.cuda.reset_peak_memory_stats()
                        t0 = time.perf_counter()
                        call()  # first call: includes Triton / torch.compile compilation
                        timer.sync()
                        row["first_call_s"] = round(time.perf_counter() - t0, 2)
                        ms = timer.time(call, reps, warmup)
                        row["ms"] = round(ms, 4)
                        row["tflops"] = round(flops(shape, causal, mode) / (ms * 1e-3) / 1e12, 2)
                        if not smoke:
                            row["peak_mib"] = round(
                                (torch.cuda.max_memory_allocated() - base) / 2**20, 1
                            )
                    except Exception as e:
                        row["error"] = f"{type(e).__name__}: {e}"[:500]
                        print(
                            f"[{shape_name}/{enc}/{cname}/{mode}] FAILED: {row['error']}",
                            flush=True,
                        )
                        if os.environ.get("BENCH_TRACEBACK"):
                            traceback.print_exc()
                    if not args.no_err:
                        try:
                            errs = max_errors(fn, prob_slice, mode, ref_cache, smoke)
                            row["err"] = {k: float(f"{v:.3g}") for k, v in errs.items()}
                        except Exception as e:
                            row["err_error"] = f"{type(e).__name__}: {e}"[:300]
                            print(
                                f"[{shape_name}/{enc}/{cname}/{mode}] error check FAILED: "
                                f"{row['err_error']}",
                                flush=True,
                            )
                    results.append(row)
                    print(format_row(row), flush=True)
                    if not smoke:
                        torch.cuda.empty_cache()
            del prob, prob_slice, ref_cache

    print()
    print(format_table(results))
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            dict(
                env=env,
                flop_formula="fwd = 4*B*H*S^2*D, fwd+bwd = 14*B*H*S^2*D, times (S+1)/(2S) when causal",
                results=results,
            ),
            indent=1,
        )
    )
    print(f"wrote {out}")
    return 0


def format_row(r: dict) -> str:
    head = f"{r['shape']:>5} {r['encoding']:>5} {r['contender']:>14} {r['mode']:>7}"
    if "error" in r or "ms" not in r:
        return f"{head}  ERROR {r.get('error', '?')[:120]}"
    err = r.get("err", {})
    es = " ".join(f"{k}={v:.2g}" for k, v in err.items())
    mem = f"{r['peak_mib']:>9.0f} MiB" if "peak_mib" in r else ""
    return f"{head} {r['ms']:>10.3f} ms {r['tflops']:>8.2f} TFLOP/s{mem}  {es}"


def format_table(results: list[dict]) -> str:
    lines = [
        f"{'shape':>5} {'enc':>5} {'contender':>14} {'mode':>7} {'median':>13} {'TFLOP/s':>16}"
        f"{'peak':>13}  max abs err vs float64"
    ]
    lines += [format_row(r) for r in results]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
