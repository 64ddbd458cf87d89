"""Benchmark: the full single-head zero-ablation sweep, batched (probes.ablate_heads) vs naive.

At the paper's size (6 layers x 16 heads, d_model 256, d_mlp 512, sequences padded to 120,
Task-1 length distribution, random-init RoPE model): both sweeps run in this one process on the
same examples; the script prints both times, their ratio and the largest difference between the
two sweeps' per-head accuracies and per-example true-class logits.

The naive loop is one full forward per head (all layers, full padded width) with a hook zeroing
that head's ``hook_z``. With ``--naive-heads K`` < 96 it runs on K heads spread over the layers
and its time is extrapolated per head to 96 (said so in the output); the comparison then covers
those K heads.

    python benchmarks/ablation.py --n 10000           # the paper's size (hours on 2 CPU cores)
    python benchmarks/ablation.py --n 256 --naive-heads 24
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from pe_interp import HookedPETransformer, ModelConfig  # noqa: E402
from probes.ablation import ablate_heads, ablate_heads_naive, default_batch_size  # noqa: E402


def make_data(n: int, d_vocab: int, n_classes: int, max_len: int, seed: int):
    """Task-1-like data: the real DistanceTask when importable, else its length distribution."""
    try:
        from pe_interp.tasks import DistanceTask

        task = DistanceTask(
            d_vocab=d_vocab, max_between=n_classes, max_side=25, max_len=max_len, seed=seed
        )
        b = task.sample(n, seed=seed)
        return b.tokens, b.labels, b.pad_mask, "DistanceTask"
    except Exception as err:  # the task module may be mid-rewrite; the lengths are what matter
        print(
            f"(DistanceTask unavailable: {type(err).__name__}: {err}; using its length distribution)"
        )
    g = torch.Generator().manual_seed(seed)
    lens = (
        torch.randint(1, 26, (n,), generator=g)
        + torch.randint(1, n_classes + 1, (n,), generator=g)
        + torch.randint(1, 26, (n,), generator=g)
        + 2
    ).clamp(max=max_len)
    toks = torch.randint(1, d_vocab, (n, max_len), generator=g)
    pm = torch.arange(max_len)[None] < lens[:, None]
    toks[~pm] = 0
    labels = torch.randint(0, n_classes, (n,), generator=g)
    return toks, labels, pm, "synthetic (Task-1 lengths)"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--n", type=int, default=10_000, help="examples (default 10000, the paper-sized sweep)"
    )
    p.add_argument(
        "--naive-heads", type=int, default=None, help="heads for the naive loop (default all 96)"
    )
    p.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help="rows per forward, both sweeps (default: ablate_heads')",
    )
    p.add_argument("--encoding", default="rope")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--device", default="cpu")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    cfg = ModelConfig(
        n_layers=6,
        d_model=256,
        n_heads=16,
        d_mlp=512,
        n_ctx=120,
        d_vocab=574,
        n_classes=70,
        act_fn="relu",
        encoding=args.encoding,
        seed=args.seed,
        device=args.device,
    )
    model = HookedPETransformer(cfg).eval()
    args.batch_size = args.batch_size or default_batch_size(model)
    tokens, labels, pad_mask, source = make_data(args.n, cfg.d_vocab, cfg.n_classes, 120, args.seed)
    tokens, labels, pad_mask = (
        tokens.to(args.device),
        labels.to(args.device),
        pad_mask.to(args.device),
    )
    L, H = cfg.n_layers, cfg.n_heads
    all_heads = [(layer, h) for layer in range(L) for h in range(H)]
    k = (
        len(all_heads)
        if args.naive_heads is None
        else max(1, min(args.naive_heads, len(all_heads)))
    )
    naive_heads = (
        [all_heads[round(i * len(all_heads) / k)] for i in range(k)]
        if k < len(all_heads)
        else all_heads
    )
    mean_len = pad_mask.sum(1).float().mean().item()
    print(
        f"model: {L} layers x {H} heads, d_model {cfg.d_model}, d_mlp {cfg.d_mlp}, {cfg.encoding_name}; "
        f"data: {args.n} examples ({source}), padded to {tokens.shape[1]}, mean length {mean_len:.1f}; "
        f"batch_size {args.batch_size}; torch threads {torch.get_num_threads()}; device {args.device}"
    )

    common = dict(metric="accuracy", n_bootstrap=0, batch_size=args.batch_size, per_example=True)
    t0 = time.perf_counter()
    fast = ablate_heads(model, tokens, labels, pad_mask=pad_mask, method="zero", **common)
    t_fast = time.perf_counter() - t0
    print(f"batched sweep (96 heads): {t_fast:.1f} s")

    t0 = time.perf_counter()
    slow = ablate_heads_naive(
        model,
        tokens,
        labels,
        pad_mask=pad_mask,
        method="zero",
        head_sets=[[lh] for lh in naive_heads],
        **common,
    )
    t_naive = time.perf_counter() - t0
    per_head = t_naive / len(naive_heads)
    t_naive_96 = per_head * len(all_heads)
    extrap = len(naive_heads) < len(all_heads)
    print(
        f"naive loop ({len(naive_heads)} heads): {t_naive:.1f} s = {per_head:.2f} s/head"
        + (f" -> EXTRAPOLATED to 96 heads: {t_naive_96:.1f} s" if extrap else "")
    )

    # The same numbers? Per-head accuracy and per-example correctness on the heads both ran.
    acc_diff = max(abs(fast.values[lh] - slow.values[i]) for i, lh in enumerate(naive_heads))
    flips = sum(
        int((fast.per_example[lh] != slow.per_example[i]).sum()) for i, lh in enumerate(naive_heads)
    )
    base_diff = abs(fast.baseline - slow.baseline)
    # A continuous check on a subset: the true-class logit of every example.
    sub = slice(0, min(64, args.n))
    lh_sub = naive_heads[: min(8, len(naive_heads))]
    f2 = ablate_heads(
        model,
        tokens[sub],
        labels[sub],
        pad_mask=pad_mask[sub],
        metric="logit",
        n_bootstrap=0,
        head_sets=[[x] for x in lh_sub],
        per_example=True,
        batch_size=args.batch_size,
    )
    s2 = ablate_heads_naive(
        model,
        tokens[sub],
        labels[sub],
        pad_mask=pad_mask[sub],
        metric="logit",
        n_bootstrap=0,
        head_sets=[[x] for x in lh_sub],
        per_example=True,
        batch_size=args.batch_size,
    )
    logit_diff = float(abs(f2.per_example - s2.per_example).max())
    scale = float(abs(s2.per_example).max())
    print(
        f"max |accuracy batched - naive| over {len(naive_heads)} heads: {acc_diff:.3g} "
        f"(baseline diff {base_diff:.3g}; per-example correctness differs in {flips} of "
        f"{len(naive_heads) * args.n} head x example cells)"
    )
    print(
        f"max |true-class logit batched - naive| ({len(lh_sub)} heads x {f2.n_examples} examples): "
        f"{logit_diff:.3g} (largest |logit| {scale:.3g})"
    )
    ratio = t_naive_96 / t_fast
    # The FLOP lower bound of the batched method (matmuls only; per example and layer at width w:
    # q/k/v/o projections 8 M HD w, scores and pattern.v 4 w^2 HD, MLP 4 M d_mlp w). The naive loop
    # runs L full layers at the padded width per head; the batched sweep, per start layer s, runs
    # the MLP half of layer s and the L - s - 1 later layers for each of its H heads, at the width
    # of each chunk's longest example, plus one clean forward. Their ratio is the best speed-up the
    # method can reach with the same arithmetic.
    M, HD, F = cfg.d_model, cfg.n_heads * cfg.d_head, cfg.d_mlp

    def attn(w):
        return 8 * M * HD * w + 4 * w * w * HD

    def mlp(w):
        return 4 * M * F * w

    ex_chunk = max(1, min(args.n, args.batch_size // H))
    lens = torch.sort(pad_mask.sum(1).cpu()).values
    chunks = [
        (int(lens[i : i + ex_chunk].max()), len(lens[i : i + ex_chunk]))
        for i in range(0, args.n, ex_chunk)
    ]
    W = tokens.shape[1]
    naive_flops = L * H * args.n * L * (attn(W) + mlp(W))
    batched_flops = sum(
        n
        * (
            L * (attn(w) + mlp(w))
            + H * sum(mlp(w) + (L - s - 1) * (attn(w) + mlp(w)) for s in range(L))
        )
        for w, n in chunks
    )
    bound = naive_flops / batched_flops
    print(
        f"FLOP bound of the batched method (naive / batched matmul FLOPs): {bound:.2f}x; "
        f"achieved {ratio / bound:.0%} of it"
    )
    print(
        f"speed-up: {ratio:.2f}x"
        + (" (naive time extrapolated)" if extrap else "")
        + "  [goal >= 4x]"
    )
    ok = logit_diff <= 1e-4 * (1.0 + scale) and flips <= max(1, len(naive_heads) * args.n // 10_000)
    print("numbers agree" if ok else "MISMATCH between batched and naive")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
