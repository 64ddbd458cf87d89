"""Training steps/s of HookedPETransformer (eager and sdpa backends) against a plain PyTorch
classifier of the same size, at the paper's size (6 layers, d_model 256, 16 heads, d_mlp 512,
128 tokens, batch 64, RoPE, AdamW; forward + backward + optimizer step), or with ``--size mid``
at the deposit study's size (6 layers, d_model 128, 16 heads, d_mlp 256, 48 tokens, batch 128),
whose examples/s are the study's training throughput.

On a CPU, ``--amp`` adds bf16 contenders: the plain model and ours under
``torch.autocast("cpu", dtype=torch.bfloat16)`` (fp32 master weights), with ratios against the
plain model in fp32 and in bf16 and the fraction of the measured bf16 matmul peak. Without
``--amp`` they are added only when :func:`pe_interp.util.hardware.cpu_has_bf16` finds native bf16
(AVX512-BF16 / AMX); without it bf16 runs emulated and many times slower, which is why
training does not autocast there. ``--threads 1,0`` repeats everything at 1 thread and at
torch's default.

The baseline is a minimal nanoGPT-style model written here: a fused qkv ``nn.Linear``, manual
softmax attention with RoPE (the same adjacent-pair layout), no hooks, no encoding plug-ins.

This machine's timings swing a lot between runs, so contenders are timed round-robin (each
repeat times every contender once, and the machine's matmul rate once), and we report medians
of ``--repeats`` timed runs of ``--steps`` steps each, plus the ratio to the baseline measured
in the same run. Achieved GFLOP/s are analytic training FLOPs (see ``train_flops``) divided by
the median step time, and are shown as a fraction of the median fp32 1024^3 matmul rate.

    python benchmarks/model_step.py [--steps 2] [--repeats 5] [--json out.json]

On a GPU (``--device cuda``, usually with ``--amp``: bfloat16 autocast, as training runs there)
the fused Triton kernel (``attn_backend="triton"``) is a contender too, steps are timed with
the device synchronised, and the peak is the median bf16 (fp32 without ``--amp``) 8192^3 matmul
rate::

    python benchmarks/model_step.py --device cuda --amp --batch 512 --seq 120 --steps 10
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from pe_interp import HookedPETransformer, ModelConfig  # noqa: E402

PAPER = dict(n_layers=6, d_model=256, n_heads=16, d_mlp=512, n_ctx=128, d_vocab=512, n_classes=70)
# The deposit study's `mid` model (pe_interp.config.presets): its throughput is the study's.
MID = dict(n_layers=6, d_model=128, n_heads=16, d_mlp=256, n_ctx=48, d_vocab=128, n_classes=30)
SIZES = {"paper": (PAPER, 64), "mid": (MID, 128)}  # shape, default batch


# ---- the plain PyTorch baseline -----------------------------------------------------------------
def rope_tables(n_pos: int, dim: int, base: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    angles = torch.arange(n_pos, dtype=torch.float64)[:, None] * inv_freq
    return angles.cos().float(), angles.sin().float()


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [batch, head, pos, d]; rotate adjacent pairs (2i, 2i+1)."""
    x1, x2 = x[..., 0::2], x[..., 1::2]
    c, s = cos[: x.shape[2]], sin[: x.shape[2]]
    return torch.stack([x1 * c - x2 * s, x1 * s + x2 * c], dim=-1).flatten(-2)


