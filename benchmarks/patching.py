"""Benchmark: batched all-heads activation patching vs TransformerLens' per-cell loop.

Sweeps every head's output (site ``z``, all positions) of a random-init RoPE model at the paper's
size (6 layers x 16 heads, d_model 256, d_mlp 512, seq 120) over a few hundred clean/corrupt pairs,
with :func:`probes.patch` and with ``transformer_lens.patching.get_act_patch_attn_head_out_all_pos``
(given the same scalar normalised-logit-difference metric), checks the numbers agree, and reports
the median time of ``--repeats`` runs of each and their ratio.

TransformerLens runs its forwards with autograd enabled (as it does when called); ``--tl-no-grad``
adds a second baseline wrapped in ``torch.no_grad()``.

    python benchmarks/patching.py                      # paper size (slow on a small CPU)
    python benchmarks/patching.py --n-pairs 64 --seq 60 --repeats 3
    python benchmarks/patching.py --quick               # 16 pairs, seq 40

Measured on a shared 2-core CPU (timings there swing a lot; ratios are from the same run):
seq 120, 32 pairs: 73 s vs 219 s (3.0x); seq 40, 16 pairs, 1 thread: 7.0 s vs 14.7 s (2.1x);
max |difference| to TransformerLens 2e-6 (float32). On a CPU the patched forwards are
compute-bound, so the gain is what skipping work gives: layers before the patch and the patched
layer's attention are not recomputed (about 2x for 6 layers) and there is no autograd graph;
batching cells mostly helps where forwards are latency-bound (GPUs, few pairs).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from pe_interp import HookedPETransformer, ModelConfig  # noqa: E402
from probes.patching.sweep import normalized_logit_diff_metric, patch  # noqa: E402


def make_pairs(n: int, seq: int, d_vocab: int, n_classes: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(seq // 2, seq + 1, (n,), generator=gen)
    pad_mask = torch.arange(seq)[None, :] < lengths[:, None]
    clean = torch.randint(1, d_vocab, (n, seq), generator=gen) * pad_mask
    corrupt = clean.clone()
    # corrupt a handful of positions per row (same lengths, same pad mask)
    flip = (torch.rand(n, seq, generator=gen) < 0.1) & pad_mask
    corrupt[flip] = torch.randint(1, d_vocab, (int(flip.sum()),), generator=gen)
    clean_labels = torch.randint(0, n_classes, (n,), generator=gen)
    corrupt_labels = (
        clean_labels + 1 + torch.randint(0, n_classes - 1, (n,), generator=gen)
    ) % n_classes
    return clean, corrupt, pad_mask, clean_labels, corrupt_labels


def timed(fn, repeats: int) -> tuple[float, list[float], object]:
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), times, out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--n-layers", type=int, default=6)
    p.add_argument("--n-heads", type=int, default=16)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--d-mlp", type=int, default=512)
    p.add_argument("--seq", type=int, default=120)
    p.add_argument("--n-pairs", type=int, default=256)
    p.add_argument("--n-classes", type=int, default=70)
    p.add_argument("--d-vocab", type=int, default=574)
    p.add_argument("--encoding", default="rope")
    p.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help="rows per forward for probes.patch (default: 4 x n-pairs)",
    )
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--tl-no-grad", action="store_true", help="also time TransformerLens under torch.no_grad()"
    )
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", default=None, help="also write the results to this file")
    p.add_argument("--quick", action="store_true", help="a small run for a CPU: 16 pairs, seq 40")
    args = p.parse_args(argv)
    if args.quick:
        args.n_pairs, args.seq = min(args.n_pairs, 16), min(args.seq, 40)
    if args.threads:
        torch.set_num_threads(args.threads)

    from transformer_lens.patching import get_act_patch_attn_head_out_all_pos

    cfg = ModelConfig(
        n_layers=args.n_layers,
        d_model=args.d_model,
        n_heads=args.n_heads,
        d_mlp=args.d_mlp,
        n_ctx=max(128, args.seq),
        d_vocab=args.d_vocab,
        n_classes=args.n_classes,
        encoding=args.encoding,
        init_std=0.05,
        seed=0,
        device=args.device,
    )
    model = HookedPETransformer(cfg).eval()
    clean, corrupt, pad_mask, cl, co = make_pairs(
        args.n_pairs, args.seq, args.d_vocab, args.n_classes, 0
    )
    clean, corrupt, pad_mask = (
        clean.to(args.device),
        corrupt.to(args.device),
        pad_mask.to(args.device),
    )
    cl, co = cl.to(args.device), co.to(args.device)
    batch_size = args.batch_size or 4 * args.n_pairs

    def sync():
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()

    def ours():
        r = patch(
            model,
            clean,
            corrupt,
            site="z",
            clean_labels=cl,
            corrupt_labels=co,
            batch_size=batch_size,
            n_bootstrap=0,
        )
        sync()
        return r.values

    def tl(no_grad: bool):
        # TL's recipe: cache the clean run, then one patched forward per (layer, head) cell.
        ctx = torch.no_grad() if no_grad else contextlib.nullcontext()
        with ctx, contextlib.redirect_stderr(io.StringIO()):
            with torch.no_grad():
                clean_logits, cache = model.run_with_cache(clean)
                corrupt_logits = model(corrupt)
            metric = normalized_logit_diff_metric(clean_logits, corrupt_logits, cl, co)
            out = get_act_patch_attn_head_out_all_pos(model, corrupt, cache, metric)
        sync()
        return out

    # TL's hooks run the model without pad_mask: the benchmark's pads are PAD_ID, so the
    # default mask (tokens != pad_id) is the same one probes.patch uses.
    ours()  # warm-up
    t_ours, ours_times, v_ours = timed(ours, args.repeats)
    t_tl, tl_times, v_tl = timed(lambda: tl(False), args.repeats)
    diff = float((v_ours.double() - v_tl.double()).abs().max())
    res = {
        "config": {
            k: getattr(args, k)
            for k in (
                "n_layers",
                "n_heads",
                "d_model",
                "d_mlp",
                "seq",
                "n_pairs",
                "encoding",
                "device",
            )
        },
        "batch_size": batch_size,
        "threads": torch.get_num_threads(),
        "ours_s_median": t_ours,
        "ours_s": ours_times,
        "tl_s_median": t_tl,
        "tl_s": tl_times,
        "speedup_vs_tl": t_tl / t_ours,
        "max_abs_diff": diff,
        "value_range": [float(v_tl.min()), float(v_tl.max())],
    }
    if args.tl_no_grad:
        t_tlng, tlng_times, _ = timed(lambda: tl(True), args.repeats)
        res.update(
            tl_no_grad_s_median=t_tlng,
            tl_no_grad_s=tlng_times,
            speedup_vs_tl_no_grad=t_tlng / t_ours,
        )
    print(json.dumps(res, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2) + "\n")
    ok = diff <= 1e-4 * max(1.0, float(v_tl.abs().max()))
    if not ok:
        print(f"MISMATCH: max |ours - TL| = {diff:.3g}", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
