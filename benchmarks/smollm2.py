"""Benchmark: the ablation engines on a real pretrained model, SmolLM2-135M-Instruct (Llama: 30
layers of 9 query heads sharing 3 key/value heads, d_model 576, a vocabulary of 49,152), booted
as a TransformerLens bridge (issue 47, item 6). Skips with one line where SmolLM2 is not
installed (``make smollm2``, or ``--model DIR``).

Prompts: the induction family in natural tokens (``make_family("induction", tokenizer)``; a class
is a token id). Each part prints medians of ``--repeats`` timings, its ratio taken within the
same run (both sides interleaved, one process), and what it checked for exactness.

- ``exact`` (a): exact single-head zero ablation (``ablate_heads``) against the loop a user would
  write on the bridge: per head, one ``bridge.run_with_hooks`` forward with a hook zeroing that
  head's ``hook_z``, the answer read at the last real token (every position unembedded, as the
  bridge returns it). The repeats run on ``--layers`` (default 0 7 14 15 22 29: the full grid's
  mean restart depth, (L + 1) / 2 layers); ``--full`` adds one run of the whole 270-head grid on
  both sides. Prints the FLOP bound of restarting at the ablated layer's input.
- ``attribution`` (b): ``Attribution(steps, verify_top=k, path)`` (heads ranked by integrated
  gradients along the ablation path, or by the derivative at the clean point, ``path="clean"``:
  attribution patching; the top k ablated exactly) against the exhaustive exact grid, both
  metric ``loss``: recall of the grid's top 10 heads and the time ratio.
- ``counts`` (c): the forward cost of ``probes.positional_scores``, ``probes.route_shares`` and
  ``head_type_scores`` on ``--count-n`` prompts, in forwards of those prompts: rows through the
  last block (pre-hook on its first norm, which a skipped block never runs) over the prompts,
  and layer-weighted (rows through every block over layers times prompts).

- ``routes`` (d): ``route_shares(screen=k)`` (every head's share estimated by attribution, the
  k largest measured exactly) against the exhaustive route shares on the survey's 64 position-only
  induction pairs: forwards of the pairs (as in (c)), recall of the exhaustive top 10 routes by
  |share|, the measured shares against the exhaustive ones, and the two verdicts. The exhaustive
  result is read from ``--exhaustive`` (the survey's ``findings/smollm2/routes.json``, checked to
  be the same prompts and n) or computed, timed and counted in the same run.

    python benchmarks/smollm2.py [--part exact attribution counts routes] [--n 16] [--repeats 3]
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

import numpy as np  # noqa: E402
import torch  # noqa: E402

PARTS = ("exact", "attribution", "counts", "routes")


def find_smollm2(model: str | None) -> Path | None:
    """The converted SmolLM2-135M directory: ``model``, else one in the GGUF cache whose
    provenance names a SmolLM2-135M file."""
    if model is not None:
        p = Path(model).expanduser()
        return p if (p / "config.json").is_file() else None
    from pe_interp.runs.gguf import cache_root

    root = cache_root()
    for d in sorted(root.glob("*")) if root.is_dir() else ():
        prov = d / "provenance.json"
        if prov.is_file() and (d / "config.json").is_file():
            try:
                if json.loads(prov.read_text()).get("file", "").startswith("SmolLM2-135M"):
                    return d
            except (OSError, ValueError):
                continue
    return None


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(
                (ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "?"
            )
    except OSError:
        return "?"


def tqdm_bar(total: int, desc: str, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="head", disable=not enabled, leave=False)


def naive_loop(bridge, tokens, mask, labels, units, progress: bool) -> dict[str, np.ndarray]:
    """What a user writes: per head, one bridge forward with a hook zeroing its ``hook_z``; the
    logits of every position, read at each row's last real token. Per-example accuracy and loss
    ``[units, n]``, and the baseline's."""
    rows, last = torch.arange(len(tokens)), mask.sum(1) - 1
    am = mask.long()

    def read(logits):
        out = logits[rows, last]
        acc = (out.argmax(1) == labels).double()
        loss = torch.nn.functional.cross_entropy(out, labels, reduction="none").double()
        return acc, loss

    acc = np.empty((len(units), len(tokens)))
    loss = np.empty_like(acc)
    with torch.no_grad():
        base_acc, base_loss = read(bridge(tokens, attention_mask=am))
        bar = tqdm_bar(len(units), "naive hook_z loop", progress)
        for u, (layer, h) in enumerate(units):

            def zero(z, hook, h=h):
                z = z.clone()
                z[:, :, h] = 0.0
                return z

            logits = bridge.run_with_hooks(
                tokens, attention_mask=am, fwd_hooks=[(f"blocks.{layer}.attn.hook_z", zero)]
            )
            a, lo = read(logits)
            acc[u], loss[u] = a.numpy(), lo.numpy()
            bar.update(1)
        bar.close()
    return {"acc": acc, "loss": loss, "base_acc": base_acc.numpy(), "base_loss": base_loss.numpy()}