class Block(nn.Module):
    def __init__(self, d_model: int, n_heads: int, d_mlp: int):
        super().__init__()
        self.n_heads, self.d_head = n_heads, d_model // n_heads
        self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.fc1, self.fc2 = nn.Linear(d_model, d_mlp), nn.Linear(d_mlp, d_model)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, P, M = x.shape
        q, k, v = (
            self.qkv(self.ln1(x)).view(B, P, 3, self.n_heads, self.d_head).permute(2, 0, 3, 1, 4)
        )
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.d_head))
        z = att.softmax(dim=-1) @ v  # [B, H, P, D]
        x = x + self.proj(z.transpose(1, 2).reshape(B, P, M))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class PlainClassifier(nn.Module):
    """Embedding, pre-LN blocks with RoPE attention, final LN, mean pooling, linear head."""

    def __init__(self, n_layers, d_model, n_heads, d_mlp, n_ctx, d_vocab, n_classes):
        super().__init__()
        self.embed = nn.Embedding(d_vocab, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_heads, d_mlp) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, n_classes)
        cos, sin = rope_tables(n_ctx, d_model // n_heads)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.normal_(p, std=0.02)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x, self.cos, self.sin)
        return self.head(self.ln_f(x).mean(1))


# ---- measurement --------------------------------------------------------------------------------
def train_flops(n_layers, d_model, d_mlp, n_ctx, batch, n_classes, **_) -> float:
    """Analytic FLOPs of one training step (forward + backward), counting matmuls only.

    Per token, each weight in a matmul costs 2 FLOPs forward and 4 backward (grad of input and
    of weight), so 6 * N_matmul with N_matmul = L * (4 d^2 + 2 d d_mlp) weights (q, k, v, o and
    the MLP). Attention adds per layer and sequence 2 n^2 d for q.k^T and 2 n^2 d for pattern.v
    forward, times 3 for forward + backward. The classifier head (on pooled vectors) is counted;
    embeddings, norms, softmax, RoPE and the optimizer step are not:

        FLOPs = 6 * B * n * L * (4 d^2 + 2 d d_mlp) + 3 * L * B * 4 n^2 d + 6 * B * d * n_classes
    """
    tokens = batch * n_ctx
    dense = 6 * tokens * n_layers * (4 * d_model**2 + 2 * d_model * d_mlp)
    attention = 3 * n_layers * batch * 4 * n_ctx**2 * d_model
    head = 6 * batch * d_model * n_classes
    return float(dense + attention + head)


def matmul_gflops(n: int = 1024, reps: int = 5, device: str = "cpu", dtype=torch.float32) -> float:
    """Median ``n x n @ n x n`` rate over ``reps`` products (after one warm-up)."""
    a, b = (
        torch.randn(n, n, device=device, dtype=dtype),
        torch.randn(n, n, device=device, dtype=dtype),
    )
    a @ b
    sync(device)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        a @ b
        sync(device)
        times.append(time.perf_counter() - t0)
    return 2 * n**3 / statistics.median(times) / 1e9


def sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def make_step(model: nn.Module, tokens: torch.Tensor, labels: torch.Tensor, amp: bool = False):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.98))
    model.train()
    kind = tokens.device.type

    def autocast():
        if (
            amp
        ):  # forced here, whatever pe_interp.util.hardware would choose: this is the measurement
            return torch.autocast(kind, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def step() -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        with autocast():
            logits = model(tokens)
        loss = F.cross_entropy(logits.float(), labels)
        loss.backward()
        opt.step()
        return loss.detach()  # no .item(): on a GPU that would sync every step

    return step


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=2, help="training steps per timed run")
    ap.add_argument("--repeats", type=int, default=5, help="timed runs per contender (median)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps per contender first")
    ap.add_argument(
        "--size",
        choices=sorted(SIZES),
        default="paper",
        help="paper (default) or mid (the study's model)",
    )
    ap.add_argument("--batch", type=int, default=None, help="default: 64 at paper size, 128 at mid")
    ap.add_argument(
        "--seq", type=int, default=None, help="tokens per example (default: the size's n_ctx)"
    )
    ap.add_argument(
        "--threads", default="0", help="comma list of torch thread counts (0: torch's default)"
    )
    ap.add_argument("--device", default="cpu", help="cpu | cuda")
    ap.add_argument(
        "--amp",
        action="store_true",
        help="bfloat16: on CUDA every contender autocasts; on a CPU bf16 contenders are added",
    )
    ap.add_argument(
        "--contenders",
        default=None,
        help="comma list of baseline, baseline-bf16, eager, sdpa, sdpa-bf16, triton, auto",
    )
    ap.add_argument("--json", type=Path, default=None, help="write the results here")
    args = ap.parse_args(argv)
    shape, batch = SIZES[args.size]
    args.batch = args.batch or batch
    args.seq = args.seq or shape["n_ctx"]
    args.shape = shape
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("model_step.py: --device cuda, but torch sees no CUDA device")
    runs = []
    default_threads = torch.get_num_threads()
    for threads in [int(t) for t in str(args.threads).split(",")]:
        # 0 restores torch's default: without this, "--threads 1,0" ran its second pass at 1 thread
        torch.set_num_threads(threads or default_threads)
        runs.append(measure(args, device))
    out = runs[0] if len(runs) == 1 else {"runs": runs}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2))
        print(f"wrote {args.json}")
    return out


