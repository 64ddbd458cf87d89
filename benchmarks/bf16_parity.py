"""bf16 parity: does bfloat16 autocast change what the toolkit measures?

1. Training: the ``quick`` RoPE model on task 1, trained with fp32 and with bf16 autocast (fp32
   master weights), for seeds 0-2: held-out accuracy of each, mean and spread over seeds, and
   whether the fp32-bf16 gap lies within the seed spread.
2. Probes: on each fp32-trained model, the full single-head zero-ablation grid evaluated in fp32
   and under bf16 autocast (``ablate_heads(..., amp=True)``) on the same held-out examples: the
   largest difference of any head's drop, and whether the deposit verdicts are the same.

bf16 is forced (``PE_INTERP_CPU_BF16=1``), so this runs on any CPU; where the CPU has no native
bf16 (AVX512-BF16/AMX) it is slow (emulated), which is why training does not autocast there.

    python benchmarks/bf16_parity.py --out runs/bf16-parity [--seeds 0 1 2] [--epochs 6]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import pe_interp  # noqa: E402
from pe_interp.runs.checkpoint import CONFIG  # noqa: E402
from pe_interp.util import hardware
from probes import ablate_heads, find_deposits  # noqa: E402

# The probe tolerance stated in benchmarks/RESULTS.md ("In brief"): a head's drop under bf16
# autocast is within this many accuracy points of its fp32 drop (bf16's 8-bit mantissa flips the
# argmax of a few examples whose top two logits are within about 1% of each other).
DROP_TOLERANCE_PTS = 2.0


def train_one(out: Path, seed: int, bf16: bool, epochs: int | None) -> dict:
    os.environ[hardware.ENV_OVERRIDE] = "1" if bf16 else "0"
    t0 = time.time()
    extra = {} if epochs is None else {"epochs": epochs}
    # Resume only a run that exists: train(resume=True) refuses a directory that holds no run yet.
    resume = (out / CONFIG).is_file()
    result = pe_interp.train(
        task="distance",
        encoding="rope",
        preset="quick",
        seed=seed,
        out=out,
        resume=resume,
        progress=False,
        amp=bf16,
        **extra,
    )
    return {
        "seed": seed,
        "bf16": bf16,
        "test_acc": result.final["test_acc"],
        "seconds": round(time.time() - t0, 1),
    }


def probe_parity(run_dir: Path, n: int) -> dict:
    run = pe_interp.load_run(run_dir)
    test = run.test_set(n)
    grids = {}
    for bf16 in (False, True):
        os.environ[hardware.ENV_OVERRIDE] = "1" if bf16 else "0"
        grids[bf16] = ablate_heads(
            run.model, test.tokens, test.labels, pad_mask=test.pad_mask, n_bootstrap=200, amp=bf16
        )
    diff = float(abs(grids[True].drops - grids[False].drops).max()) * 100
    verdicts = {bf16: find_deposits(r).deposits for bf16, r in grids.items()}
    return {
        "run": str(run_dir),
        "n": len(test),
        "max_drop_diff_pts": diff,
        "deposits_fp32": [list(d) for d in verdicts[False]],
        "deposits_bf16": [list(d) for d in verdicts[True]],
        "same_verdicts": verdicts[False] == verdicts[True],
        "within_tolerance": diff <= DROP_TOLERANCE_PTS,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("runs/bf16-parity"))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument(
        "--epochs", type=int, default=None, help="override quick's 6 epochs (for a fast check)"
    )
    ap.add_argument(
        "--n-probe", type=int, default=1000, help="held-out examples for the ablation grids"
    )
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    os.environ.pop(hardware.ENV_OVERRIDE, None)
    print(f"native CPU bf16: {hardware.cpu_has_bf16()} (bf16 is forced on below either way)")
    runs = []
    for seed in args.seeds:
        for bf16 in (False, True):
            r = train_one(
                args.out / f"{'bf16' if bf16 else 'fp32'}-seed{seed}", seed, bf16, args.epochs
            )
            runs.append(r)
            print(
                f"seed {seed} {'bf16' if bf16 else 'fp32'}: held-out acc {r['test_acc']:.4f} ({r['seconds']} s)",
                flush=True,
            )
    acc = {p: [r["test_acc"] for r in runs if r["bf16"] == (p == "bf16")] for p in ("fp32", "bf16")}
    summary = {
        p: {"mean": statistics.fmean(v), "std": statistics.stdev(v) if len(v) > 1 else 0.0}
        for p, v in acc.items()
    }
    gap = summary["bf16"]["mean"] - summary["fp32"]["mean"]
    spread = max(summary["fp32"]["std"], summary["bf16"]["std"])
    print(
        f"held-out accuracy: fp32 {100 * summary['fp32']['mean']:.2f} ± {100 * summary['fp32']['std']:.2f}, "
        f"bf16 {100 * summary['bf16']['mean']:.2f} ± {100 * summary['bf16']['std']:.2f} "
        f"(gap {100 * gap:+.2f} pts; {'within' if abs(gap) <= spread else 'OUTSIDE'} the seed spread {100 * spread:.2f})"
    )
    probes = [probe_parity(args.out / f"fp32-seed{seed}", args.n_probe) for seed in args.seeds]
    for p in probes:
        print(
            f"{p['run']}: max |drop bf16 - fp32| {p['max_drop_diff_pts']:.2f} pts (tolerance {DROP_TOLERANCE_PTS}); "
            f"deposits fp32 {p['deposits_fp32']} bf16 {p['deposits_bf16']}: {'same' if p['same_verdicts'] else 'DIFFERENT'}"
        )
    out = {
        "runs": runs,
        "accuracy": summary,
        "gap": gap,
        "seed_spread": spread,
        "probes": probes,
        "drop_tolerance_pts": DROP_TOLERANCE_PTS,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bf16_parity.json").write_text(json.dumps(out, indent=2))
    print(f"wrote {args.out / 'bf16_parity.json'}")
    ok = abs(gap) <= spread and all(p["same_verdicts"] and p["within_tolerance"] for p in probes)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