def flop_bound(L: int, layers: list[int]) -> float:
    """Naive forwards over restarted ones, in layers: each ablation of layer l runs L - l."""
    return len(layers) * L / sum(L - layer for layer in layers)


def part_exact(args, bridge, model, ps) -> None:
    from probes import ablate_heads

    L, H = model.cfg.n_layers, model.cfg.n_heads
    print(
        f"\n(a) exact zero ablation vs the naive hook_z loop on the bridge, metric accuracy "
        f"(repeats: layers {args.layers}, {len(args.layers) * H} heads)"
    )
    print(
        f"    FLOP bound of the restart at the ablated layer's input: full grid 2L/(L+1) = "
        f"{2 * L / (L + 1):.2f}x (L = {L}); these layers {flop_bound(L, args.layers):.2f}x; "
        "more where the naive loop unembeds every position and the restarts only the read one"
    )
    units = [(layer, h) for layer in args.layers for h in range(H)]
    times: dict[str, list[float]] = {"exact": [], "naive": []}
    same = True
    for r in range(args.repeats):
        for side in ("exact", "naive") if r % 2 == 0 else ("naive", "exact"):
            t0 = time.perf_counter()
            if side == "exact":
                res = ablate_heads(
                    model,
                    ps.tokens,
                    ps.labels,
                    pad_mask=ps.pad_mask,
                    metric="accuracy",
                    layers=args.layers,
                    n_bootstrap=0,
                    per_example=True,
                    progress=args.progress,
                )
            else:
                ref = naive_loop(bridge, ps.tokens, ps.pad_mask, ps.labels, units, args.progress)
            times[side].append(time.perf_counter() - t0)
        got = np.stack([res.per_example[layer, h] for layer, h in units])
        same &= bool((got == ref["acc"]).all()) and res.baseline == ref["base_acc"].mean()
        print(
            f"    repeat {r + 1}: exact {times['exact'][-1]:7.1f} s  naive {times['naive'][-1]:7.1f} s",
            flush=True,
        )
    e, n = statistics.median(times["exact"]), statistics.median(times["naive"])
    print(
        f"    median of {args.repeats}: exact {e:.1f} s, naive {n:.1f} s: ratio {n / e:.2f}x "
        f"(goal >= 1.8); per-example accuracies equal to the naive loop's: {same}"
    )
    if args.full:
        full = [(layer, h) for layer in range(L) for h in range(H)]
        t0 = time.perf_counter()
        res = ablate_heads(
            model,
            ps.tokens,
            ps.labels,
            pad_mask=ps.pad_mask,
            metric="loss",
            n_bootstrap=0,
            per_example=True,
            progress=args.progress,
        )
        te = time.perf_counter() - t0
        t0 = time.perf_counter()
        ref = naive_loop(bridge, ps.tokens, ps.pad_mask, ps.labels, full, args.progress)
        tn = time.perf_counter() - t0
        got = np.stack([res.per_example[layer, h] for layer, h in full])
        gap = float(np.abs(got - ref["loss"]).max())
        print(
            f"    full grid ({L * H} heads, once): exact {te:.1f} s, naive {tn:.1f} s: ratio "
            f"{tn / te:.2f}x (bound {2 * L / (L + 1):.2f}x before the unembedding); largest "
            f"per-example loss difference {gap:.1e}"
        )
        args.cache["grid"] = (res, te)