def measure(args: argparse.Namespace, device: torch.device) -> dict:
    from pe_interp.util.hardware import cpu_has_bf16

    cuda = device.type == "cuda"
    amp_all = bool(args.amp and cuda)  # CUDA: every contender in bf16, as training runs there
    cpu_bf16 = not cuda and (args.amp or cpu_has_bf16())
    torch.manual_seed(0)
    size = {**args.shape, "n_ctx": args.seq}
    tokens = torch.randint(1, size["d_vocab"], (args.batch, args.seq))  # no pads: pure compute
    labels = torch.randint(0, size["n_classes"], (args.batch,))
    tokens, labels = tokens.to(device), labels.to(device)
    if args.contenders:
        names = args.contenders.split(",")
    else:
        names = (
            ["baseline", "eager", "sdpa"]
            + (["triton"] if cuda else [])
            + (["baseline-bf16", "sdpa-bf16"] if cpu_bf16 else [])
        )
    models: dict[str, nn.Module] = {}
    amp_of: dict[str, bool] = {}
    for name in names:
        kind, _, precision = name.partition("-")
        if precision not in ("", "bf16"):
            raise SystemExit(f"model_step.py: unknown contender {name!r}")
        if kind == "baseline":
            models[name] = PlainClassifier(**size)
        elif kind in ("eager", "sdpa", "triton", "auto"):
            models[name] = HookedPETransformer(
                ModelConfig(**size, encoding="rope", attn_backend=kind)
            )
        else:
            raise SystemExit(f"model_step.py: unknown contender {name!r}")
        amp_of[name] = amp_all or precision == "bf16"
    models = {name: m.to(device) for name, m in models.items()}
    params = {name: sum(p.numel() for p in m.parameters()) for name, m in models.items()}
    flops = train_flops(batch=args.batch, **size)
    where = (
        torch.cuda.get_device_name(device) if cuda else (platform.processor() or platform.machine())
    )
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {where}"
        f"{', bf16 autocast' if amp_all else ''}"
        f"{'' if cuda else f', native CPU bf16: {cpu_has_bf16()}'}; "
        f"batch {args.batch} x {args.seq} tokens, {size['n_layers']} layers, d_model {size['d_model']}, "
        f"{size['n_heads']} heads, d_mlp {size['d_mlp']}; params "
        + ", ".join(f"{k} {v:,}" for k, v in params.items())
        + f"; {flops / 1e9:.1f} GFLOP per training step (analytic)"
    )

    steps = {name: make_step(m, tokens, labels, amp_of[name]) for name, m in models.items()}
    first_s: dict[str, float] = {}
    errors: dict[str, str] = {}
    for name, step in list(steps.items()):
        t0 = time.perf_counter()
        try:
            for _ in range(max(1, args.warmup)):
                loss = step()
            loss = loss.item()
        except Exception as e:  # e.g. a kernel that does not compile: report, go on without it
            errors[name] = f"{type(e).__name__}: {e}"[:500]
            print(f"warm-up {name}: FAILED {errors[name]}", flush=True)
            del steps[name]
            continue
        first_s[name] = time.perf_counter() - t0  # includes Triton's compilation on a GPU
        print(f"warm-up {name}: loss {loss:.3f} ({first_s[name]:.1f} s)", flush=True)
    if not steps:
        raise SystemExit("model_step.py: every contender failed")

    precisions = ["bf16" if amp_all else "fp32"] + (["bf16"] if cpu_bf16 else [])
    n_peak = 8192 if cuda else 1024
    times: dict[str, list[float]] = {name: [] for name in steps}
    peaks: dict[str, list[float]] = {p: [] for p in precisions}
    for rep in range(args.repeats):
        for p in peaks:
            dtype = torch.bfloat16 if p == "bf16" else torch.float32
            peaks[p].append(
                matmul_gflops(n=n_peak, reps=10 if cuda else 5, device=device, dtype=dtype)
            )
        for name, step in steps.items():
            sync(device)
            t0 = time.perf_counter()
            for _ in range(args.steps):
                step()
            sync(device)
            times[name].append((time.perf_counter() - t0) / args.steps)
        print(
            f"repeat {rep + 1}/{args.repeats}: "
            + ", ".join(f"{n} {t[-1] * 1e3:.1f} ms/step" for n, t in times.items())
            + ", matmul "
            + ", ".join(f"{p} {v[-1]:.1f}" for p, v in peaks.items())
            + " GFLOP/s",
            flush=True,
        )

    peak = {p: statistics.median(v) for p, v in peaks.items()}
    refs = [r for r in ("baseline", "baseline-bf16") if r in times] or [next(iter(times))]
    print(
        "\nmatmul peak (median "
        + ", ".join(f"{p} {n_peak}^3 {v:.1f}" for p, v in peak.items())
        + " GFLOP/s)"
    )
    header = f"{'contender':<14} {'ms/step':>9} {'examples/s':>10}" + "".join(
        f" {'vs ' + r:>18}" for r in refs
    )
    header += f" {'GFLOP/s':>8}" + "".join(f" {'of ' + p + ' peak':>13}" for p in peak)
    print(header)
    results = {}
    for name, t in times.items():
        med = statistics.median(t)
        achieved = flops / med / 1e9
        # Paired ratio per repeat is more robust to drifts in machine load than ratio of medians.
        vs = {r: statistics.median(b / x for b, x in zip(times[r], t)) for r in refs}
        results[name] = {
            "steps_per_s": 1 / med,
            "examples_per_s": args.batch / med,
            "s_per_step": med,
            "s_per_step_all": t,
            "bf16_autocast": amp_of[name],
            "speed_vs": vs,
            "speed_vs_baseline": vs.get("baseline"),
            "gflops": achieved,
            "fraction_of_matmul_peak": {p: achieved / v for p, v in peak.items()},
            "first_steps_s": first_s[name],
        }
        print(
            f"{name:<14} {med * 1e3:>9.1f} {args.batch / med:>10.1f}"
            + "".join(f" {vs[r]:>17.2f}x" for r in refs)
            + f" {achieved:>8.1f}"
            + "".join(f" {achieved / v:>12.0%}" for v in peak.values())
        )
    return {
        "config": {
            **size,
            "size": args.size,
            "batch": args.batch,
            "encoding": "rope",
            "optimizer": "AdamW",
        },
        "device": where,
        "amp_bf16": amp_all,
        "native_cpu_bf16": None if cuda else cpu_has_bf16(),
        "baselines": refs,
        "steps": args.steps,
        "repeats": args.repeats,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "train_gflop_per_step": flops / 1e9,
        "params": params,
        "matmul_gflops": peak,
        "matmul_gflops_all": peaks,
        "results": results,
        "errors": errors,
    }


if __name__ == "__main__":
    main()