def part_attribution(args, bridge, model, ps) -> None:
    from probes import ablate_heads
    from probes.ablation import Attribution

    L, H = model.cfg.n_layers, model.cfg.n_heads
    kw = dict(pad_mask=ps.pad_mask, metric="loss", n_bootstrap=0)
    print(
        "\n(b) attribution-screened exact engine vs the exhaustive exact grid, metric loss (accuracy "
        f"on {len(ps.tokens)} prompts moves in steps of 1/{len(ps.tokens)}: its top 10 ties)"
    )
    if "grid" in args.cache:
        grid, te_list = args.cache["grid"][0], [args.cache["grid"][1]]
    else:
        te_list = []
        for _ in range(args.grid_repeats):
            t0 = time.perf_counter()
            grid = ablate_heads(model, ps.tokens, ps.labels, progress=args.progress, **kw)
            te_list.append(time.perf_counter() - t0)
    te = statistics.median(te_list)
    drops = np.asarray(grid.drops)
    order = np.argsort(-drops, axis=None, kind="stable")
    top10 = {divmod(int(i), H) for i in order[:10]}
    tenth, eleventh = drops.flat[order[9]], drops.flat[order[10]]
    print(
        f"    exhaustive grid ({L * H} heads): {te:.1f} s (median of {len(te_list)}); its top 10: "
        f"{sorted(top10)}; 10th drop {tenth:.4f}, 11th {eleventh:.4f}"
    )
    for spec in args.attribution:
        parts = spec.split(":")
        steps, k, path = int(parts[0]), int(parts[1]), parts[2] if len(parts) > 2 else "joint"
        ts = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            res = ablate_heads(
                model,
                ps.tokens,
                ps.labels,
                engine=Attribution(steps=steps, verify_top=k, path=path),
                progress=False,
                **kw,
            )
            ts.append(time.perf_counter() - t0)
        verified = np.asarray(res.drops)
        found = [
            divmod(int(i), H)
            for i in np.argsort(-np.nan_to_num(verified, nan=-np.inf), axis=None)[:10]
        ]
        exact_ok = np.allclose(verified[~np.isnan(verified)], drops[~np.isnan(verified)], atol=1e-5)
        recall = len(top10 & set(found)) / 10
        t = statistics.median(ts)
        # where the screen ranks the grid's top 10: the k that verification would need for 0.9
        est = np.asarray(res.meta["attribution"])
        rank = np.empty(L * H, dtype=int)
        rank[np.argsort(-est, axis=None, kind="stable")] = np.arange(L * H)
        ranks = sorted(int(rank[layer * H + h]) for layer, h in top10)
        print(
            f"    Attribution(steps={steps}, verify_top={k}, path={path!r}): {t:.1f} s (median of {args.repeats}): "
            f"{te / t:.1f}x less time (goal >= 10); recall of the top 10 {recall:.1f} (goal >= 0.9); "
            f"verified drops equal the grid's: {exact_ok}; the screen ranks the top 10 at {ranks} "
            f"(recall 0.9 needs verify_top >= {ranks[8] + 1})",
            flush=True,
        )


class Counter:
    """Rows through every block's first norm (a skipped block runs none)."""

    def __init__(self, bridge) -> None:
        self.rows = [0] * len(bridge.blocks)
        self.handles = [
            block.ln1.register_forward_pre_hook(self._count(i))
            for i, block in enumerate(bridge.blocks)
        ]

    def _count(self, i):
        def hook(mod, args):
            self.rows[i] += int(args[0].shape[0])

        return hook

    def forwards(self, n: int) -> tuple[float, float]:
        """(forwards by the last block, layer-weighted forwards), of ``n`` prompts."""
        return self.rows[-1] / n, sum(self.rows) / (len(self.rows) * n)

    def close(self) -> None:
        for h in self.handles:
            h.remove()


def part_counts(args, bridge, model, family) -> None:
    from probes import positional_scores
    from probes.heads.types import head_type_scores

    n = args.count_n
    pairs = family.counterfactuals(n, kind="position", seed=0)
    clean = pairs.clean
    print(
        f"\n(c) forwards of {n} prompts (width {clean.tokens.shape[1]}): rows through the last block / "
        f"{n}, and layer-weighted (rows through every block / (L x {n})); goal <= 30 each"
    )
    runs = {
        "positional_scores": lambda: positional_scores(
            model, clean.tokens, pad_mask=pairs.pad_mask
        ),
        "route_shares": lambda: shares_of(model, pairs, n_bootstrap=0),
        "head_type_scores": lambda: head_type_scores(model, clean.tokens, pad_mask=pairs.pad_mask),
    }
    for name in args.count:
        _, seconds, (last, weighted) = counted(bridge, n, runs[name])
        print(
            f"    {name}: {last:.1f} forwards by the last block, {weighted:.1f} layer-weighted "
            f"({seconds:.1f} s)",
            flush=True,
        )


def shares_of(model, pairs, **kw):
    from probes import route_shares

    return route_shares(
        model,
        pairs.clean.tokens,
        pairs.corrupt.tokens,
        pairs.clean.labels,
        pairs.corrupt.labels,
        pad_mask=pairs.pad_mask,
        **kw,
    )


def counted(bridge, n: int, fn):
    """``(fn(), seconds, (forwards by the last block, layer-weighted forwards) of n prompts)``."""
    c = Counter(bridge)
    t0 = time.perf_counter()
    try:
        out = fn()
    finally:
        c.close()
    return out, time.perf_counter() - t0, c.forwards(n)


def part_routes(args, bridge, model) -> None:
    from pe_interp.prompts.task import load_prompt_task
    from probes import positional_dominance
    from probes.routes.result import RouteShares
    from probes.routes.screen import Screen

    n = args.count_n
    task = load_prompt_task("induction", bridge, seed=0)
    pairs = task.prompt_pairs(n, "position", seed=0)

    def run(**kw):
        return counted(bridge, n, lambda: shares_of(model, pairs, n_bootstrap=1000, **kw))

    print(f"\n(d) screened route shares against the exhaustive ones, {n} position-only pairs")
    saved = Path(args.exhaustive) if args.exhaustive else None
    if saved is not None and saved.is_file():
        d = json.loads(saved.read_text())
        if (
            d["survey"]["prompts"] != json.loads(json.dumps(task.to_dict()))
            or d["survey"]["n"] != n
        ):
            raise SystemExit(f"{saved}: other prompts or another n than these {n} pairs")
        full, te = RouteShares.from_dict(d["result"]), None
        print(f"    exhaustive: read from {saved} (the survey's run: {d['seconds']:.0f} s there)")
    else:
        full, te, (last, weighted) = run()
        print(
            f"    exhaustive: {te:.1f} s, {last:.1f} forwards by the last block, {weighted:.1f} layer-weighted"
        )
    units = [(int(a), int(h)) for a, h in zip(*np.nonzero(full.routes))]
    top10 = set(sorted(units, key=lambda u: -abs(full.shares[u]))[:10])
    v_full = positional_dominance(full)
    print(f"    exhaustive top 10 by |share|: {sorted(top10)}; verdict: {v_full.text()}")
    for spec in args.screen:
        k, path = int(spec.split(":")[0]), (spec.split(":") + ["clean"])[1]
        r, t, (last, weighted) = run(screen=Screen(k, path))
        got = {(int(a), int(h)) for a, h in zip(*np.nonzero(r.measured))}
        diff = float(np.abs(r.shares[r.measured] - full.shares[r.measured]).max())
        ratio = f", {te / t:.1f}x less time" if te else ""
        print(
            f"    screen={k} ({path}): {t:.1f} s{ratio}; {last:.1f} forwards by the last block, "
            f"{weighted:.1f} layer-weighted (goal <= 30); recall of the top 10 "
            f"{len(top10 & got) / 10:.1f}; measured shares within {diff:.1e} of the exhaustive; "
            f"verdict: {positional_dominance(r).text()}",
            flush=True,
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="the converted SmolLM2 directory (default: the GGUF cache's)")
    ap.add_argument("--part", nargs="+", default=list(PARTS), choices=PARTS)
    ap.add_argument("--n", type=int, default=16, help="induction prompts")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--layers", type=int, nargs="+", default=[0, 7, 14, 15, 22, 29])
    ap.add_argument("--full", action="store_true", help="also the whole grid once on both sides")
    ap.add_argument("--grid-repeats", type=int, default=1, help="(b): exhaustive grid timings")
    ap.add_argument(
        "--attribution",
        nargs="+",
        default=["1:10", "1:20", "1:10:clean", "1:20:clean"],
        help="(b): STEPS:VERIFY_TOP[:PATH] of each Attribution engine (path joint, layer, clean)",
    )
    ap.add_argument("--count-n", type=int, default=64)
    ap.add_argument(
        "--count",
        nargs="+",
        default=["positional_scores", "route_shares", "head_type_scores"],
        help="(c): which probes",
    )
    ap.add_argument(
        "--screen",
        nargs="+",
        default=["10", "20", "20:joint"],
        help="(d): K[:PATH] of each screen (path clean or joint)",
    )
    ap.add_argument(
        "--exhaustive", default="findings/smollm2/routes.json", help="(d): the survey's routes"
    )
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--no-progress", dest="progress", action="store_false")
    args = ap.parse_args()
    path = find_smollm2(args.model)
    if path is None:
        print("smollm2: SmolLM2-135M is not installed (make smollm2, or --model DIR): skipped")
        return
    if args.threads:
        torch.set_num_threads(args.threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from pe_interp.models.bridge.hf_arch import boot_bridge
    from pe_interp.models.bridge.model import BridgedModel
    from pe_interp.prompts import make_family
    from pe_interp.util.hardware import cpu_has_bf16

    bridge = boot_bridge(path)
    family = make_family("induction", bridge.tokenizer)
    ps = family.sample(args.n, seed=0)
    model = BridgedModel(bridge, pad_id=ps.pad_id)
    cpu = cpu_name()
    print(
        f"SmolLM2-135M ({path}); {cpu}, {torch.get_num_threads()} threads, avx512_bf16 "
        f"{cpu_has_bf16()}, load {os.getloadavg()[0]:.1f}; float32; {args.n} induction prompts of "
        f"{ps.tokens.shape[1]} tokens"
    )
    args.cache = {}
    with torch.no_grad():
        if "exact" in args.part:
            part_exact(args, bridge, model, ps)
    if "attribution" in args.part:
        part_attribution(args, bridge, model, ps)
    if "counts" in args.part:
        part_counts(args, bridge, model, family)
    if "routes" in args.part:
        part_routes(args, bridge, model)


if __name__ == "__main__":
    main()
